// The Ranks panel (#ranks), shown for dumps written by several processes: which rank the
// Inf/NaN was born on and how every other rank got it (the analysis's `ranks`, through
// /api/ranks), and each rank's executions around its copy of the collective that spread it,
// side by side with the copies on one line: the place to see "rank 2 sent it, the others
// received it in the same allreduce". Rendering only; selecting an event is the app's.

import { el, setChildren, shortOp } from "./util.js";
import { healthClass } from "./rows.js";

const EXEC = "execution";
// Rows asked on either side of each copy (the route's `window`): enough to see what fed the
// collective and what read its result, few enough that the columns fit the panel.
export const RANKS_WINDOW = 5;
// Columns side by side: past this, the origin and the first ranks it reached.
const MAX_COLUMNS = 8;

/** An op type, short: "log" for aten.log.default, "c10d.allreduce_" for c10d.allreduce_.default. */
function opName(opType) {
  const s = String(opType || "");
  return s.startsWith("aten.") || s.startsWith("prims.") ? shortOp(s) : s.replace(/\.default$/, "");
}

/** How the origin's rank was told, in words: "told by collective #7 of group 0 (default_pg)". */
export function decidedText(ranks) {
  if (!ranks) return "";
  const spread = ranks.spread;
  switch (ranks.decided_by) {
    case "collective":
      return spread ? `told by ${spread.collective.label}` : "told by the order of the collectives";
    case "clock":
      return "by clock: no collective orders the ranks' births";
    case "single":
      return "the only rank with Inf/NaN";
    default:
      return ranks.decided_by || "";
  }
}

/** The process's label ("rank 2"), from the verdict's own list. */
function labeller(ranks) {
  const byProcess = new Map((ranks.processes || []).map((p) => [p.process, p.label || `process ${p.process}`]));
  return (process) => byProcess.get(process) || `process ${process}`;
}

/** "+0.8 ms", "−1.2 s": a time difference in seconds, signed. */
export function fmtDelta(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const sign = seconds > 0 ? "+" : seconds < 0 ? "−" : "±";
  const a = Math.abs(seconds);
  if (a === 0) return "0";
  if (a < 1e-3) return `${sign}${(a * 1e6).toFixed(a < 1e-5 ? 1 : 0)} µs`;
  if (a < 1) return `${sign}${(a * 1e3).toFixed(a < 1e-2 ? 2 : 1)} ms`;
  return `${sign}${a.toFixed(a < 10 ? 2 : 1)} s`;
}

function roleText(p, label) {
  switch (p.role) {
    case "origin":
      return "origin";
    case "received": {
      const via = p.via && p.via.collective ? p.via.collective.label : "an operation";
      const from = (p.senders || []).map(label).join(", ");
      return `received via ${via}${from ? ` from ${from}` : ""}`;
    }
    case "born":
      return "born on its own";
    default:
      return "clean";
  }
}

/** A row that selects an event: a click, or Enter / Space with the keyboard focus on it. */
function selecting(node, app, ref) {
  node.addEventListener("click", () => app.select(ref, { from: "link" }));
  node.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      app.select(ref, { from: "link" });
    }
  });
  return node;
}

/** The per-rank table: role, first alert (op, step), its time after the origin's birth, clock offset. */
function rankTable(ranks, app) {
  const label = labeller(ranks);
  const origin = (ranks.processes || []).find((p) => p.process === ranks.origin_process);
  const originRef = origin ? origin.first || origin.birth : null; // the verdict's `origin`
  const t0 = originRef ? originRef.aligned_time : null;
  const procs = [...(ranks.processes || [])].sort((a, b) => (a.rank ?? 1e9) - (b.rank ?? 1e9) || a.process - b.process);
  const body = el("tbody");
  for (const p of procs) {
    const ev = p.first_event;
    const first = p.first;
    const dt = first && first.aligned_time !== null && t0 !== null ? first.aligned_time - t0 : null;
    const tr = el(
      "tr",
      {
        className: `rk-row role-${p.role}${first ? "" : " inert"}`,
        dataset: { process: String(p.process), role: p.role, ...(first ? { kind: first.kind, index: String(first.index) } : {}) },
        title: first ? `select its first Inf/NaN: ${first.kind === EXEC ? "execution" : "graph trace"} #${first.index}` : "no Inf/NaN in this process",
        attrs: first ? { tabindex: "0" } : {},
      },
      el("td", { className: "rk-label", text: p.label || label(p.process) }),
      el("td", { className: "rk-role" }, el("span", { className: `rk-tag role-${p.role}`, text: roleText(p, label) })),
      el("td", { className: "rk-first", title: ev ? ev.op_type || ev.op_name || "" : "" }, ev ? `${opName(ev.op_type || ev.op_name)} · step ${ev.step}` : "–"),
      el("td", { className: "rk-time num", title: "its first Inf/NaN, on the origin's clock, after the origin's birth" }, p.process === ranks.origin_process ? "0" : fmtDelta(dt)),
      el("td", { className: "rk-clock num", title: "its clock's offset to the origin's (aligned on a collective both took part in)" }, fmtDelta(p.clock_offset)),
    );
    if (first) selecting(tr, app, { kind: first.kind, index: first.index });
    body.appendChild(tr);
  }
  const head = el("thead", {}, el("tr", {}, ...["rank", "role", "first alert", "time", "clock"].map((h) => el("th", { text: h }))));
  return el("table", { className: "rk-table" }, head, body);
}

/** Which processes get a column: every one up to MAX_COLUMNS, else the origin and those it reached first. */
function columnsOf(ranks) {
  const procs = [...(ranks.processes || [])].sort((a, b) => (a.rank ?? 1e9) - (b.rank ?? 1e9) || a.process - b.process);
  if (procs.length <= MAX_COLUMNS) return { shown: procs.map((p) => p.process), note: "" };
  const reached = (ranks.spread && ranks.spread.reached) || [];
  const shown = [ranks.origin_process, ...reached.filter((p) => p !== ranks.origin_process).slice(0, MAX_COLUMNS - 1)];
  return { shown, note: `${shown.length} of ${procs.length} ranks: the origin and the first ${shown.length - 1} it reached` };
}

/** One execution around a copy: index, op, step; Inf/NaN marked as the lists mark them. */
function opRow(row, isCopy, app) {
  const cls = ["rk-op", ...healthClass(row)];
  if (isCopy) cls.push("coll");
  const c = row.collective;
  const node = el(
    "div",
    {
      className: cls.join(" "),
      dataset: { kind: EXEC, index: String(row.index), process: String(row.process) },
      title: `${row.op_type || ""} #${row.index}${c ? ` · ${c.label}` : ""}`,
      attrs: { tabindex: "0", role: "button" },
    },
    el("span", { className: "rk-idx", text: String(row.index) }),
    el("span", { className: "rk-name", text: opName(row.op_type) }),
    el("span", { className: "rk-step", text: String(row.step) }),
  );
  return selecting(node, app, { kind: EXEC, index: row.index });
}

/** Side by side: one column per rank, its copy of the spreading collective on one shared line. */
function sideBySide(data, app) {
  const ranks = data.ranks;
  const label = labeller(ranks);
  const around = new Map((data.around || []).map((a) => [a.process, a]));
  const { shown, note } = columnsOf(ranks);
  // Blank rows above each column put every copy on the line of the one with the most rows above it.
  const line = Math.max(0, ...[...around.values()].map((a) => a.at));
  const state = new Map((ranks.processes || []).map((p) => [p.process, p]));
  const cols = shown.map((process) => {
    const a = around.get(process);
    const p = state.get(process);
    const copy = ((ranks.spread && ranks.spread.copies) || []).find((c) => c.process === process);
    const what = copy ? (copy.sent_nonfinite ? "sent Inf/NaN" : copy.sent_nonfinite === false ? "sent finite" : "input not recorded") : "no copy";
    const head = el("div", { className: `rk-col-head role-${p ? p.role : "clean"}`, title: `${label(process)}: ${p ? roleText(p, label) : ""}` }, el("b", { text: label(process) }), el("span", { className: "muted", text: ` ${what}` }));
    const rows = [];
    if (a) {
      for (let i = a.at; i < line; i++) rows.push(el("div", { className: "rk-op rk-pad" }));
      a.rows.forEach((row, i) => rows.push(opRow(row, i === a.at, app)));
    } else rows.push(el("div", { className: "muted small rk-none", text: "no copy of this operation recorded" }));
    return el("div", { className: "rk-col", dataset: { process: String(process) } }, head, ...rows);
  });
  const grid = el("div", { className: "rk-side" }, ...cols);
  grid.style.gridTemplateColumns = `repeat(${Math.max(1, cols.length)}, minmax(0, 1fr))`; // CSSOM: the CSP forbids inline style=""
  const spread = ranks.spread;
  const title = spread ? `Around ${spread.collective.label} · ${spread.op_type} · step ${spread.step}` : "Around the spreading collective";
  return [el("h3", { text: title }), note ? el("div", { className: "rk-note muted small", text: note }) : null, grid];
}

/** Hide the panel (one process, or no Inf/NaN across ranks). */
export function hideRanks(panel) {
  panel.hidden = true;
  document.body.classList.remove("has-ranks");
}

export function renderRanksLoading(panel, body) {
  panel.hidden = false;
  document.body.classList.add("has-ranks");
  setChildren(body, el("div", { className: "muted", text: "ranks: loading…" }));
}

/** The panel from /api/ranks' answer `data` (`data.ranks` not null). */
export function renderRanks(panel, body, subEl, data, app) {
  const ranks = data.ranks;
  panel.hidden = false;
  document.body.classList.add("has-ranks");
  const label = labeller(ranks);
  subEl.textContent = `origin ${label(ranks.origin_process)} · ${decidedText(ranks)}`;
  const out = [rankTable(ranks, app)];
  for (const n of ranks.notes || []) out.push(el("div", { className: "rc-note", text: n }));
  if ((data.around || []).length) out.push(...sideBySide(data, app));
  else out.push(el("div", { className: "muted small", text: "No collective carried the Inf/NaN off the origin's rank." }));
  setChildren(body, ...out);
  markRanksSelection(body, app.state.sel);
}

/** Mark the selected event's rows in the panel. */
export function markRanksSelection(body, sel) {
  for (const n of body.querySelectorAll(".selected")) n.classList.remove("selected");
  if (!sel) return;
  for (const n of body.querySelectorAll(`[data-kind="${sel.kind}"][data-index="${sel.index}"]`)) n.classList.add("selected");
}

export function renderRanksError(panel, body, message) {
  panel.hidden = false;
  document.body.classList.add("has-ranks");
  setChildren(body, el("div", { className: "error", text: message }));
}
