// The diff view (#diff-view): two runs compared op by op (/api/diff, schema nanscope.diff/1),
// in place of the run's panels. The verdict first (where the runs part, or that they agree,
// never an all-clear where a dump is incomplete), then the parted op of both runs side by
// side: op type, module path, step, source line, the compared statistics with both values and
// the relative error; the op that only one run has where one fed it (the likely cause); the
// ops around it in each run, paired where both runs have them; and the first step where the
// loss parts. An op's index opens its run at that event.
//
// Test hooks: #diff-view[data-state = loading | ready | error][data-status = parted | agree |
// not_compared]; #diff-sub; banners .df-banner (.incomplete, .agree, .not-compared, .error);
// .df-verdict; .df-side[data-run = a | b] (.df-run, .df-op, .df-module, .df-source with
// .df-file, .df-code; a.df-event[data-run][data-index]); table .df-values with
// tr[data-stat] (.parted for the statistic that parted; td.df-a, td.df-b, td.df-err);
// .df-only (an op one run lacks: data-run); table .df-around with tr.df-line (.parted at the
// parted pair, .only-a / .only-b where one run lacks the op), cells a.df-event; .df-loss
// (data-step: the first parted step, "" when none).

import { el, setChildren, fmtInt, basename } from "./util.js";
import { fmtValue } from "./headroom.js";

const STATS = ["mean", "std", "l2", "amax", "amin"];

function num(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === "string") return v === "inf" ? Infinity : v === "-inf" ? -Infinity : NaN;
  return v;
}

function fmtNum(v) {
  const x = num(v);
  if (x === null) return "–";
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "+Inf" : "-Inf";
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(4);
  return String(Number(x.toPrecision(6)));
}

function fmtErr(v) {
  const x = num(v);
  if (x === null) return "–";
  if (!Number.isFinite(x)) return "∞";
  return x === 0 ? "0" : x.toExponential(2);
}

function relErr(a, b) {
  const x = num(a);
  const y = num(b);
  if (x === null || y === null || !Number.isFinite(x) || !Number.isFinite(y)) return null;
  const d = Math.abs(x - y);
  const ref = Math.max(Math.abs(x), Math.abs(y));
  return ref === 0 ? 0 : d / ref;
}

export function renderDiffLoading(view, body) {
  view.dataset.state = "loading";
  setChildren(body, el("div", { className: "muted", text: "comparing the runs op by op…" }));
}

export function renderDiffError(view, body, message) {
  view.dataset.state = "error";
  setChildren(body, el("div", { className: "df-banner error", text: message }));
}

function eventLink(app, run, side) {
  return el("a", {
    className: "df-event evlink",
    href: `#run=${encodeURIComponent(run)}&sel=${side.kind === "graph_execution_trace" ? "t" : "e"}${side.index}`,
    dataset: { run, index: String(side.index), kind: side.kind },
    title: `open ${run} at this event`,
    text: `#${fmtInt(side.index)}`,
    on: {
      click: (e) => {
        e.preventDefault();
        app.openEvent(run, { kind: side.kind, index: side.index });
      },
    },
  });
}

function sourceOf(side) {
  const s = side.source || side.forward_source;
  if (!s) return el("div", { className: "df-source muted", text: "source not recorded" });
  return el(
    "div",
    { className: "df-source" },
    el("span", { className: "df-file", title: s.file, text: `${basename(s.file)}:${s.line}${side.source ? "" : " (its forward op)"}` }),
    s.code ? el("code", { className: "df-code", text: s.code.trim() }) : null,
  );
}

/** One run's side of the parted op. */
function sideCard(app, run, side, label) {
  return el(
    "div",
    { className: "df-side", dataset: { run: side.run } },
    el("div", { className: "df-run" }, el("b", { text: `${label} ` }), el("span", { text: run }), " ", eventLink(app, run, side)),
    el("div", { className: "df-op", text: side.op_type }),
    el("div", { className: "df-module", text: side.module_path || "ops outside modules" }),
    el("div", { className: "muted", text: `step ${fmtInt(side.step)} · ${side.phase} · ${side.dtype}${side.rank !== null && side.rank !== undefined ? ` · rank ${side.rank}` : ""}` }),
    sourceOf(side),
  );
}

/** The compared statistics of both ops: A, B and their relative error; the one that parted marked. */
function valuesTable(p) {
  const va = p.a.values || {};
  const vb = p.b.values || {};
  // The statistic that parted carries the diff's own relative error; the others are |A - B| over
  // the larger of the two, for comparison.
  const partedOut = new Map((p.outputs || []).filter((o) => o.parted && o.slot === 0).map((o) => [o.statistic, o]));
  const parted = new Set(partedOut.keys());
  const stats = STATS.filter((s) => s in va || s in vb);
  const counts = ["size", "neg", "zero", "pos", "nan", "neg_inf", "pos_inf"].filter((s) => s in va || s in vb);
  const row = (s) =>
    el(
      "tr",
      { className: parted.has(s) ? "parted" : "", dataset: { stat: s } },
      el("td", { className: "df-stat", text: s }),
      el("td", { className: "df-a", text: fmtNum(va[s]) }),
      el("td", { className: "df-b", text: fmtNum(vb[s]) }),
      el("td", { className: "df-err", text: fmtErr(partedOut.has(s) ? partedOut.get(s).relative_error : relErr(va[s], vb[s])) }),
    );
  return el(
    "table",
    { className: "df-values" },
    el("thead", {}, el("tr", {}, el("th", { text: "output" }), el("th", { text: "run A" }), el("th", { text: "run B" }), el("th", { text: "rel. error" }))),
    el("tbody", {}, [...stats, ...counts].map(row)),
  );
}

function aroundTable(app, data) {
  const around = data.around;
  if (!around) return null;
  const cell = (run, r) =>
    r
      ? [el("td", { className: "df-idx" }, eventLink(app, run, { kind: r.kind || "execution", index: r.index })), el("td", { className: `df-aop${r.nonfinite ? " nan" : ""}`, text: r.op_type || r.op_name || "" }), el("td", { className: "df-amod", title: r.module_path || "", text: r.module_path || "" })]
      : [el("td", { className: "df-idx muted", text: "—" }), el("td", { className: "muted", text: "" }), el("td", {})];
  return el(
    "table",
    { className: "df-around" },
    el("thead", {}, el("tr", {}, el("th", { text: "A" }), el("th", { text: "op" }), el("th", { text: "module" }), el("th", { className: "df-gap" }), el("th", { text: "B" }), el("th", { text: "op" }), el("th", { text: "module" }))),
    el(
      "tbody",
      {},
      around.lines.map((line, i) =>
        el(
          "tr",
          { className: `df-line${i === around.at ? " parted" : ""}${line.a && !line.b ? " only-a" : ""}${line.b && !line.a ? " only-b" : ""}`, dataset: { line: String(i) } },
          ...cell(data.run, line.a),
          el("td", { className: "df-gap", text: i === around.at ? "≠" : line.a && line.b ? "" : "·" }),
          ...cell(data.against, line.b),
        ),
      ),
    ),
  );
}

function lossBlock(loss) {
  if (!loss) return el("div", { className: "df-loss muted", dataset: { step: "" }, text: "No loss was found in both runs (no backward pass seeded from a loss)." });
  const steps = loss.steps || [];
  const first = loss.first_parted_step;
  let text;
  if (first === null || first === undefined) text = `The loss agrees within tolerance at every step both runs have (${fmtInt(steps.length)}), compared by its ${loss.statistic}.`;
  else {
    const s = steps.find((x) => x.step === first);
    text = `The loss first parts at step ${fmtInt(first)}` + (s ? `: ${fmtNum(s.value_a)} in run A, ${fmtNum(s.value_b)} in run B (relative error ${fmtErr(s.relative_error)}, by its ${loss.statistic}).` : ".");
  }
  const shown = first === null || first === undefined ? steps.slice(0, 8) : steps.filter((s) => s.step <= first).slice(-6);
  return el(
    "div",
    { className: "df-loss", dataset: { step: first === null || first === undefined ? "" : String(first) } },
    el("div", { className: "df-loss-text", text: text }),
    shown.length
      ? el(
          "table",
          { className: "df-values df-loss-steps" },
          el("thead", {}, el("tr", {}, el("th", { text: "step" }), el("th", { text: "run A" }), el("th", { text: "run B" }), el("th", { text: "rel. error" }))),
          el("tbody", {}, shown.map((s) => el("tr", { className: s.parted ? "parted" : "", dataset: { step: String(s.step) } }, el("td", { text: fmtInt(s.step) }), el("td", { className: "df-a", text: fmtNum(s.value_a) }), el("td", { className: "df-b", text: fmtNum(s.value_b) }), el("td", { className: "df-err", text: fmtErr(s.relative_error) })))),
        )
      : null,
  );
}

/** The view from /api/diff's answer. */
export function renderDiff(view, body, subEl, data, app) {
  const d = data.diff;
  view.dataset.state = "ready";
  view.dataset.status = d.status;
  const al = d.alignment || {};
  subEl.textContent = `${data.run} (A) against ${data.against} (B) · ${fmtInt(al.compared || 0)} pairs of ops compared · evidence: ${d.evidence}`;
  const parts = [];
  const problems = d.problems || [];
  if (problems.length)
    parts.push(el("div", { className: "df-banner incomplete" }, el("b", { text: "A dump is incomplete: " }), "events may be missing, so no verdict of agreement can be given.", el("ul", {}, problems.map((p) => el("li", { text: p })))));
  if (d.status === "not_compared") parts.push(el("div", { className: "df-banner not-compared", text: "Nothing could be compared: the runs share no step, or recorded nothing both can be compared by." }));
  else if (d.status === "agree" && !problems.length)
    parts.push(el("div", { className: "df-banner agree", text: `✓ The runs agree within tolerance at every compared op (${fmtInt(al.compared || 0)} pairs, ${fmtInt(al.steps || 0)} steps; evidence: ${d.evidence}).` }));
  const p = d.parted;
  if (p) {
    const out = (p.outputs || []).find((o) => o.parted) || (p.outputs || [])[0];
    const inputs = p.inputs_agree === true ? "its inputs agree" : p.inputs_agree === false ? "its inputs do not all agree" : "where its inputs came from is not all known";
    parts.push(
      el(
        "div",
        { className: "df-verdict" },
        el("b", { text: "The runs part first at " }),
        el("code", { text: p.op_type }),
        ` in ${p.module_path || "ops outside modules"}, step ${fmtInt(p.step)} (${p.phase}): relative error ${fmtErr(p.relative_error)} of its ${out ? out.statistic : "output"}, beyond ${p.compared_as}'s tolerance ${fmtErr(p.rtol)}; ${inputs}.`,
      ),
    );
    if (p.only_in_one_run) {
      const o = p.only_in_one_run;
      const run = o.run === "a" ? data.run : data.against;
      const s = o.source || o.forward_source;
      parts.push(
        el(
          "div",
          { className: "df-only", dataset: { run: o.run } },
          el("b", { text: `Only run ${o.run.toUpperCase()} has the op that fed it: ` }),
          el("code", { text: o.op_type }),
          ` in ${o.module_path || "ops outside modules"}`,
          s ? ` at ${basename(s.file)}:${s.line}` : "",
          " ",
          eventLink(app, run, o),
          s && s.code ? el("code", { className: "df-code", text: s.code.trim() }) : null,
        ),
      );
    }
    parts.push(el("div", { className: "df-sides" }, sideCard(app, data.run, p.a, "A"), valuesTable(p), sideCard(app, data.against, p.b, "B")));
    const table = aroundTable(app, data);
    if (table) parts.push(el("h3", { text: "the ops around it, paired" }), el("div", { className: "df-around-wrap" }, table));
  }
  parts.push(el("h3", { text: "loss" }), lossBlock(d.loss));
  setChildren(body, ...parts);
}
