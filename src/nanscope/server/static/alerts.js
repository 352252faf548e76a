// The Alerts column: the root-cause box (/api/analysis) and the alert counts (/api/alerts).

import { el, setChildren, fmtInt, basename, shortOp } from "./util.js";
import { decidedText } from "./ranks.js";

const CATEGORY = {
  neg_inf: { label: "−∞", name: "-inf" },
  pos_inf: { label: "+∞", name: "+inf" },
  nan: { label: "NaN", name: "NaN" },
};

const ORIGIN_KIND = {
  born: "made here from finite inputs",
  entered: "came in through an input that no recorded op produced",
  unknown: "some inputs were not recorded: it may have come in through them",
};

/** A clickable reference to an event: "aten.log.default #401". */
export function eventLink(app, ref, label) {
  if (!ref || ref.index === null || ref.index === undefined) return el("span", { className: "muted", text: label || "–" });
  const kind = ref.kind || "execution";
  const text = label || `${ref.op_type || ref.op_name || "event"} #${ref.index}`;
  return el("a", {
    className: "evlink",
    href: "#",
    text,
    title: `${kind === "graph_execution_trace" ? "graph trace" : "execution"} #${ref.index}`,
    dataset: { kind, index: String(ref.index) },
    on: {
      click: (e) => {
        e.preventDefault();
        app.select({ kind, index: ref.index }, { from: "link" });
      },
    },
  });
}

/** A clickable source location (opens it in the Source code section). */
export function sourceLink(app, src, process) {
  if (!src || !src.file) return null;
  return el("a", {
    className: "srclink",
    href: "#",
    text: `${basename(src.file)}:${src.line}`,
    title: `${src.file}:${src.line}${src.function ? " in " + src.function : ""}`,
    on: {
      click: (e) => {
        e.preventDefault();
        app.openSource({ process: process ?? 0, path: src.file, line: src.line });
      },
    },
  });
}

function rcLine(label, ...children) {
  return el("div", { className: "rc-line" }, el("span", { className: "rc-k", text: label }), el("span", { className: "rc-v" }, ...children));
}

/** "whole run" beside the root cause's title while the alerts show one process. */
function scopeTag(app) {
  if (app.state.process === null || app.state.process === undefined) return null;
  return el("span", { className: "rc-scope", text: "whole run", title: "the root cause is of the whole run (all processes); the counts below are of the selected process" });
}

/**
 * The run's verdict: the analysis's ("harmful", "incomplete", "absorbed" or "clean"), except
 * that the run list, polled more often than the analysis, may already know that events went
 * missing since: then no all-clear is shown.
 */
export function verdictOf(a, runInfo) {
  const damaged = Boolean(runInfo && runInfo.incomplete);
  if (a.verdict !== "harmful" && (damaged || !["absorbed", "clean"].includes(a.verdict))) {
    return "incomplete";
  }
  return a.verdict;
}

/** What is missing from the dump: one item per problem, with its file and byte offset. */
function damageList(a, runInfo) {
  const items = a.incomplete || [];
  const n = items.length || (runInfo && runInfo.num_incomplete) || 0;
  const list = el(
    "ul",
    { className: "dmg-list" },
    items.map((d) =>
      el(
        "li",
        { className: `dmg-item sev-${d.severity === "warning" ? "warning" : "error"}`, dataset: { file: d.file || "", offset: d.offset === null || d.offset === undefined ? "" : String(d.offset) } },
        el("span", { className: "dmg-msg", text: d.message }),
        d.file || (d.offset !== null && d.offset !== undefined)
          ? el("span", { className: "dmg-where muted", text: ` (${d.file ? d.file : "file not known"}${d.offset !== null && d.offset !== undefined ? `, byte offset ${d.offset}` : ""})` })
          : null,
      ),
    ),
  );
  if (!items.length) list.appendChild(el("li", { className: "dmg-item", text: "the run list reports problems: events may be missing (see the ⚠ problems)" }));
  return el(
    "div",
    { className: "damage" },
    el("div", { className: "dmg-head", text: `${n} problem${n === 1 ? "" : "s"}: events may be missing, so no all-clear is given` }),
    list,
  );
}

export function renderRootCause(host, a, app) {
  if (!a) {
    host.classList.remove("ok", "bad", "incomplete");
    setChildren(host, el("div", { className: "muted", text: "root cause: analysing…" }));
    return;
  }
  const runInfo = app ? app.runInfo : null;
  const verdict = verdictOf(a, runInfo);
  host.dataset.verdict = verdict;
  const origin = a.origin;
  if (verdict === "incomplete") {
    // Damage first: what was read holds no harmful Inf/NaN, but what is missing may.
    host.classList.remove("ok", "bad");
    host.classList.add("incomplete");
    setChildren(
      host,
      el("div", { className: "rc-title" }, "Incomplete dump: no verdict", scopeTag(app)),
      a.headline ? el("div", { className: "rc-headline", text: a.headline }) : null,
      damageList(a, runInfo),
      ...(a.notes || []).map((n) => el("div", { className: "rc-note", text: n })),
    );
    return;
  }
  host.classList.remove("incomplete");
  const damage = (a.incomplete || []).length ? damageList(a, runInfo) : null;
  if (!origin || verdict === "absorbed") {
    // Nothing harmful: the same word as the headline's, never a red root cause.
    host.classList.remove("bad");
    host.classList.toggle("ok", verdict === "clean");
    setChildren(
      host,
      el("div", { className: "rc-title" }, verdict === "clean" ? "No Inf or NaN recorded" : verdict === "absorbed" ? "No harmful Inf or NaN" : "Root cause not found", scopeTag(app)),
      a.headline ? el("div", { className: "rc-headline", text: a.headline }) : null,
      origin ? rcLine("first Inf/NaN", eventLink(app, origin, `${origin.op_type} #${origin.index}`)) : null,
      ...(a.notes || []).map((n) => el("div", { className: "rc-note", text: n })),
      damage,
    );
    return;
  }
  host.classList.add("bad");
  host.classList.remove("ok");
  // The event the headline names: the cause (the origin when nothing harmful was found).
  const shown = a.cause || origin;
  const same = (x, y) => x && y && x.kind === y.kind && x.index === y.index;
  const src = shown.source;
  const rows = [
    el("div", { className: "rc-title" }, "Root cause", same(shown, origin) ? el("span", { className: "rc-kind", text: a.origin_kind || "", title: ORIGIN_KIND[a.origin_kind] || "" }) : null, scopeTag(app)),
    el("div", { className: "rc-headline", text: a.headline || `${shown.op_type} produced Inf/NaN` }),
    rcLine(
      a.cause ? (a.cause_evicted ? "cause (earliest kept)" : "cause") : "origin",
      eventLink(app, shown, `${shown.op_type} #${shown.index}`),
      // a.steps is null for dumps that record no steps (TensorFlow's): no "step 0" then.
      el("span", { className: "muted", text: `${a.steps === null ? "" : ` · step ${shown.step}`}${shown.phase ? " · " + shown.phase : ""}${shown.module_path ? " · " + shown.module_path : ""}` }),
    ),
  ];
  if (a.ranks) rows.push(rankLine(a.ranks));
  if (shown.explanation) rows.push(rcLine("why", el("span", { className: "rc-why", text: shown.explanation })));
  // A backward op: the forward line the user wrote first (the one to fix).
  if (shown.forward_op) {
    rows.push(rcLine("grad of", el("span", { text: shown.forward_op + " " }), sourceLink(app, shown.forward_source, shown.process)));
    const fwd = shown.forward_source && shown.forward_source.code;
    if (fwd) rows.push(el("pre", { className: "rc-code", text: fwd.trim() }));
  }
  if (src) {
    rows.push(rcLine(shown.forward_op ? "backward at" : "source", sourceLink(app, src, shown.process), src.function ? el("span", { className: "muted", text: ` in ${src.function}` }) : null));
    if (src.code && !shown.forward_op) rows.push(el("pre", { className: "rc-code", text: src.code.trim() }));
  }
  const lib = shown.library_source;
  if (lib) rows.push(rcLine("in library", sourceLink(app, lib, shown.process), lib.function ? el("span", { className: "muted", text: ` in ${lib.function}` }) : null));
  if (!same(shown, origin)) rows.push(rcLine("first Inf/NaN", eventLink(app, origin, `${origin.op_type} #${origin.index}`)));
  const fnan = a.first_nan;
  if (fnan && !same(fnan, shown)) {
    rows.push(rcLine("first NaN", eventLink(app, fnan, `${fnan.op_type} #${fnan.index}`), fnan.explanation ? el("div", { className: "muted small", text: fnan.explanation }) : null));
  }
  if (a.chain && a.chain.length > 1) {
    const parts = [];
    a.chain.forEach((ev, i) => {
      if (i) parts.push(el("span", { className: "muted", text: " → " }));
      parts.push(eventLink(app, ev, `${shortOp(ev.op_type)} #${ev.index}`));
    });
    rows.push(rcLine("chain", ...parts));
  }
  for (const n of a.notes || []) rows.push(el("div", { className: "rc-note", text: n }));
  if (damage) rows.push(damage);
  setChildren(host, ...rows);
}

/** Several processes: the origin's rank and how it was told ("told by collective #7 of group 0"). */
function rankLine(ranks) {
  const origin = (ranks.processes || []).find((p) => p.process === ranks.origin_process);
  const name = origin ? origin.label : `process ${ranks.origin_process}`;
  const spread = ranks.spread;
  const reached = spread ? (spread.reached || []).length : 0;
  const line = rcLine("rank", el("span", { className: "rc-rank", text: `${name}, ${decidedText(ranks)}` }), reached ? el("span", { className: "muted", text: ` · reached ${reached} other rank${reached === 1 ? "" : "s"}` }) : null);
  line.title = ranks.decided_by === "clock" ? "no collective orders the ranks' births: the earliest by their clocks, aligned on a collective they shared" : "the rank no collective brought the Inf/NaN to";
  return line;
}

export function renderRootCauseError(host, message) {
  host.classList.remove("bad", "ok", "incomplete");
  delete host.dataset.verdict;
  setChildren(host, el("div", { className: "rc-title", text: "Root cause" }), el("div", { className: "error", text: message }));
}

function alertRow(app, { label, cls, count, ref, title, dataset }) {
  const clickable = ref && count > 0;
  return el(
    clickable ? "button" : "div",
    {
      className: `arow ${cls || ""} ${clickable ? "" : "inert"}`,
      title: title || (clickable ? `jump to the first: ${ref.kind} #${ref.index}` : ""),
      dataset: { ...(dataset || {}), ...(clickable ? { kind: ref.kind, index: String(ref.index) } : {}) },
      on: clickable ? { click: () => app.select(ref, { from: "alert" }) } : undefined,
    },
    el("span", { className: "a-label", text: label }),
    el("span", { className: "a-count", text: fmtInt(count) }),
  );
}

/**
 * The cause the root cause box names, when its events are among the alerts in view (the
 * whole run, or the process the cause is of); null otherwise, or while the analysis is out.
 */
function causeInView(app) {
  const an = app && app.analysis;
  const cause = an && an.verdict === "harmful" ? an.cause : null;
  if (!cause) return null;
  const process = app.state.process;
  if (process !== null && process !== undefined && cause.process !== undefined && cause.process !== process) return null;
  return cause;
}

/** Whether an op-type row counts the cause's events (same op type, same kind of event). */
function isCauseRow(o, cause) {
  return Boolean(cause) && o.op_type === cause.op_type && o.kind === (cause.kind || "execution");
}

// Op-type rows shown before "show all".
const SHOW_OPS = 12;

/**
 * The op-type rows: the cause's op type first, marked (the answer leads, as in the text
 * report), then the others as the server orders them, most events first.
 */
function opTypeList(app, ops, cause) {
  const ordered = cause ? [...ops.filter((o) => isCauseRow(o, cause)), ...ops.filter((o) => !isCauseRow(o, cause))] : ops;
  const list = el("div", { className: "a-ops", dataset: { cause: cause ? cause.op_type : "" } });
  ordered.forEach((o, i) => {
    const mine = isCauseRow(o, cause);
    const row = alertRow(app, {
      label: o.op_type,
      cls: "op" + (mine ? " cause" : "") + (i >= SHOW_OPS ? " extra" : ""),
      count: o.count,
      ref: { kind: o.kind, index: o.first_index },
      dataset: { opType: o.op_type },
    });
    if (mine) row.insertBefore(el("span", { className: "a-cause", text: "← the cause", title: "the op type of the root cause's event" }), row.querySelector(".a-count"));
    if (i >= SHOW_OPS) row.hidden = true;
    list.appendChild(row);
  });
  if (ordered.length > SHOW_OPS) {
    const more = el("button", {
      className: "linkbtn",
      text: `show all ${ordered.length}`,
      on: {
        click: () => {
          const hidden = list.querySelector(".extra[hidden]") !== null;
          for (const r of list.querySelectorAll(".extra")) r.hidden = !hidden;
          more.textContent = hidden ? "show fewer" : `show all ${ordered.length}`;
        },
      },
    });
    list.appendChild(more);
  }
  return list;
}

/**
 * The analysis came in after the alerts were drawn: their op-type list is drawn again, led
 * by the cause's op type (nothing changes when there is no cause).
 */
export function leadOpTypesWithCause(host, a, app) {
  const list = host.querySelector(".a-ops");
  const cause = causeInView(app);
  if (!list || !a || !cause) return;
  list.replaceWith(opTypeList(app, a.by_op_type || [], cause));
}

/** The alert counts; `scope` names the process they are of ("" for the whole run). */
export function renderAlerts(host, totalEl, a, app, scope = "") {
  // A dump with events missing gets no green "none": what is missing may hold the Inf/NaN.
  const incomplete = Boolean(app && app.runInfo && app.runInfo.incomplete);
  totalEl.textContent = a.total ? `${fmtInt(a.total)} NaN/∞` : incomplete ? "none read" : "none";
  totalEl.classList.toggle("bad", a.total > 0);
  totalEl.classList.toggle("ok", a.total === 0 && !incomplete);
  totalEl.classList.toggle("partial", a.total === 0 && incomplete);
  totalEl.title = (scope ? `alerts of ${scope}` : "alerts of the whole run") + (incomplete ? " (the dump is incomplete)" : "");
  const out = [];
  if (scope) out.push(el("div", { className: "a-scope", dataset: { scope } }, el("span", { className: "muted", text: "alerts of " }), el("b", { text: scope })));
  if (!a.total) {
    const who = scope ? `of ${scope} ` : "";
    out.push(el("div", { className: "empty-state", text: incomplete ? `No event ${who}that could be read holds Inf or NaN, but the dump is incomplete: events are missing.` : `No event ${who}holds Inf or NaN.` }));
    setChildren(host, ...out);
    return;
  }
  const kinds = [];
  if (a.executions) kinds.push(`${fmtInt(a.executions)} execution${a.executions === 1 ? "" : "s"}`);
  if (a.graph_execution_traces) kinds.push(`${fmtInt(a.graph_execution_traces)} graph trace${a.graph_execution_traces === 1 ? "" : "s"}`);
  out.push(el("div", { className: "a-sub muted", text: kinds.join(" · ") }));
  if (a.first) {
    const row = alertRow(app, { label: "first alert", cls: "first", count: 1, ref: a.first, title: `jump to ${a.first.kind === "graph_execution_trace" ? "graph trace" : "execution"} #${a.first.index}` });
    row.querySelector(".a-count").textContent = `${a.first.kind === "graph_execution_trace" ? "trace" : ""} #${a.first.index} →`;
    out.push(row);
  }

  out.push(el("h3", { text: "By category" }));
  const cats = el("div", { className: "a-cats" });
  for (const c of a.by_category || []) {
    const meta = CATEGORY[c.category] || { label: c.category, name: c.category };
    cats.appendChild(alertRow(app, { label: meta.label, cls: `cat cat-${c.category}`, count: c.count, ref: c.first, title: `${fmtInt(c.count)} events hold ${meta.name}`, dataset: { category: c.category } }));
  }
  if (!(a.by_category || []).length) cats.appendChild(el("div", { className: "muted", text: "this mode tells only the total" }));
  out.push(cats);

  const ops = a.by_op_type || [];
  if (ops.length) {
    out.push(el("h3", { text: `By op type (${ops.length})` }));
    out.push(opTypeList(app, ops, causeInView(app)));
  }

  const stepsKnown = !(app && app.runInfo && app.runInfo.steps_known === false);
  const steps = stepsKnown ? a.by_step || [] : [];
  if (steps.length) {
    out.push(el("h3", { text: "By step" }));
    const max = Math.max(...steps.map((s) => s.count));
    const list = el("div", { className: "a-steps" });
    for (const s of steps) {
      const ref = s.first;
      list.appendChild(
        el(
          ref ? "button" : "div",
          {
            className: `arow step${ref ? "" : " inert"}`,
            dataset: { step: String(s.step), ...(ref ? { kind: ref.kind, index: String(ref.index) } : {}) },
            title: ref ? `first alert of step ${s.step}: ${ref.kind === "graph_execution_trace" ? "graph trace" : "execution"} #${ref.index}` : "",
            on: ref ? { click: () => app.select(ref, { from: "alert" }) } : undefined,
          },
          el("span", { className: "a-label", text: `step ${s.step}` }),
          el("span", { className: "a-bar" }, el("span", { style: { width: `${Math.max(2, (100 * s.count) / max)}%` } })),
          el("span", { className: "a-count", text: fmtInt(s.count) }),
        ),
      );
    }
    out.push(list);
  }
  setChildren(host, ...out);
}
