// Graph structure (#graph-structure): the selected op with its inputs above and its
// consumers below. For a graph trace it comes from /api/graph_op (near = the trace, so each
// neighbour names its nearest trace); for an execution from the detail's input producers
// and consumers.

import { el, setChildren } from "./util.js";

function node(app, { title, sub, ref, slotText, cls = "" }) {
  const clickable = ref && ref.index !== null && ref.index !== undefined;
  return el(
    clickable ? "button" : "div",
    {
      className: `gnode ${cls} ${clickable ? "" : "inert"}`,
      title: clickable ? `select ${ref.kind === "graph_execution_trace" ? "trace" : "execution"} #${ref.index}` : "not recorded at this point",
      dataset: clickable ? { kind: ref.kind, index: String(ref.index) } : {},
      on: clickable ? { click: () => app.select({ kind: ref.kind, index: ref.index }, { from: "graph" }) } : undefined,
    },
    slotText ? el("span", { className: "g-slot", text: slotText }) : null,
    el("span", { className: "g-name", text: title }),
    sub ? el("span", { className: "g-sub", text: sub }) : null,
    clickable ? el("span", { className: "g-idx", text: `#${ref.index}` }) : null,
  );
}

function band(label, nodes, emptyText) {
  return el(
    "div",
    { className: "gband" },
    el("div", { className: "gband-label", text: label }),
    el("div", { className: "gband-nodes" }, nodes.length ? nodes : el("span", { className: "muted small", text: emptyText })),
  );
}

/** For a graph trace: `op` is the /api/graph_op answer. */
export function renderTraceGraph(host, subEl, op, ev, app) {
  subEl.textContent = op.graph_name ? `graph ${op.graph_name}` : "";
  const T = "graph_execution_trace";
  const inputs = (op.inputs || []).map((i) =>
    node(app, {
      title: `${i.op_name}:${i.output_slot}`,
      sub: i.op_type,
      slotText: `in ${i.input_slot}`,
      ref: i.trace_index === null || i.trace_index === undefined ? null : { kind: T, index: i.trace_index },
      cls: "in",
    }),
  );
  const consumers = (op.consumers || []).map((c) =>
    node(app, {
      title: c.op_name,
      sub: c.op_type,
      slotText: `out ${c.output_slot} → in ${c.input_slot}`,
      ref: c.trace_index === null || c.trace_index === undefined ? null : { kind: T, index: c.trace_index },
      cls: "out",
    }),
  );
  const self = op.op || {};
  setChildren(
    host,
    band("inputs", inputs, "no inputs"),
    el("div", { className: "garrow", text: "↓" }),
    el(
      "div",
      { className: "gself" },
      el("span", { className: "g-name", text: self.op_name || ev.op_name }),
      el("span", { className: "g-sub", text: `${self.op_type || ev.op_type}${self.num_outputs > 1 ? ` · ${self.num_outputs} outputs` : ""}${self.device ? " · " + self.device : ""}` }),
    ),
    el("div", { className: "garrow", text: "↓" }),
    band("consumers", consumers, "no consumers"),
  );
  return [...(op.inputs || [])].map((i) => i.trace_index).filter((x) => x !== null && x !== undefined);
}

/** For an execution: inputs' producers above, `consumers` below (from the detail). */
export function renderExecGraph(host, subEl, ev, app) {
  subEl.textContent = ev.graph ? `graph call ${ev.graph.graph_name || ev.graph.graph_id}` : "data flow";
  const inputs = (ev.inputs || []).map((inp, i) =>
    node(app, {
      title: inp.producer ? inp.producer.op_type || inp.producer.op_name : "outside the recording",
      sub: inp.producer ? "" : "data, a parameter, or made before recording",
      slotText: inp.name || `input ${i}`,
      ref: inp.producer,
      cls: "in" + (inp.counts && (inp.counts.nan || inp.counts.neg_inf || inp.counts.pos_inf) ? " bad" : ""),
    }),
  );
  const consumers = (ev.consumers || []).map((c) =>
    node(app, { title: c.op_type, slotText: `out ${c.output_slot} → in ${c.input_slot}`, ref: c, cls: "out" }),
  );
  const bad = ev.counts && (ev.counts.nan || ev.counts.neg_inf || ev.counts.pos_inf);
  setChildren(
    host,
    band("inputs", inputs, "no tensor inputs"),
    el("div", { className: "garrow", text: "↓" }),
    el("div", { className: "gself" + (bad ? " bad" : "") }, el("span", { className: "g-name", text: ev.op_type }), el("span", { className: "g-sub", text: `#${ev.index} · step ${ev.step}${ev.phase ? " · " + ev.phase : ""}` })),
    el("div", { className: "garrow", text: "↓" }),
    band("consumers", consumers, "no later reader found"),
  );
  return (ev.inputs || []).filter((i) => i.producer && i.producer.kind === "execution").map((i) => i.producer.index);
}

export function renderGraphMessage(host, subEl, message, isError = false) {
  subEl.textContent = "";
  setChildren(host, el("div", { className: isError ? "error" : "empty-state", text: message }));
}
