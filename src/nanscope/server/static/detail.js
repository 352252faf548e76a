// The selected event's detail (#exec-detail): op, step, phase, module, device, outputs and
// inputs with their FULL_HEALTH counts, the explanation, the backward→forward link,
// consumers, and the FULL_TENSOR values viewer.

import { el, setChildren, fmtInt, kindLabel } from "./util.js";
import { countsTable, shapeText } from "./counts.js";
import { eventLink, sourceLink } from "./alerts.js";

function badge(label, value, cls = "") {
  if (value === null || value === undefined || value === "") return null;
  return el("span", { className: `badge ${cls}` }, el("span", { className: "b-k", text: label }), el("span", { className: "b-v", text: String(value) }));
}

export function renderDetail(host, titleEl, subEl, ev, kind, app) {
  const isTrace = kind === "graph_execution_trace";
  titleEl.textContent = `${kindLabel(kind)} #${ev.index}`;
  const proc = app.processLabel(ev.process);
  subEl.textContent = proc || "";
  host.dataset.kind = kind;
  host.dataset.index = String(ev.index);
  const out = [];

  out.push(
    el(
      "div",
      { className: "d-head" },
      el("span", { className: "d-op", id: "detail-op", text: ev.op_type || "" }),
      isTrace && ev.op_name ? el("span", { className: "d-opname", text: ev.op_name + (ev.output_slot !== undefined && ev.output_slot !== null ? `:${ev.output_slot}` : "") }) : null,
    ),
  );
  const graphName = ev.graph_name || (ev.graph && (ev.graph.graph_name || ev.graph.graph_id)) || "";
  out.push(
    el(
      "div",
      { className: "badges" },
      app && app.runInfo && app.runInfo.steps_known === false ? null : badge("step", ev.step),
      badge("phase", ev.phase, `phase-${ev.phase}`),
      badge("module", ev.module_path),
      badge("device", ev.device),
      badge("graph", graphName),
      ev.rank !== null && ev.rank !== undefined ? badge("rank", ev.rank) : null,
      // A torch.distributed operation: which one, by its group's order (what ranks share).
      ev.collective ? badge("collective", ev.collective.label, "d-collective") : null,
      ev.source ? el("span", { className: "badge", title: ev.source.function ? `in ${ev.source.function}` : "" }, el("span", { className: "b-k", text: "source" }), el("span", { className: "b-v" }, sourceLink(app, ev.source, ev.process))) : null,
    ),
  );

  // The server explains only events known to hold Inf/NaN (empty otherwise).
  if (ev.explanation) out.push(el("div", { className: "d-why" }, el("span", { className: "d-why-k", text: "why" }), el("span", { text: ev.explanation })));

  // backward → forward
  if (ev.forward_op || (ev.forward_index !== null && ev.forward_index !== undefined)) {
    out.push(
      el(
        "div",
        { className: "d-line d-forward" },
        el("span", { className: "d-k", text: "gradient of" }),
        ev.forward_index !== null && ev.forward_index !== undefined
          ? eventLink(app, { kind: "execution", index: ev.forward_index, op_type: ev.forward_op }, `${ev.forward_op || "forward op"} #${ev.forward_index}`)
          : el("span", { text: ev.forward_op }),
        ev.forward_source ? el("span", { className: "muted", text: " called at " }) : null,
        sourceLink(app, ev.forward_source, ev.process),
      ),
    );
  }

  // outputs
  const outputs = ev.outputs || [];
  if (outputs.length) {
    const entries = outputs.map((o) => ({
      label: el("span", {}, `out ${o.slot}`, o.tensor_id !== null && o.tensor_id !== undefined && o.tensor_id >= 0 ? el("span", { className: "muted", text: ` t${o.tensor_id}` }) : null),
      counts: o.counts,
      shape: o.shape,
      dataset: { slot: String(o.slot) },
    }));
    out.push(el("h3", { text: `Outputs (${outputs.length})` }), countsTable(entries, { firstHeader: "" }));
  } else if (ev.counts) {
    out.push(el("h3", { text: "Output" }), countsTable([{ label: "out", counts: ev.counts, shape: ev.shape }]));
  }

  // inputs
  const inputs = ev.inputs || [];
  if (inputs.length) {
    const entries = inputs.map((inp, i) => ({
      label: el(
        "span",
        { className: "in-label" },
        el("span", { text: inp.name || `input ${i}` }),
        el("span", { className: "muted", text: " ← " }),
        inp.producer ? eventLink(app, inp.producer, `${inp.producer.op_type || inp.producer.op_name} #${inp.producer.index}`) : el("span", { className: "muted", text: "not made by a recorded op" }),
      ),
      counts: inp.counts,
      shape: null,
      dataset: { input: String(i) },
    }));
    out.push(el("h3", { text: `Inputs (${inputs.length})` }), countsTable(entries));
    if (inputs.some((i) => !i.counts)) out.push(el("div", { className: "muted small", text: "– : the input's values were not recorded" }));
  }

  // consumers
  const consumers = ev.consumers || [];
  if (consumers.length) {
    const row = el("div", { className: "chips" });
    for (const c of consumers) {
      const link = eventLink(app, c, `${c.op_type} #${c.index}`);
      link.title = `reads output ${c.output_slot} as input ${c.input_slot}`;
      row.appendChild(link);
    }
    out.push(el("h3", { text: `Consumers (${consumers.length}${consumers.length >= 20 ? "+" : ""})` }), row);
  }

  if (isTrace && ev.graph_ids && ev.graph_ids.length) {
    out.push(el("div", { className: "d-line" }, el("span", { className: "d-k", text: "graphs" }), el("span", { className: "mono small", text: ev.graph_ids.join(" › ") })));
  }

  // FULL_TENSOR values
  if (ev.has_values) {
    const viewer = el("div", { className: "tensor-view" });
    const slots = outputs.length ? outputs.map((o) => o.slot) : [0];
    const buttons = el("div", { className: "chips" });
    for (const slot of slots) {
      buttons.appendChild(
        el("button", {
          className: "btn sm",
          text: slots.length > 1 ? `values of out ${slot}` : "show values",
          on: { click: () => loadValues(viewer, app, kind, ev.index, slot) },
        }),
      );
    }
    out.push(el("h3", { text: "Values (FULL_TENSOR)" }), buttons, viewer);
  }
  setChildren(host, ...out);
}

const VALUE_LIMIT = 1000;

async function loadValues(viewer, app, kind, index, slot) {
  setChildren(viewer, el("div", { className: "muted", text: "loading values…" }));
  try {
    const t = await app.api.tensor(kind, index, slot, VALUE_LIMIT);
    const stats = t.stats || {};
    const head = el(
      "div",
      { className: "tv-head" },
      el("span", { text: `${t.dtype} ${shapeText(t.shape)} · ${fmtInt(t.size)} values` }),
      stats.min !== undefined ? el("span", { className: "muted", text: ` · min ${fmtVal(stats.min)} max ${fmtVal(stats.max)} mean ${fmtVal(stats.mean)} · finite ${fmtInt(stats.finite)}` }) : null,
      t.truncated ? el("span", { className: "muted", text: ` · first ${fmtInt(t.values.length)} shown` }) : null,
    );
    const grid = el("div", { className: "tv-grid" });
    t.values.forEach((v, i) => {
      const bad = v === "nan" || v === "inf" || v === "-inf";
      grid.appendChild(el("span", { className: "tv-cell" + (bad ? " hot" : v === 0 ? " zero" : ""), text: fmtVal(v), title: `[${i}]` }));
    });
    setChildren(viewer, head, grid);
    viewer.scrollIntoView({ block: "nearest" });
  } catch (e) {
    setChildren(viewer, el("div", { className: "error", text: e.message }));
  }
}

function fmtVal(v) {
  if (typeof v === "string") return v;
  if (v === null || v === undefined) return "–";
  if (typeof v === "boolean") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
  return v.toPrecision(5).replace(/\.?0+$/, "");
}

export function renderDetailError(host, titleEl, message) {
  titleEl.textContent = "Event";
  delete host.dataset.kind;
  delete host.dataset.index;
  setChildren(host, el("div", { className: "error", text: message }));
}
