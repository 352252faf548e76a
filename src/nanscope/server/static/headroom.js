// The Headroom panel (#headroom): how close each module's values came to what their
// floating-point format holds, step by step (/api/headroom): one line per module and phase
// on a log scale of `level` (the step's largest finite |x| over the format's largest value;
// 1 is overflow), the overflow line, half of it, the first Inf, and the report's headroom
// warnings under the chart, each marked on its module's line where it began. A click on a
// line (the nearest point under the cursor) selects that point's execution through the
// app's selection, so the timeline and the detail follow. Rendering only: fetching and
// selecting are the app's. SVG attributes only (stroke, fill): the CSP forbids style="".
//
// Collapsed (#headroom[data-collapsed="1"], <body class="headroom-collapsed">, the chart
// hidden, #headroom-toggle's aria-expanded "false") when nothing is near a limit: no
// warning against the format measured. The head still says how high the values came.

import { el, setChildren, fmtInt } from "./util.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const EXEC = "execution";
// The formats the route measures against (its `format`); "" is each value's own format.
export const HEADROOM_FORMATS = ["", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"];
// Distinct on the dark theme, in the order the route ranks the series (nearest to overflow first).
const COLORS = ["#ff7b72", "#58a6ff", "#e3b341", "#3fb950", "#d2a8ff", "#56d4dd", "#f0883e", "#db61a2"];
const MAX_SERIES = 8;
const HEIGHT = 200;
const PAD = { left: 50, right: 14, top: 18, bottom: 22 };
const LOWEST_DECADE = -8; // levels below 1e-8 sit on the chart's floor
const HIT_PX = 28; // how far from a line a click still picks its nearest point

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  for (const c of children) if (c) node.appendChild(c);
  return node;
}

export function svgText(x, y, text, cls, anchor = "start") {
  const t = svg("text", { x, y, class: cls, "text-anchor": anchor });
  t.textContent = text;
  return t;
}

/** Runs of "x,y" points (a series split where a value is missing) drawn into `parent`:
 * a polyline each, a lone point as a dot; `dot` and `line` are their other attributes. */
export function plotRuns(parent, runs, dot, line) {
  for (const pts of runs) {
    if (pts.length === 1) {
      const [cx, cy] = pts[0].split(",");
      parent.appendChild(svg("circle", { cx, cy, ...dot }));
    } else parent.appendChild(svg("polyline", { points: pts.join(" "), ...line }));
  }
}

/** A module's name for people: "ops outside modules" for the empty path. */
export function moduleName(module) {
  return module ? module : "ops outside modules";
}

/** |x| for people: 57,312 from 1e3 up, 0.0123 / 1.2e-7 below. */
export function fmtValue(v) {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a >= 1000) return fmtInt(Math.round(v));
  if (a >= 1) return String(Number(v.toPrecision(4)));
  if (a === 0) return "0";
  if (a >= 1e-3) return String(Number(v.toPrecision(3)));
  return v.toExponential(2);
}

/** A level as a percentage of the format's largest value: "87.5%", "0.012%", "1.3e+04%". */
export function fmtPercent(level) {
  const p = level * 100;
  if (!Number.isFinite(p)) return "–";
  if (p >= 1e4) return `${p.toExponential(1)}%`;
  if (p >= 10) return `${p.toFixed(1)}%`;
  if (p >= 0.01) return `${Number(p.toPrecision(3))}%`;
  if (p === 0) return "0%";
  return `${p.toExponential(1)}%`;
}

function decadeLabel(d) {
  if (d === 0) return "1";
  if (d === -1) return "0.1";
  if (d === -2) return "0.01";
  return `1e${d}`;
}

function seriesKey(s) {
  return `${s.process}|${s.module}|${s.phase}`;
}

function seriesLabel(s) {
  return `${moduleName(s.module)} · ${s.phase}`;
}

/** Hide the panel (no ranges recorded, or nothing to plot). */
export function hideHeadroom(panel) {
  panel.hidden = true;
  document.body.classList.remove("has-headroom", "headroom-collapsed");
}

function showPanel(panel) {
  panel.hidden = false;
  document.body.classList.add("has-headroom");
}

export function renderHeadroomLoading(panel, body) {
  showPanel(panel);
  if (!body.querySelector(".hr-chart")) setChildren(body, el("div", { className: "muted", text: "headroom: loading…" }));
  else body.classList.add("loading");
}

export function renderHeadroomError(panel, body, message) {
  showPanel(panel);
  body.classList.remove("loading");
  setChildren(body, el("div", { className: "error", text: message }));
}

/** Whether anything in /api/headroom's answer is near a limit: a warning (overflow or underflow). */
export function headroomNearLimit(data) {
  return Boolean(data && (data.warnings || []).length);
}

/** Show the chart (open) or only the panel's head (collapsed). */
export function setHeadroomCollapsed(panel, body, toggle, collapsed) {
  panel.dataset.collapsed = collapsed ? "1" : "0";
  document.body.classList.toggle("headroom-collapsed", collapsed);
  body.hidden = collapsed;
  toggle.setAttribute("aria-expanded", String(!collapsed));
  toggle.textContent = collapsed ? "▸" : "▾";
  toggle.title = collapsed ? "show the chart" : "hide the chart";
}

/** Whether /api/headroom's answer has anything to show. */
export function headroomShown(data) {
  return Boolean(data && data.recorded && (data.series || []).length);
}

/**
 * The panel from /api/headroom's answer. `app.select(ref, {from: "link"})` selects a point's
 * execution. Returns the chart (its `redraw()` draws it again at the host's width).
 */
export function renderHeadroom(panel, body, subEl, data, app) {
  showPanel(panel);
  body.classList.remove("loading");
  const series = (data.series || []).slice(0, MAX_SERIES).map((s, i) => ({ ...s, color: COLORS[i % COLORS.length], key: seriesKey(s) }));
  const byKey = new Map(series.map((s) => [s.key, s]));
  const warnings = data.warnings || [];
  const formats = [...new Set(series.map((s) => s.format))];
  const top = Math.max(0, ...series.map((s) => s.peak).filter(Number.isFinite));
  subEl.textContent = `${data.target ? `against ${data.target}` : "each module's own format"} · ${warnings.length ? `${warnings.length} warning${warnings.length === 1 ? "" : "s"}` : "no warnings"} · highest ${fmtPercent(top)} of max`;

  const chartHost = el("div", { className: "hr-chart", attrs: { role: "img", "aria-label": "largest |x| per step over the format's largest value, log scale" } });
  const tip = el("div", { className: "hr-tip", hidden: true });
  const wrap = el("div", { className: "hr-wrap" }, chartHost, tip);

  const chart = { series, byKey, data, app, chartHost, tip, geom: null };
  chart.redraw = () => drawChart(chart);
  chart.selStep = app.detail && app.detail.ev ? app.detail.ev.step : null;
  chart.markStep = (step) => {
    if (chart.selStep === step) return;
    chart.selStep = step;
    drawChart(chart);
  };

  const legend = el(
    "div",
    { className: "hr-legend", attrs: { role: "list" } },
    ...series.map((s) =>
      el(
        "div",
        {
          className: "hr-lg",
          dataset: { key: s.key, module: s.module, phase: s.phase, process: String(s.process) },
          attrs: { tabindex: "0", role: "listitem" },
          title: `${seriesLabel(s)}: its largest |x| reached ${fmtValue(s.peak * s.max)}, ${fmtPercent(s.peak)} of ${s.format}'s ${fmtValue(s.max)}; Enter selects its peak`,
          on: {
            mouseenter: () => highlight(chart, s.key),
            mouseleave: () => highlight(chart, null),
            focus: () => highlight(chart, s.key),
            blur: () => highlight(chart, null),
            keydown: (e) => {
              if (e.key === "Enter" || e.key === " ") {
                e.preventDefault();
                const i = peakPoint(s);
                if (i !== null) selectPoint(chart, s, i);
              }
            },
          },
        },
        el("i", { className: "hr-swatch", dataset: { color: s.color } }),
        el("span", { className: "hr-lg-name", text: moduleName(s.module) }),
        el("span", { className: "hr-lg-meta", text: `${s.phase} · ${s.format}` }),
        el("span", { className: `hr-lg-peak${s.peak >= 1 ? " over" : s.peak >= 0.5 ? " near" : ""}`, text: fmtPercent(s.peak) }),
      ),
    ),
  );
  for (const sw of legend.querySelectorAll(".hr-swatch")) sw.style.background = sw.dataset.color; // CSSOM, not style=""

  const warnList = el(
    "div",
    { className: "hr-warnings" },
    warnings.length
      ? warnings.map((w, i) =>
          el(
            "div",
            {
              className: `hr-warn kind-${w.kind}`,
              dataset: { kind: w.kind, module: w.module, phase: w.phase, step: String(w.step), since: String(w.since_step ?? "") },
              attrs: { tabindex: "0", role: "button" },
              title: "Enter or click: select this module's execution at the warning's step",
              on: {
                click: () => selectWarning(chart, w),
                keydown: (e) => {
                  if (e.key === "Enter" || e.key === " ") {
                    e.preventDefault();
                    selectWarning(chart, w);
                  }
                },
                mouseenter: () => highlight(chart, seriesKey(w)),
                mouseleave: () => highlight(chart, null),
              },
            },
            el("span", { className: "hr-warn-n", text: String(i + 1) }),
            el("span", { className: "hr-warn-text", text: w.message }),
          ),
        )
      : el("div", { className: "hr-ok muted", text: `No headroom warnings${data.target ? ` against ${data.target}` : ""}.` }),
  );

  setChildren(body, wrap, legend, warnList);
  chart.warnings = warnings;
  chart.formats = formats;
  drawChart(chart);
  return chart;
}

/** The point of `s` with the largest level (null when none is positive). */
function peakPoint(s) {
  let best = null;
  for (let i = 0; i < s.level.length; i++) if (s.index[i] >= 0 && s.level[i] > 0 && (best === null || s.level[i] > s.level[best])) best = i;
  return best;
}

/** The point of `s` at the step nearest `step` that names an execution (index >= 0). */
function pointNear(s, step) {
  let best = null;
  for (let i = 0; i < s.steps.length; i++) {
    if (s.index[i] < 0) continue;
    if (best === null || Math.abs(s.steps[i] - step) < Math.abs(s.steps[best] - step)) best = i;
  }
  return best;
}

// How far past a point's execution to look for the module's own (list rows, then details).
const OWN_ROWS = 160;
const OWN_CANDIDATES = 24;

/**
 * The module's own execution at or after a point: the route's `index` is the process's first
 * kept execution at or after the point's step, whatever its module (for points from the range
 * history, i.e. most of a run), so a click on `head (Linear)` would open the step's first op.
 * Looks through the executions that follow for one of the series' process, phase and module
 * (a page of the list, then the details of the rows of that phase, a few at a time); null
 * when none is near.
 */
async function ownExecution(app, s, i) {
  const start = s.index[i];
  const step = s.steps[i];
  const first = await app.api.event(EXEC, start);
  const mine = (ev) => (ev.module_path || "") === s.module && (ev.phase || "") === s.phase && (ev.process ?? 0) === s.process;
  if (mine(first) && first.step >= step) return start;
  const page = await app.api.list(EXEC, start, start + OWN_ROWS);
  const rows = (page.rows || []).filter((r) => r.index > start && (r.process ?? 0) === s.process && r.phase === s.phase && r.step >= step);
  const cands = rows.slice(0, OWN_CANDIDATES);
  for (let b = 0; b < cands.length; b += 6) {
    const evs = await Promise.all(cands.slice(b, b + 6).map((r) => app.api.event(EXEC, r.index)));
    const hit = evs.find(mine);
    if (hit) return hit.index;
  }
  return null;
}

async function selectPoint(chart, s, i) {
  const index = s.index[i];
  const host = chart.chartHost;
  if (index === undefined || index < 0) {
    if (chart.app.toast) chart.app.toast(`step ${s.steps[i]}: no execution kept at or after it`, 3000);
    return;
  }
  const seq = (chart.clickSeq = (chart.clickSeq || 0) + 1);
  delete host.dataset.clickedIndex;
  host.dataset.clickedStep = String(s.steps[i]);
  host.dataset.clickedModule = s.module;
  host.dataset.clickedPhase = s.phase;
  let target = index;
  try {
    target = (await ownExecution(chart.app, s, i)) ?? index;
  } catch {
    target = index; // the step's first kept execution, as the route gave it
  }
  if (seq !== chart.clickSeq) return;
  chart.chartHost.dataset.clickedIndex = String(target);
  chart.app.select({ kind: EXEC, index: target }, { from: "link" });
}

function selectWarning(chart, w) {
  const s = chart.byKey.get(seriesKey(w));
  if (!s) {
    chart.app.toast && chart.app.toast(`${moduleName(w.module)} (${w.phase}) is not among the plotted modules`, 3000);
    return;
  }
  const i = pointNear(s, w.step);
  if (i !== null) selectPoint(chart, s, i);
}

function highlight(chart, key) {
  const g = chart.chartHost.querySelector("svg");
  if (!g) return;
  g.classList.toggle("hr-focus", key !== null);
  for (const p of g.querySelectorAll(".hr-line")) p.classList.toggle("hot", p.dataset.key === key);
}

/** The y range in decades: [lo, hi], lo <= -1, hi >= 0 (above 1 when a target format is exceeded). */
function decades(series) {
  let min = Infinity;
  let max = 0;
  for (const s of series)
    for (const v of s.level) {
      if (!(v > 0) || !Number.isFinite(v)) continue;
      if (v < min) min = v;
      if (v > max) max = v;
    }
  const lo = Number.isFinite(min) ? Math.min(-1, Math.max(LOWEST_DECADE, Math.floor(Math.log10(min)))) : -6;
  const hi = max > 1 ? Math.min(12, Math.ceil(Math.log10(max))) : 0;
  return [lo, hi];
}

function drawChart(chart) {
  const { series, data, chartHost } = chart;
  const width = Math.max(320, Math.floor(chartHost.clientWidth || 600));
  let minStep = Infinity;
  let maxStep = -Infinity;
  for (const s of series)
    for (const st of s.steps) {
      if (st < minStep) minStep = st;
      if (st > maxStep) maxStep = st;
    }
  if (!Number.isFinite(minStep)) minStep = maxStep = 0;
  if (maxStep === minStep) maxStep = minStep + 1;
  const [lo, hi] = decades(series);
  const x0 = PAD.left;
  const x1 = width - PAD.right;
  const y0 = PAD.top;
  const y1 = HEIGHT - PAD.bottom;
  const xOf = (step) => x0 + ((step - minStep) / (maxStep - minStep)) * (x1 - x0);
  const yOf = (level) => {
    const d = level > 0 ? Math.log10(level) : lo;
    const c = Math.max(lo, Math.min(hi, d));
    return y1 - ((c - lo) / (hi - lo)) * (y1 - y0);
  };
  chart.geom = { xOf, yOf, minStep, maxStep, x0, x1, y0, y1 };

  const root = svg("svg", { class: "hr-svg", width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, "data-lo": lo, "data-hi": hi });
  // Grid: one line per decade, labelled; the x axis' steps.
  const grid = svg("g", { class: "hr-grid" });
  for (let d = lo; d <= hi; d++) {
    const y = yOf(10 ** d);
    grid.appendChild(svg("line", { x1: x0, x2: x1, y1: y, y2: y, class: d === 0 ? "hr-gl zero" : "hr-gl" }));
    grid.appendChild(svgText(x0 - 5, y + 3.5, decadeLabel(d), "hr-ylab", "end"));
  }
  for (const st of stepTicks(minStep, maxStep, Math.max(2, Math.floor((x1 - x0) / 80)))) {
    const x = xOf(st);
    grid.appendChild(svg("line", { x1: x, x2: x, y1: y0, y2: y1, class: "hr-gl v" }));
    grid.appendChild(svgText(x, HEIGHT - 8, fmtInt(st), "hr-xlab", "middle"));
  }
  root.appendChild(grid);
  const yTitle = svgText(0, 0, "largest |x| / format max", "hr-axis", "middle");
  yTitle.setAttribute("transform", `translate(10 ${((y0 + y1) / 2).toFixed(1)}) rotate(-90)`);
  root.appendChild(yTitle);
  root.appendChild(svgText(x1, HEIGHT - 8, "step", "hr-axis", "end"));

  // Half of max (dashed) and overflow (level 1).
  const yHalf = yOf(0.5);
  root.appendChild(svg("line", { x1: x0, x2: x1, y1: yHalf, y2: yHalf, class: "hr-half" }));
  root.appendChild(svgText(x0 + 6, yHalf + 11, "half of max", "hr-half-label"));
  const yOver = yOf(1);
  root.appendChild(svg("line", { x1: x0, x2: x1, y1: yOver, y2: yOver, class: "hr-overflow" }));
  const fmtNames = chart.formats || [];
  const overText =
    fmtNames.length === 1 && series.length ? `overflow (${series[0].format} max ${fmtValue(series[0].max)})` : `overflow (each format's max: ${series.map((s) => `${s.format} ${fmtValue(s.max)}`).filter((v, i, a) => a.indexOf(v) === i).join(", ")})`;
  root.appendChild(svgText(x0 + 6, yOver - 4, overText, "hr-overflow-label"));

  // First Inf.
  if (data.before_step !== null && data.before_step !== undefined) {
    const x = xOf(Math.max(minStep, Math.min(maxStep, data.before_step)));
    root.appendChild(svg("line", { x1: x, x2: x, y1: y0, y2: y1, class: "hr-inf", "data-step": data.before_step }));
    root.appendChild(svgText(x - 4, y1 - 6, `first Inf · step ${fmtInt(data.before_step)}`, "hr-inf-label", "end"));
  }

  // One polyline per series, broken where a step has no finite non-zero |x|; drawn last-ranked first.
  const lines = svg("g", { class: "hr-lines" });
  for (const s of [...series].reverse()) {
    const runs = [];
    let cur = [];
    for (let i = 0; i < s.steps.length; i++) {
      const v = s.level[i];
      if (v > 0 && Number.isFinite(v)) cur.push(`${xOf(s.steps[i]).toFixed(1)},${yOf(v).toFixed(1)}`);
      else if (cur.length) {
        runs.push(cur);
        cur = [];
      }
    }
    if (cur.length) runs.push(cur);
    plotRuns(
      lines,
      runs,
      { r: 2.5, fill: s.color, class: "hr-dot", "data-key": s.key, "data-module": s.module, "data-phase": s.phase },
      { stroke: s.color, class: "hr-line", "data-key": s.key, "data-module": s.module, "data-phase": s.phase, "data-process": s.process },
    );
  }
  root.appendChild(lines);

  // Each warning where it began (its since_step), on its module's line.
  const marks = svg("g", { class: "hr-marks" });
  (chart.warnings || []).forEach((w, n) => {
    const s = chart.byKey.get(seriesKey(w));
    const step = w.since_step ?? w.step;
    if (!s || step === null || step === undefined) return;
    let i = 0;
    while (i < s.steps.length - 1 && s.steps[i] < step) i++;
    const v = s.level[i] > 0 ? s.level[i] : null;
    const x = xOf(step);
    const y = v === null ? y1 : yOf(v);
    const m = svg("g", { class: "hr-warn-mark", "data-module": w.module, "data-phase": w.phase, "data-step": step });
    m.appendChild(svg("path", { d: `M${x},${y - 7} l5,8 h-10 z`, fill: s.color, class: "hr-tri" }));
    m.appendChild(svgText(x, y - 9, String(n + 1), "hr-mark-n", "middle"));
    const t = svg("title");
    t.textContent = `${n + 1}: ${w.message}`;
    m.appendChild(t);
    marks.appendChild(m);
  });
  root.appendChild(marks);

  // The selected execution's step (the app's selection), when it is in range.
  if (chart.selStep !== null && chart.selStep !== undefined && chart.selStep >= minStep && chart.selStep <= maxStep) {
    const x = xOf(chart.selStep);
    root.appendChild(svg("line", { x1: x, x2: x, y1: y0, y2: y1, class: "hr-sel", "data-step": chart.selStep }));
  }

  // The hover point and the plot's hit area.
  const cursor = svg("circle", { r: 4, class: "hr-cursor", cx: -10, cy: -10 });
  root.appendChild(cursor);
  root.addEventListener("mousemove", (e) => hover(chart, e, cursor));
  root.addEventListener("mouseleave", () => {
    chart.tip.hidden = true;
    cursor.setAttribute("cx", "-10");
  });
  root.addEventListener("click", (e) => {
    const hit = nearest(chart, e);
    if (hit) selectPoint(chart, hit.s, hit.i);
  });
  setChildren(chartHost, root);
  highlight(chart, null);
}

/** About `n` round step ticks between a and b. */
function stepTicks(a, b, n) {
  const span = b - a;
  const raw = span / n;
  const mag = 10 ** Math.floor(Math.log10(raw || 1));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((m) => m >= raw) || mag * 10;
  const out = [];
  for (let t = Math.ceil(a / step) * step; t <= b; t += step) out.push(t);
  return out;
}

/** The series point nearest the pointer (within HIT_PX), preferring the line under it. */
function nearest(chart, e) {
  const g = chart.geom;
  const root = chart.chartHost.querySelector("svg");
  if (!g || !root) return null;
  const r = root.getBoundingClientRect();
  const px = e.clientX - r.left;
  const py = e.clientY - r.top;
  const targetKey = e.target && e.target.dataset ? e.target.dataset.key : undefined;
  let best = null;
  for (const s of chart.series) {
    if (!s.steps.length) continue;
    // The points nearest in x (steps are ascending): a binary search, then a few either side.
    let a = 0;
    let b = s.steps.length - 1;
    while (a < b) {
      const m = (a + b) >> 1;
      if (g.xOf(s.steps[m]) < px) a = m + 1;
      else b = m;
    }
    for (let i = Math.max(0, a - 3); i <= Math.min(s.steps.length - 1, a + 3); i++) {
      const v = s.level[i];
      if (!(v > 0) || !Number.isFinite(v)) continue;
      const dx = g.xOf(s.steps[i]) - px;
      const dy = g.yOf(v) - py;
      let d = Math.hypot(dx, dy);
      if (targetKey === s.key) d -= HIT_PX; // the line under the cursor wins
      if (best === null || d < best.d) best = { s, i, d };
    }
  }
  return best && best.d <= HIT_PX ? best : null;
}

function hover(chart, e, cursor) {
  const hit = nearest(chart, e);
  const tip = chart.tip;
  if (!hit) {
    tip.hidden = true;
    cursor.setAttribute("cx", "-10");
    return;
  }
  const { s, i } = hit;
  const level = s.level[i];
  const x = chart.geom.xOf(s.steps[i]);
  const y = chart.geom.yOf(level);
  cursor.setAttribute("cx", x.toFixed(1));
  cursor.setAttribute("cy", y.toFixed(1));
  cursor.setAttribute("stroke", s.color);
  setChildren(
    tip,
    el("div", { className: "hr-tip-mod", text: `${moduleName(s.module)} · ${s.phase}` }),
    el("div", { text: `step ${fmtInt(s.steps[i])} · |x| ${fmtValue(level * s.max)} · ${fmtPercent(level)} of ${s.format} max` }),
    el("div", { className: "muted", text: s.index[i] >= 0 ? "click: its execution at this step or the next kept one" : "no execution kept at or after this step" }),
  );
  tip.hidden = false;
  const w = chart.chartHost.clientWidth;
  const left = x + 12 + 260 > w ? Math.max(0, x - 12 - 260) : x + 12;
  tip.style.left = `${left}px`; // CSSOM: the CSP forbids style=""
  tip.style.top = `${Math.max(0, y - 10)}px`;
}
