// The event lists (#graph-execs): one row of the virtualised list (vlist.js) and the column
// header (#list-header) above it, for the Executions tab and the Graph traces tab. Rendering
// only: which list is in view, and what a click on a row does, is the app's (app.js).

import { el, setChildren } from "./util.js";
import { summaryCell } from "./counts.js";

/** The column header of the Graph traces list (`traces`) or the Executions list. */
export function renderListHeader(header, traces) {
  if (traces) {
    setChildren(header, el("span", { className: "c-idx", text: "#" }), el("span", { className: "c-name", text: "op name" }), el("span", { className: "c-type", text: "op type" }), el("span", { className: "c-step", text: "step" }), el("span", { className: "c-sum", text: "summary" }));
  } else {
    setChildren(header, el("span", { className: "c-idx", text: "#" }), el("span", { className: "c-name", text: "op type" }), el("span", { className: "c-phase", text: "ph", title: "phase: f forward, b backward, o optimizer" }), el("span", { className: "c-step", text: "step" }), el("span", { className: "c-sum", text: "summary" }));
  }
}

/** A row's health as classes: "bad" (Inf/NaN), and "nan" or "inf"; the Ranks panel marks rows so too. */
export function healthClass(row) {
  const c = row.counts || {};
  const cls = [];
  if (row.nonfinite) cls.push("bad");
  if (c.nan) cls.push("nan");
  else if (c.neg_inf || c.pos_inf) cls.push("inf");
  return cls;
}

/**
 * A list row (.vrow[data-index], .nan / .inf when it holds NaN / ±Inf): a graph trace
 * (`traces`) or an execution. `stepsKnown` false: the dump records no steps (TensorFlow's).
 */
export function renderListRow(row, traces, stepsKnown) {
  const cls = ["vrow", ...healthClass(row)];
  const node = el("div", { className: cls.join(" "), dataset: { index: String(row.index) } });
  node.appendChild(el("span", { className: "c-idx", text: String(row.index) }));
  if (traces) {
    const slot = row.output_slot ? `:${row.output_slot}` : "";
    node.appendChild(el("span", { className: "c-name", text: row.op_name + slot, title: `${row.op_name}:${row.output_slot} in ${row.graph_name || row.graph_id}` }));
    node.appendChild(el("span", { className: "c-type", text: row.op_type, title: row.op_type }));
  } else {
    node.appendChild(el("span", { className: "c-name", text: row.op_type, title: row.op_type }));
    node.appendChild(el("span", { className: `c-phase phase-${row.phase}`, text: row.phase ? row.phase.slice(0, 1) : "", title: row.phase }));
  }
  node.appendChild(el("span", { className: "c-step", text: stepsKnown ? String(row.step) : "–", title: stepsKnown ? "" : "this dump records no steps" }));
  const sum = summaryCell(row);
  sum.classList.add("c-sum");
  node.appendChild(sum);
  return node;
}
