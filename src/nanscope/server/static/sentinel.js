// The sentinel view (#sentinel-view): a sentinel's per-step history (/api/sentinel) in place of
// the run's panels. Banners first (the history is incomplete or damaged; a replay did not
// reproduce the Inf/NaN or there was none; or the all-clear, only for a complete history
// without trips), then each trip with "replayed: <headline>", a link that opens the replay's
// run on its root cause (the first view), then three charts over the steps: the loss, the
// gradient norm and the largest |x| (the watched modules' forward outputs, the gradients,
// the parameters, the optimizer state). Drawn as the Headroom chart is: SVG, a log scale in
// decades where values span them, the trip a dashed line, steps holding Inf/NaN marked
// above the plot. Two ranges: a trip's lead-up (its last steps, exact; per module) or the
// whole history (buckets: each one's smallest to largest value as a band).
//
// Test hooks: #sentinel-view[data-state = loading | ready | error][data-mode = lead | whole]
// [data-trip = the lead-up's step][data-complete = 1 | 0]; #sn-sub; banners .sn-banner with
// .incomplete (its problems li.sn-problem), .not-reproduced[data-step], .no-replay[data-step],
// .missing[data-step], .ok, .error; trips .sn-trip[data-step] (.sn-where, .sn-action) with
// a.sn-replay[data-run] ("replayed: <headline>") and button.sn-lead[data-step]; #sn-whole;
// charts .sn-chart[data-series = loss | grad_norm | amax][data-scale = log | linear] holding
// svg.sn-svg (data-from, data-to: the steps shown) with polyline.sn-line[data-key], polygon
// .sn-band[data-key], line.sn-trip-line[data-step], g.sn-nonfinite[data-step] (a step, or a
// bucket's first step, where a series was not finite); legend .sn-lg[data-key]; tooltip .sn-tip.

import { el, setChildren, fmtInt } from "./util.js";
import { fmtValue, plotRuns, svg, svgText } from "./headroom.js";

const HEIGHT = 170;
const PAD = { left: 58, right: 14, top: 16, bottom: 22 };
const COLORS = ["#ff7b72", "#58a6ff", "#e3b341", "#3fb950", "#d2a8ff", "#56d4dd", "#f0883e", "#db61a2"];
const CHECK_WORDS = { loss: "loss", gradients: "gradients", parameters: "parameters", optimizer_state: "optimizer state" };

/** A figure as the route sends it: a number, "nan"/"inf"/"-inf", or null (not measured). */
function num(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === "string") return v === "nan" ? NaN : v === "inf" ? Infinity : v === "-inf" ? -Infinity : null;
  return v;
}

function fmtFigure(v) {
  const x = num(v);
  if (x === null) return "not measured";
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "+Inf" : "-Inf";
  return fmtValue(x);
}

function plural(n, word) {
  return `${fmtInt(n)} ${word}${n === 1 ? "" : "s"}`;
}

function checks(where) {
  return (where || []).map((w) => CHECK_WORDS[w] || w).join(", ") || "a check";
}

export function renderSentinelLoading(view, body) {
  view.dataset.state = "loading";
  if (!body.querySelector(".sn-chart")) setChildren(body, el("div", { className: "muted", text: "sentinel history: loading…" }));
}

export function renderSentinelError(view, body, message) {
  view.dataset.state = "error";
  setChildren(body, el("div", { className: "sn-banner error", text: message }));
}

/** The banners: what the history cannot tell, what a replay did not show, or the all-clear. */
function banners(data) {
  const out = [];
  if (data.error) {
    out.push(el("div", { className: "sn-banner error", text: `This sentinel history cannot be read: ${data.error}` }));
    return out;
  }
  if (!data.complete) {
    const last = data.last_step === null || data.last_step === undefined ? "" : ` after step ${fmtInt(data.last_step)}`;
    out.push(
      el(
        "div",
        { className: "sn-banner incomplete" },
        el("b", { text: "Incomplete history: " }),
        data.ended ? "parts of it cannot be read. " : `the program stopped without closing the sentinel (a crash or a kill); what happened${last} is unknown. `,
        "This is no all-clear.",
        el("ul", {}, (data.problems || []).map((p) => el("li", { className: "sn-problem", text: p }))),
      ),
    );
  }
  for (const t of data.trips || []) {
    const step = String(t.step);
    if (t.reproduced === false)
      out.push(
        el(
          "div",
          { className: "sn-banner not-reproduced", dataset: { step } },
          el("b", { text: `The replay of step ${fmtInt(t.step)} did not reproduce the Inf/NaN. ` }),
          "Replayed from the same state and batch, the step stayed finite: the step is not deterministic, or the hardware faulted (a transient fault). Its dump shows the step as replayed, not as it went bad.",
        ),
      );
    else if (t.reproduced === null && !t.replay)
      out.push(el("div", { className: "sn-banner no-replay", dataset: { step } }, el("b", { text: `Step ${fmtInt(t.step)} was not replayed: ` }), t.reason || "no reason was recorded."));
    if (t.replay && !t.run)
      out.push(el("div", { className: "sn-banner missing", dataset: { step } }, el("b", { text: `The replay's dump of step ${fmtInt(t.step)} cannot be opened: ` }), `${t.replay} holds no readable dump under this logdir.`));
  }
  if (data.complete && !(data.trips || []).length) {
    const span = data.num_steps ? ` (steps ${fmtInt(data.first_step)}–${fmtInt(data.last_step)})` : "";
    out.push(el("div", { className: "sn-banner ok", text: `✓ No Inf/NaN in the ${plural(data.num_steps, "step")} the sentinel checked${span}.` }));
  }
  return out;
}

/** One trip: where the sentinel saw Inf/NaN, what it did, and the link to the replay's run. */
function tripCard(t, app, view) {
  const action = t.action === "skip" ? "the step was skipped and training went on" : "the run stopped";
  let replay;
  if (t.run && t.reproduced !== false) {
    const headline = t.cause ? t.cause.headline : "the replay's dump (its report names no cause)";
    replay = el("a", {
      className: "sn-replay",
      href: `#run=${encodeURIComponent(t.run)}`,
      dataset: { run: t.run },
      title: `open the replay's run ${t.run} on its root cause`,
      text: `replayed: ${headline}`,
      on: {
        click: (e) => {
          e.preventDefault();
          app.openReplay(t.run);
        },
      },
    });
  } else if (t.run)
    replay = el("a", {
      className: "sn-replay",
      href: `#run=${encodeURIComponent(t.run)}`,
      dataset: { run: t.run },
      text: `replayed without Inf/NaN: open the replay's dump`,
      on: {
        click: (e) => {
          e.preventDefault();
          app.openReplay(t.run);
        },
      },
    });
  else replay = el("span", { className: "muted", text: t.replay ? `replay: ${t.replay} (not readable)` : "not replayed" });
  const where = t.cause && t.cause.file ? el("div", { className: "sn-cause-at muted", text: `${t.cause.op_type || ""} at ${t.cause.file}:${t.cause.line ?? "?"}` }) : null;
  return el(
    "div",
    { className: "sn-trip", dataset: { step: String(t.step) } },
    el("div", { className: "sn-trip-head" }, el("span", { className: "sn-trip-step", text: `step ${fmtInt(t.step)}` }), el("span", { className: "sn-where", text: `Inf/NaN in ${checks(t.where)}` }), el("span", { className: "sn-action muted", text: action }), el("span", { className: "spacer" }), el("button", { className: "btn sm sn-lead", dataset: { step: String(t.step) }, text: "lead-up", title: `chart the last steps before step ${t.step}, exact`, on: { click: () => app.showSentinel(view.dataset.history, { mode: "lead", trip: t.step }) } })),
    replay,
    where,
  );
}

/** The series of the three charts for the range shown: {xs, charts: [{series, title, keys}]}. */
function chartData(data, mode, tripStep) {
  if (mode === "lead") {
    const t = (data.trips || []).find((x) => x.step === tripStep) || (data.trips || [])[0];
    const L = t.lead_up;
    const xs = L.steps;
    const mods = (L.modules || []).map((m, i) => ({ key: `module:${m.module}`, label: m.module, color: COLORS[i % COLORS.length], ys: m.values }));
    return {
      xs,
      trips: [t.step],
      bucketed: false,
      charts: [
        { key: "loss", title: "loss", series: [{ key: "loss", label: "loss", color: "#e6edf3", ys: L.loss }] },
        { key: "grad_norm", title: "gradient norm", series: [{ key: "grad_norm", label: "gradient norm (L2)", color: "#58a6ff", ys: L.grad_norm }] },
        {
          key: "amax",
          title: "largest |x|",
          series: [
            ...mods,
            { key: "grad_amax", label: "gradients", color: "#8b949e", dash: "5 3", ys: L.grad_amax },
            { key: "param_amax", label: "parameters", color: "#6e7681", dash: "2 3", ys: L.param_amax },
            { key: "state_amax", label: "optimizer state", color: "#484f58", dash: "1 3", ys: L.state_amax },
          ].filter((s) => s.ys.some((v) => v !== null)),
          modules: L.amax_module,
        },
      ],
    };
  }
  const b = data.buckets;
  const xs = b.first_step.map((f, i) => (f + b.last_step[i]) / 2);
  const band = (key, label, color, dash) => ({ key, label, color, dash, ys: b[key].max, lo: b[key].min, hi: b[key].max, nonfinite: b[key].nonfinite });
  return {
    xs,
    trips: (data.trips || []).map((t) => t.step),
    bucketed: true,
    first: b.first_step,
    last: b.last_step,
    charts: [
      { key: "loss", title: "loss", series: [band("loss", "loss", "#e6edf3")] },
      { key: "grad_norm", title: "gradient norm", series: [band("grad_norm", "gradient norm (L2)", "#58a6ff")] },
      {
        key: "amax",
        title: "largest |x|",
        series: [band("amax", "module outputs (forward)", "#ff7b72"), band("grad_amax", "gradients", "#8b949e", "5 3"), band("param_amax", "parameters", "#6e7681", "2 3"), band("state_amax", "optimizer state", "#484f58", "1 3")].filter((s) => s.ys.some((v) => v !== null) || s.nonfinite.some((n) => n > 0)),
      },
    ],
  };
}

/**
 * The view from /api/sentinel's answer. opts.mode: "lead" (a trip's lead-up, opts.trip its
 * step; the default when there is a trip) or "whole". Returns {redraw()}.
 */
export function renderSentinel(view, body, subEl, data, app, opts = {}) {
  const trips = data.trips || [];
  const mode = opts.mode === "whole" || !trips.length ? "whole" : "lead";
  const tripStep = mode === "lead" ? (trips.some((t) => t.step === opts.trip) ? opts.trip : trips[0].step) : null;
  view.dataset.state = "ready";
  view.dataset.mode = mode;
  view.dataset.history = data.history;
  view.dataset.complete = data.complete ? "1" : "0";
  if (tripStep !== null) view.dataset.trip = String(tripStep);
  else delete view.dataset.trip;
  const what = data.num_steps ? `${plural(data.num_steps, "step")} checked (${fmtInt(data.first_step)}–${fmtInt(data.last_step)})` : "no steps written";
  subEl.textContent = [data.history === "." ? "logdir" : data.history, data.framework, what, trips.length ? plural(trips.length, "trip") : null].filter(Boolean).join(" · ");

  const parts = [...banners(data)];
  if (!data.error) {
    if (trips.length) parts.push(el("div", { className: "sn-trips" }, trips.map((t) => tripCard(t, app, view))));
    const wholeBtn = el("button", { id: "sn-whole", className: `btn sm${mode === "whole" ? " active" : ""}`, text: "whole history", title: "every step, in buckets (each one's smallest to largest value)", on: { click: () => app.showSentinel(data.history, { mode: "whole" }) } });
    const range =
      mode === "lead"
        ? `the ${plural(data.trips.find((t) => t.step === tripStep).lead_up.steps.length, "step")} up to the trip at step ${fmtInt(tripStep)}, exact`
        : data.bucket_size > 1
          ? `${plural(data.window ? data.window.end - data.window.begin : 0, "step")} in ${fmtInt(data.buckets.first_step.length)} buckets of ~${fmtInt(Math.round(data.bucket_size))} steps: each one's smallest to largest value`
          : `every step (${plural(data.num_steps, "step")})`;
    parts.push(el("div", { className: "sn-rangebar" }, el("span", { className: "sn-range muted", text: range }), el("span", { className: "spacer" }), wholeBtn));
    if (data.num_steps) {
      const cd = chartData(data, mode, tripStep);
      const hosts = cd.charts.map((c) => {
        const host = el("div", { className: "sn-chart", dataset: { series: c.key }, attrs: { role: "img", "aria-label": `${c.title} per step` } });
        const legend = el(
          "div",
          { className: "sn-legend" },
          c.series.map((s) => {
            const sw = el("i", { className: "sn-swatch" });
            sw.style.background = s.color; // CSSOM, not style=""
            return el("span", { className: "sn-lg", dataset: { key: s.key } }, sw, el("span", { text: s.label }));
          }),
        );
        const tip = el("div", { className: "sn-tip", hidden: true });
        return { c, host, tip, box: el("div", { className: "sn-chart-box" }, el("h3", { text: c.title }), el("div", { className: "sn-wrap" }, host, tip), legend) };
      });
      parts.push(el("div", { className: "sn-charts" }, hosts.map((h) => h.box)));
      setChildren(body, ...parts);
      const redraw = () => hosts.forEach((h) => drawChart(h, cd));
      redraw();
      return { redraw };
    }
  }
  setChildren(body, ...parts);
  return { redraw: () => {} };
}

/** The y scale: log (in decades) when every finite value is positive and they span more than two. */
function scaleOf(series) {
  let min = Infinity;
  let max = -Infinity;
  let minPos = Infinity;
  for (const s of series)
    for (const arr of [s.ys, s.lo || []])
      for (const raw of arr) {
        const v = num(raw);
        if (v === null || !Number.isFinite(v)) continue;
        if (v < min) min = v;
        if (v > max) max = v;
        if (v > 0 && v < minPos) minPos = v;
      }
  if (!Number.isFinite(min)) return { log: false, lo: 0, hi: 1 };
  if (min > 0 && max / min > 100) return { log: true, lo: Math.floor(Math.log10(minPos)), hi: Math.max(Math.floor(Math.log10(minPos)) + 1, Math.ceil(Math.log10(max))) };
  if (max === min) return { log: false, lo: min - Math.abs(min || 1) * 0.1, hi: max + Math.abs(max || 1) * 0.1 };
  const pad = (max - min) * 0.06;
  return { log: false, lo: min - pad, hi: max + pad };
}

function linearTicks(lo, hi, n) {
  const raw = (hi - lo) / n;
  const mag = 10 ** Math.floor(Math.log10(raw || 1));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((m) => m >= raw) || mag * 10;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

function drawChart(h, cd) {
  const { c, host } = h;
  const width = Math.max(360, Math.floor(host.clientWidth || 700));
  const xs = cd.xs;
  const minX = cd.bucketed ? cd.first[0] : xs[0];
  let maxX = cd.bucketed ? cd.last[cd.last.length - 1] : xs[xs.length - 1];
  if (maxX === minX) maxX = minX + 1;
  const sc = scaleOf(c.series);
  host.dataset.scale = sc.log ? "log" : "linear";
  const x0 = PAD.left;
  const x1 = width - PAD.right;
  const y0 = PAD.top;
  const y1 = HEIGHT - PAD.bottom;
  const xOf = (x) => x0 + ((x - minX) / (maxX - minX)) * (x1 - x0);
  const yOf = (v) => {
    const d = sc.log ? (v > 0 ? Math.log10(v) : sc.lo) : v;
    const cl = Math.max(sc.lo, Math.min(sc.hi, d));
    return y1 - ((cl - sc.lo) / (sc.hi - sc.lo)) * (y1 - y0);
  };
  const root = svg("svg", { class: "sn-svg", width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, "data-from": minX, "data-to": maxX });
  const grid = svg("g", { class: "hr-grid" });
  if (sc.log) {
    const every = Math.max(1, Math.ceil((sc.hi - sc.lo) / 6));
    for (let d = sc.lo; d <= sc.hi; d += every) {
      const y = yOf(10 ** d);
      grid.appendChild(svg("line", { x1: x0, x2: x1, y1: y, y2: y, class: "hr-gl" }));
      grid.appendChild(svgText(x0 - 5, y + 3.5, d === 0 ? "1" : `1e${d}`, "hr-ylab", "end"));
    }
  } else {
    for (const t of linearTicks(sc.lo, sc.hi, 5)) {
      const y = yOf(t);
      grid.appendChild(svg("line", { x1: x0, x2: x1, y1: y, y2: y, class: "hr-gl" }));
      grid.appendChild(svgText(x0 - 5, y + 3.5, fmtValue(t), "hr-ylab", "end"));
    }
  }
  for (const t of linearTicks(minX, maxX, Math.max(2, Math.floor((x1 - x0) / 90)))) {
    if (!Number.isInteger(t)) continue;
    const x = xOf(t);
    grid.appendChild(svg("line", { x1: x, x2: x, y1: y0, y2: y1, class: "hr-gl v" }));
    grid.appendChild(svgText(x, HEIGHT - 8, fmtInt(t), "hr-xlab", "middle"));
  }
  root.appendChild(grid);
  root.appendChild(svgText(x0 - 5, HEIGHT - 8, "step", "hr-axis", "end"));

  // Bands (a bucket's smallest to largest value), then lines, broken where a value is missing
  // or not finite; drawn so that the first series ends on top.
  const lines = svg("g", { class: "sn-lines" });
  const marks = new Map(); // x position -> labels of what was not finite there
  for (const s of [...c.series].reverse()) {
    if (s.lo && xs.length > 1) {
      const up = [];
      const down = [];
      const flush = () => {
        if (up.length > 1) lines.appendChild(svg("polygon", { points: [...up, ...down.reverse()].join(" "), fill: s.color, class: "sn-band", "data-key": s.key }));
        up.length = 0;
        down.length = 0;
      };
      for (let i = 0; i < xs.length; i++) {
        const lo = num(s.lo[i]);
        const hi = num(s.hi[i]);
        if (lo === null || hi === null) {
          flush();
          continue;
        }
        up.push(`${xOf(xs[i]).toFixed(1)},${yOf(hi).toFixed(1)}`);
        down.push(`${xOf(xs[i]).toFixed(1)},${yOf(lo).toFixed(1)}`);
      }
      flush();
    }
    let cur = [];
    const runs = [];
    for (let i = 0; i < xs.length; i++) {
      const v = num(s.ys[i]);
      const bad = s.nonfinite ? s.nonfinite[i] > 0 : v !== null && !Number.isFinite(v);
      if (bad) {
        const step = cd.bucketed ? cd.first[i] : xs[i];
        const what = s.nonfinite ? `${s.label}: Inf/NaN in ${plural(s.nonfinite[i], "step")} of ${fmtInt(cd.first[i])}–${fmtInt(cd.last[i])}` : `${s.label}: ${fmtFigure(s.ys[i])} at step ${fmtInt(step)}`;
        if (!marks.has(step)) marks.set(step, []);
        marks.get(step).push(what);
      }
      if (v !== null && Number.isFinite(v) && (!sc.log || v > 0)) cur.push(`${xOf(xs[i]).toFixed(1)},${yOf(v).toFixed(1)}`);
      else if (cur.length) {
        runs.push(cur);
        cur = [];
      }
    }
    if (cur.length) runs.push(cur);
    plotRuns(
      lines,
      runs,
      { r: 2.2, fill: s.color, class: "sn-dot", "data-key": s.key },
      { stroke: s.color, "stroke-dasharray": s.dash || null, class: "sn-line", "data-key": s.key },
    );
  }
  root.appendChild(lines);

  for (const step of cd.trips) {
    if (step < minX || step > maxX) continue;
    const x = xOf(step);
    root.appendChild(svg("line", { x1: x, x2: x, y1: y0 - 6, y2: y1, class: "sn-trip-line", "data-step": step }));
    root.appendChild(svgText(x - 4, y0 + 4, `trip · step ${fmtInt(step)}`, "sn-trip-label", "end"));
  }
  for (const [step, what] of marks) {
    const g = svg("g", { class: "sn-nonfinite", "data-step": step });
    const x = xOf(step);
    g.appendChild(svg("path", { d: `M${x - 4},${y0 - 9} h8 l-4,7 z`, class: "sn-nf-tri" }));
    const t = svg("title");
    t.textContent = what.join("\n");
    g.appendChild(t);
    root.appendChild(g);
  }
  const cursor = svg("line", { x1: -10, x2: -10, y1: y0, y2: y1, class: "sn-cursor" });
  root.appendChild(cursor);
  root.addEventListener("mousemove", (e) => hover(h, cd, e, xOf, cursor));
  root.addEventListener("mouseleave", () => {
    h.tip.hidden = true;
    cursor.setAttribute("x1", "-10");
    cursor.setAttribute("x2", "-10");
  });
  setChildren(host, root);
}

function hover(h, cd, e, xOf, cursor) {
  const root = h.host.querySelector("svg");
  const r = root.getBoundingClientRect();
  const px = e.clientX - r.left;
  let best = 0;
  for (let i = 1; i < cd.xs.length; i++) if (Math.abs(xOf(cd.xs[i]) - px) < Math.abs(xOf(cd.xs[best]) - px)) best = i;
  const x = xOf(cd.xs[best]);
  cursor.setAttribute("x1", x.toFixed(1));
  cursor.setAttribute("x2", x.toFixed(1));
  const head = cd.bucketed ? (cd.first[best] === cd.last[best] ? `step ${fmtInt(cd.first[best])}` : `steps ${fmtInt(cd.first[best])}–${fmtInt(cd.last[best])}`) : `step ${fmtInt(cd.xs[best])}`;
  const rows = h.c.series.map((s) => {
    const v = cd.bucketed && s.lo && num(s.lo[best]) !== num(s.hi[best]) ? `${fmtFigure(s.lo[best])} – ${fmtFigure(s.hi[best])}` : fmtFigure(s.ys[best]);
    const nf = cd.bucketed && s.nonfinite && s.nonfinite[best] ? ` · Inf/NaN in ${plural(s.nonfinite[best], "step")}` : "";
    return el("div", { text: `${s.label}: ${v}${nf}` });
  });
  const mod = h.c.modules && h.c.modules[best] ? el("div", { className: "muted", text: `largest module output: ${h.c.modules[best]}` }) : null;
  setChildren(h.tip, el("div", { className: "hr-tip-mod", text: head }), ...rows, mod);
  h.tip.hidden = false;
  const w = h.host.clientWidth;
  h.tip.style.left = `${x + 12 + 280 > w ? Math.max(0, x - 12 - 280) : x + 12}px`; // CSSOM: the CSP forbids style=""
  h.tip.style.top = "14px";
}
