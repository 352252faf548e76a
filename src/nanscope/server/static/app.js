// nanscope's web GUI: one page over the JSON API (src/nanscope/server/http_api.md).
// Plain ES modules, no build step, nothing loaded from elsewhere. Dump-derived text is only
// ever set with textContent / createElement (util.el), never parsed as HTML.
//
// Stable test hooks
// -----------------
//   Sections: #alerts (with #rootcause and #alert-lists), #timeline (canvas .tl-canvas in
//   .tl-wrap, which carries data-begin, data-span, data-total, data-selected = the selected
//   list position, data-state = loading / empty / ready / error), #exec-detail (data-kind,
//   data-index of the shown event; #detail-op the op type), #graph-structure (.gnode
//   buttons with data-kind/data-index), #graph-execs (tabs #tab-executions / #tab-traces,
//   checkbox #only-nonfinite, rows .vrow with
//   data-index = event index and data-pos = list position; .vrow.selected; .vrow.nan /
//   .vrow.inf for Inf/NaN rows; #list-foot-text "N executions"), #source
//   (data-path, data-line; lines .ln[data-line], the marked one .ln.marked; picker
//   #source-file: every recorded file, option values "<process>:<file_index>"), #stack
//   (.frame buttons with data-file, data-line; .frame.user, .frame.lib, .st-fold toggles),
//   #run-select, #process-select, #jump, #live, #problems,
//   #help (the ? overlay). Alert rows: .arow[data-kind][data-index] (plus data-category,
//   data-op-type or data-step; a step's row selects its first alert). With a process chosen
//   the counts are that process's (.a-scope names it) and the root cause, always of the whole
//   run, carries .rc-scope "whole run". Links to events: a.evlink[data-kind][data-index].
//   The root cause: #rootcause (.rc-headline, a.evlink links; .rc-rank: how the origin's rank
//   was told, for several processes; data-verdict = harmful / incomplete / absorbed / clean,
//   .ok only for clean, .incomplete with the damage panel .damage > .dmg-list >
//   li.dmg-item[data-file][data-offset] first). Incomplete runs: #run-select options carry
//   data-incomplete="1" and "⚠ incomplete"; #alert-total says "none read" (.partial). Ranks (several processes with Inf/NaN): #ranks (hidden
//   otherwise; <body class="has-ranks"> while shown), #ranks-sub; table .rk-table with
//   tr.rk-row[data-process][data-role][data-kind][data-index] (.rk-role, .rk-first, .rk-time,
//   .rk-clock); side by side .rk-side > .rk-col[data-process] (one per rank), rows
//   .rk-op[data-kind][data-index] (.nan / .inf as in the lists; .coll the rank's copy of the
//   spreading collective, on one line across columns; .rk-pad blank rows that align them). Timeline buttons: #tl-zoom-in,
//   #tl-zoom-out, #tl-left, #tl-right, #tl-fit, #tl-center. Alert navigation: #prev-alert,
//   #next-alert, #alert-pos ("k / N").
//   Headroom (the dump records value ranges): #headroom (hidden otherwise; <body
//   class="has-headroom"> while shown; data-collapsed="1", <body class="headroom-collapsed">
//   and #headroom-toggle[aria-expanded="false"] while only its head shows: collapsed when
//   nothing is near a limit, i.e. no warning, until the toggle is used), #headroom-sub,
//   #headroom-format (the format measured against; "" = each value's own), #headroom-body.
//   The chart .hr-chart (data-clicked-step, data-clicked-index, data-clicked-module once a
//   point was clicked) holds svg.hr-svg (data-lo, data-hi: its decades) with
//   polyline.hr-line[data-key][data-module][data-phase]
//   (one per module and phase; circle.hr-dot for a single point), line.hr-overflow and
//   text.hr-overflow-label, line.hr-half, line.hr-inf[data-step] (first Inf), g.hr-warn-mark
//   [data-module][data-phase][data-step] (where each warning began); tooltip .hr-tip. Legend
//   .hr-lg[data-module][data-phase] (focusable; .hr-lg-name, .hr-lg-peak); warnings
//   .hr-warn[data-module][data-phase][data-step] (.hr-warn-text: the message; Enter selects)
//   or .hr-ok when there are none. line.hr-sel[data-step]: the selected event's step.
//   The sentinel view (a logdir with a sentinel's history, sentinel.js): #sentinel-view (in
//   place of #layout, <body class="view-sentinel">), opened by the #run-select option with
//   data-sentinel (value "sentinel:<history>") or "#sentinel=<history>"; a URL naming no run
//   opens on it when the logdir has a history. a.sn-replay opens the replay's run on its root
//   cause; in that run #sentinel-back leads back to the history.
//   The diff view (diff.js): #diff-view (in place of #layout, <body class="view-diff">),
//   opened by #compare-select (#compare-field, shown with two runs or more: the run to compare
//   the one in view with) or "#run=A&against=B"; #diff-close goes back to the run.
//   <body data-pending="N"> counts API requests in flight; data-ready="1" once the first
//   run's alerts are shown; data-selected="e401" / "t12" once the selection's detail is shown.
//   The first view: a URL naming no selection opens on the root cause (the cause, else the
//   first Inf/NaN, of a harmful verdict) once the analysis is in, unless something was
//   selected, clicked, scrolled by wheel or typed meanwhile; "#sel=e401" without run= opens that event in the first run. Until
//   the run is known the timeline (.tl-wrap[data-state="loading"]) and the list say
//   "loading…", never that nothing was recorded.
//
// This module: the App (state, runs and polling, the lists and the timeline, alerts,
// selection, source). Elsewhere: the URL's hash in urlstate.js (reloading restores the view;
// editing the hash navigates, through App.onHashChange), the keyboard and the ? overlay in
// keys.js, the lists' rows and header in rows.js.
//
// Positions: a filtered list (a process, only Inf/NaN, an op type) is not indexed by event
// index; where an event sits in it comes from one `position_of` probe (Api.positionOf), so
// scrolling to the selection, "alert k / N" and n/N cost a request each, not a search.
//
// Styles: the CSP (the server's header and the page's <meta>) has style-src 'self': no
// inline style="" in HTML or through setAttribute; set styles through the CSSOM only.

import { Api, ApiError } from "./api.js";
import { el, setChildren, fmtInt, fmtCompact, clamp, kindLetter, kindFromLetter, debounce } from "./util.js";
import { VList } from "./vlist.js";
import { Timeline } from "./timeline.js";
import { leadOpTypesWithCause, renderAlerts, renderRootCause, renderRootCauseError } from "./alerts.js";
import { renderDetail, renderDetailError } from "./detail.js";
import { RANKS_WINDOW, renderRanks, renderRanksLoading, renderRanksError, hideRanks, markRanksSelection } from "./ranks.js";
import { renderHeadroom, renderHeadroomLoading, renderHeadroomError, hideHeadroom, headroomShown, headroomNearLimit, setHeadroomCollapsed } from "./headroom.js";
import { renderDiff, renderDiffLoading, renderDiffError } from "./diff.js";
import { renderSentinel, renderSentinelLoading, renderSentinelError } from "./sentinel.js";
import { renderTraceGraph, renderExecGraph, renderGraphMessage } from "./graph.js";
import { SourceView } from "./source.js";
import { renderStack } from "./stack.js";
import { renderListHeader, renderListRow } from "./rows.js";
import { UrlState } from "./urlstate.js";
import { bindKeys } from "./keys.js";

const $ = (sel) => document.querySelector(sel);
const EXEC = "execution";
const TRACE = "graph_execution_trace";
const POLL_MS = 2000;

class App {
  constructor() {
    this.api = new Api();
    this.state = { run: null, process: null, sel: null, tab: null, nf: false, op: "", src: null, focus: "list", sentinel: null, sv: null, trip: null, against: null };
    this.runs = [];
    this.sentinels = []; // /api/sentinels: the sentinel histories under the logdir
    this.sentinelData = null;
    this.sentinelSeq = 0;
    this.logdir = "";
    this.runInfo = null;
    this.alerts = null;
    this.analysis = null;
    this.staleAnalysis = null; // an analysis being asked again after the dump changed
    this.detail = null; // {kind, index, ev}
    this.selSeq = 0;
    this.placeSeq = 0;
    this.listPos = null;
    this.booted = false;
    this.lastChange = 0;
    this.pollOk = false;
    this.alertSeq = 0;

    this.timeline = new Timeline($("#tl-host"), {
      api: this.api,
      onSelect: (pos, row) => this.selectTimelinePos(pos, row),
      onView: () => this.updateTimelineRange(),
    });
    this.vlist = new VList($("#list-host"), {
      api: this.api,
      rowHeight: 24,
      renderRow: (row) => this.renderRow(row),
      onClick: (row, pos) => {
        this.setFocus("list");
        this.select({ kind: this.listKind, index: row.index }, { from: "list", pos });
      },
      emptyText: "no events",
    });
    this.source = new SourceView($("#source-body"), $("#source-path"), $("#source-file"), this);
    this.updateAlertPosSoon = debounce((ref) => this.updateAlertPos(ref), 200);
    this.url = new UrlState((h) => this.onHashChange(h));
    this.wire();
  }

  // ---- state helpers -------------------------------------------------------------------

  get listKind() {
    return this.state.tab === "traces" ? TRACE : EXEC;
  }
  get listFilter() {
    return { process: this.state.process, nonfinite: this.state.nf, op_type: this.state.op || null };
  }
  get processFilter() {
    return { process: this.state.process };
  }
  /** The alerts of the process in view: the list behind n/N and "alert k / N". */
  get alertFilter() {
    return { process: this.state.process, nonfinite: true };
  }
  /** Whether the list in view shows exactly the alerts (so alert positions are list positions). */
  get listIsAlerts() {
    return this.state.nf && !this.state.op;
  }
  processLabel(index) {
    if (!this.runInfo || !this.runInfo.processes || this.runInfo.processes.length < 2) return "";
    const p = this.runInfo.processes.find((x) => x.index === index);
    return p ? p.label : "";
  }

  // ---- URL -----------------------------------------------------------------------------

  writeHash() {
    if (!this.booted) return;
    this.url.write(this.state);
  }

  /** The user edited the URL's hash: apply the view `h` it names (urlstate.js parsed it). */
  async onHashChange(h) {
    if (h.sentinel !== null) {
      await this.showSentinel(h.sentinel, { mode: h.sv, trip: h.trip });
      return;
    }
    if (this.state.sentinel !== null || h.against !== this.state.against) {
      this.hideSentinel();
      Object.assign(this.state, h);
      await this.loadRun();
      return;
    }
    if (h.run !== undefined && h.run !== this.state.run) {
      Object.assign(this.state, h);
      await this.loadRun();
      return;
    }
    const listChanged = h.process !== this.state.process || h.nf !== this.state.nf || h.op !== this.state.op || (h.tab && h.tab !== this.state.tab);
    const processChanged = h.process !== this.state.process;
    this.state.process = h.process;
    this.state.nf = h.nf;
    this.state.op = h.op;
    if (h.tab) this.state.tab = h.tab;
    if (listChanged) await this.setupLists();
    if (processChanged) {
      this.loadAlerts();
      this.loadSourceFiles();
    }
    if (h.sel) await this.select(h.sel, { from: "url", src: h.src });
    else if (h.src) this.openSource(h.src);
  }

  // ---- wiring --------------------------------------------------------------------------

  wire() {
    $("#run-select").addEventListener("change", (e) => {
      const opt = e.target.selectedOptions[0];
      if (opt && opt.dataset.sentinel !== undefined) {
        this.showSentinel(opt.dataset.sentinel, {});
        return;
      }
      this.hideSentinel();
      Object.assign(this.state, { against: null, run: e.target.value, process: null, sel: null, src: null, tab: null, nf: false, op: "" });
      this.loadRun();
    });
    $("#compare-select").addEventListener("change", (e) => {
      this.state.against = e.target.value || null;
      this.loadRun();
    });
    $("#diff-close").addEventListener("click", () => {
      this.state.against = null;
      this.loadRun();
    });
    $("#sentinel-back").addEventListener("click", () => {
      const b = $("#sentinel-back");
      this.showSentinel(b.dataset.history, { mode: "lead", trip: Number(b.dataset.step) });
    });
    const redrawSentinel = debounce(() => {
      if (this.sentinelChart && !$("#sentinel-view").hidden) this.sentinelChart.redraw();
    }, 150);
    new ResizeObserver(redrawSentinel).observe($("#sentinel-view"));
    $("#headroom-format").addEventListener("change", () => {
      if (this.analysis) this.loadHeadroom(this.analysis);
    });
    // Open or collapse the chart; the choice stands for the run (over formats and refreshes).
    $("#headroom-toggle").addEventListener("click", () => {
      this.headroomOpen = $("#headroom").dataset.collapsed === "1";
      this.collapseHeadroom(!this.headroomOpen);
    });
    // The headroom chart is drawn at its panel's width: again when that changes.
    const redrawHeadroom = debounce(() => {
      if (this.headroomChart && !$("#headroom").hidden) this.headroomChart.redraw();
    }, 150);
    new ResizeObserver(redrawHeadroom).observe($("#headroom"));
    $("#process-select").addEventListener("change", (e) => {
      this.state.process = e.target.value === "" ? null : Number(e.target.value);
      this.setupLists().then(() => {
        if (this.state.sel) this.placeSelection(this.state.sel, {});
      });
      this.loadAlerts();
      this.loadSourceFiles();
      this.writeHash();
    });
    for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => this.setTab(b.dataset.tab));
    $("#only-nonfinite").addEventListener("change", (e) => {
      this.state.nf = e.target.checked;
      this.setupLists();
      this.writeHash();
    });
    $("#tl-left").addEventListener("click", () => this.timeline.pan(-0.8));
    $("#tl-right").addEventListener("click", () => this.timeline.pan(0.8));
    $("#tl-zoom-in").addEventListener("click", () => this.timeline.zoomButton(0.5));
    $("#tl-zoom-out").addEventListener("click", () => this.timeline.zoomButton(2));
    $("#tl-fit").addEventListener("click", () => this.timeline.fit());
    $("#tl-center").addEventListener("click", () => this.timeline.centerOnSelection());
    $("#next-alert").addEventListener("click", () => this.nextAlert(1));
    $("#prev-alert").addEventListener("click", () => this.nextAlert(-1));
    $("#problems").addEventListener("click", () => {
      const pop = $("#problems-pop");
      pop.hidden = !pop.hidden;
    });
    // The user took the view in hand before the analysis came in: the view stays theirs.
    for (const type of ["pointerdown", "wheel", "keydown"]) document.addEventListener(type, () => (this.pickRootCause = false), { capture: true, passive: true });
    $("#timeline").addEventListener("pointerdown", () => this.setFocus("timeline"));
    $("#graph-execs").addEventListener("pointerdown", () => this.setFocus("list"));
    bindKeys(this);
  }

  setFocus(which) {
    this.state.focus = which;
    $("#timeline").classList.toggle("kbd-focus", which === "timeline");
    $("#graph-execs").classList.toggle("kbd-focus", which === "list");
  }

  toast(message, ms = 2500) {
    const t = $("#toast");
    t.textContent = message;
    t.hidden = false;
    clearTimeout(this.toastTimer);
    this.toastTimer = setTimeout(() => (t.hidden = true), ms);
  }

  // ---- runs and polling -----------------------------------------------------------------

  async boot() {
    const h = this.url.read();
    Object.assign(this.state, h);
    // A URL naming nothing opens on the sentinel's history, where the logdir has one.
    this.openOnSentinel = h.run === undefined && !h.sel && !h.src;
    this.setFocus("list");
    try {
      const [body, sentinels] = await Promise.all([this.api.runs(), this.api.sentinels()]);
      this.pollOk = true;
      this.sentinels = sentinels;
      this.setRuns(body);
    } catch (e) {
      this.showBanner(e.message, true);
      this.setLive();
      setTimeout(() => this.boot(), POLL_MS);
      return;
    }
    this.setLive();
    await this.loadRun();
    this.pollTimer = setInterval(() => this.poll(), POLL_MS);
  }

  setRuns(body) {
    this.logdir = body.logdir || "";
    this.runs = body.runs || [];
    const select = $("#run-select");
    const current = select.value;
    // Rebuild only when the runs change (an open dropdown would close otherwise).
    const sig = JSON.stringify([this.runs.map((r) => [r.run, r.error, r.framework, r.tensor_debug_mode, r.incomplete, r.num_incomplete]), this.sentinels]);
    if (sig === this.runsSig) return;
    this.runsSig = sig;
    // An incomplete run (events missing: no all-clear for it) is marked in the list.
    const label = (r) => `${r.run === "." ? "(logdir)" : r.run}${r.incomplete ? " ⚠ incomplete" : ""}`;
    const title = (r) => (r.error ? r.error : `${r.framework || ""} ${r.tensor_debug_mode || ""}`) + (r.incomplete && !r.error ? ` · incomplete: ${r.num_incomplete} problem${r.num_incomplete === 1 ? "" : "s"}` : "");
    const options = this.runs.map((r) => el("option", { value: r.run, text: label(r), title: title(r), dataset: { incomplete: r.incomplete ? "1" : "0" } }));
    // The sentinel histories: a view of their own (sentinel.js), listed after the runs.
    const histories = this.sentinels.map((s) => el("option", { value: `sentinel:${s.history}`, text: `sentinel history${s.history === "." ? "" : ` (${s.history})`}`, title: `the sentinel's per-step history in ${s.path}`, dataset: { sentinel: s.history } }));
    setChildren(select, ...(histories.length ? [el("optgroup", { label: "runs" }, options), el("optgroup", { label: "sentinel" }, histories)] : options));
    if (this.state.sentinel !== null) select.value = `sentinel:${this.state.sentinel}`;
    else select.value = this.state.run !== null && this.runs.some((r) => r.run === this.state.run) ? this.state.run : current;
    // One run in the logdir itself: no list, unless it must say the run is incomplete.
    $("#run-select").closest(".field").hidden = !histories.length && this.runs.length < 2 && this.runs.length > 0 && this.runs[0].run === "." && !this.runs[0].incomplete;
    this.updateSentinelBack();
    this.fillCompare();
  }

  /** #compare-select: the other runs, to compare the one in view with (the diff view). */
  fillCompare() {
    const select = $("#compare-select");
    const others = this.runs.filter((r) => r.run !== this.state.run && !r.error);
    $("#compare-field").hidden = this.state.sentinel !== null || !others.length || this.state.run === null;
    setChildren(select, el("option", { value: "", text: "—" }), ...others.map((r) => el("option", { value: r.run, text: r.run === "." ? "(logdir)" : r.run })));
    select.value = this.state.against && others.some((r) => r.run === this.state.against) ? this.state.against : "";
  }

  showBanner(message, isError = false) {
    const b = $("#banner");
    if (!message) {
      b.hidden = true;
      return;
    }
    b.hidden = false;
    b.classList.toggle("error", isError);
    setChildren(b, message);
  }

  async loadRun() {
    const openSentinel = this.openOnSentinel && this.sentinels.length;
    this.openOnSentinel = false;
    if (this.state.sentinel !== null || openSentinel || (!this.runs.length && this.sentinels.length)) {
      const name = this.state.sentinel ?? this.sentinels[0].history;
      await this.showSentinel(name, { mode: this.state.sv, trip: this.state.trip });
      return;
    }
    document.body.classList.toggle("no-runs", !this.runs.length);
    if (!this.runs.length) {
      this.runInfo = null;
      setChildren($("#rootcause"), el("div", { className: "muted", text: "no dump yet" }));
      this.showBanner(
        el(
          "span",
          {},
          `No nanscope dump in ${this.logdir || "the logdir"} yet. Record one with `,
          el("code", { text: 'nanscope.enable_dump_debug_info(logdir, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1)' }),
          " or run ",
          el("code", { text: "nanscope demo --logdir LOGDIR" }),
          ". This page checks again every 2 s.",
        ),
      );
      this.markReady();
      return;
    }
    if (this.state.run === null) {
      // The URL names no run (e.g. "#sel=e401"): the first readable one, with the rest of the view kept.
      this.state.run = (this.runs.find((r) => !r.error) || this.runs[0]).run;
    } else if (!this.runs.some((r) => r.run === this.state.run)) {
      const good = this.runs.find((r) => !r.error) || this.runs[0];
      this.toast(`no run "${this.state.run}" in ${this.logdir}; showing "${good.run}"`, 5000);
      Object.assign(this.state, { run: good.run, sel: null, src: null, tab: null, process: null, nf: false, op: "" });
    }
    $("#run-select").value = this.state.run;
    this.updateSentinelBack();
    this.fillCompare();
    if (this.state.against) {
      await this.showDiff();
      return;
    }
    this.hideDiff();
    const info = this.runs.find((r) => r.run === this.state.run);
    this.runInfo = info;
    this.api.setRun(info.run, info.generation);
    this.alerts = null;
    this.analysis = null;
    this.staleAnalysis = null;
    this.detail = null;
    ++this.selSeq; // a selection still loading is of the run before (its root cause, say)
    this.listPos = null;
    hideRanks($("#ranks"));
    hideHeadroom($("#headroom"));
    this.headroomChart = null;
    this.headroomOpen = null; // open when something is near a limit, until the user chooses
    if (info.error) {
      this.showBanner(`This run cannot be read: ${info.error}`, true);
      this.clearPanels();
      this.markReady();
      return;
    }
    this.showBanner(null);
    // The first view: a URL that names no selection opens on the root cause once it is known.
    this.pickRootCause = !this.state.sel && !this.state.src;
    this.updateMeta();
    this.fillProcesses();
    if (!this.state.tab) this.state.tab = info.num_graph_execution_traces > 0 ? "traces" : "executions";
    this.booted = true;
    await this.setupLists();
    this.writeHash();
    const alertsDone = this.loadAlerts();
    this.loadSourceFiles();
    if (this.state.sel) this.select(this.state.sel, { from: "url", src: this.state.src });
    else if (this.state.src) this.openSource(this.state.src);
    else this.clearSelectionPanels();
    await alertsDone;
  }

  clearPanels() {
    setChildren($("#alert-lists"));
    $("#alert-total").textContent = "";
    setChildren($("#rootcause"));
    this.timeline.setSource(EXEC, null, 0);
    this.vlist.setSource(EXEC, {}, 0);
    this.source.setFiles([]);
    this.clearSelectionPanels();
  }

  clearSelectionPanels() {
    const d = $("#exec-detail");
    delete d.dataset.kind;
    delete d.dataset.index;
    $("#detail-title").textContent = "Event";
    $("#detail-sub").textContent = "";
    this.showDetailHint();
    renderGraphMessage($("#graph-body"), $("#graph-sub"), "Inputs and consumers of the selected op.");
    $("#stack-sub").textContent = "";
    setChildren($("#stack-body"), el("div", { className: "empty-state", text: "Innermost frame first; click a frame to open it." }));
    if (!this.state.src) this.source.clear("The selected event's source line shows here.");
    this.source.setStack(null);
  }

  /** The detail pane with nothing selected: what will show there, or how to select. */
  showDetailHint() {
    const hint = this.pickRootCause ? "Finding the root cause to show it here…" : "Select an alert, a timeline event or a list row (r: the root cause, n: the next alert, ?: keys).";
    setChildren($("#detail-body"), el("div", { className: "empty-state", text: hint }));
  }

  markReady() {
    document.body.dataset.ready = "1";
  }

  updateMeta() {
    const r = this.runInfo;
    const parts = [r.framework, r.tensor_debug_mode, `${fmtInt(r.num_executions)} executions`];
    if (r.num_graph_execution_traces) parts.push(`${fmtInt(r.num_graph_execution_traces)} graph traces`);
    $("#run-meta").textContent = parts.filter(Boolean).join(" · ");
    $("#run-meta").title = `${this.logdir}${r.run !== "." ? "/" + r.run : ""}  run_id ${r.run_id || ""}`;
    const problems = r.problems || [];
    const btn = $("#problems");
    btn.hidden = problems.length === 0;
    btn.textContent = `⚠ ${problems.length} problem${problems.length === 1 ? "" : "s"}`;
    btn.classList.toggle("warn", problems.length > 0);
    setChildren(
      $("#problems-pop"),
      el("h3", { text: "Problems found in the dump" }),
      el("ul", {}, problems.map((p) => el("li", { className: `sev-${p.severity}` }, el("b", { text: p.severity + ": " }), p.message))),
    );
    $("#tab-executions .count").textContent = `(${fmtCompact(r.num_executions)})`;
    $("#tab-executions").title = `${fmtInt(r.num_executions)} executions (eager ops and graph calls)`;
    $("#tab-traces .count").textContent = `(${fmtCompact(r.num_graph_execution_traces)})`;
    $("#tab-traces").title = `${fmtInt(r.num_graph_execution_traces)} graph execution traces (tensors inside graphs)`;
  }

  fillProcesses() {
    const procs = this.runInfo.processes || [];
    const select = $("#process-select");
    setChildren(select, el("option", { value: "", text: procs.length > 1 ? `All (${procs.length})` : "All" }), ...procs.map((p) => el("option", { value: String(p.index), text: p.label || p.name, title: `${p.name} ${p.host || ""}` })));
    if (this.state.process !== null && !procs.some((p) => p.index === this.state.process)) this.state.process = null;
    select.value = this.state.process === null ? "" : String(this.state.process);
    select.closest(".field").classList.toggle("dim", procs.length < 2);
  }

  setLive() {
    const live = $("#live");
    const text = live.querySelector(".live-text");
    live.classList.remove("on", "idle", "off");
    if (!this.pollOk) {
      live.classList.add("off");
      text.textContent = "offline";
    } else if (Date.now() - this.lastChange < 10000) {
      live.classList.add("on");
      text.textContent = "live";
    } else {
      live.classList.add("idle");
      text.textContent = "up to date";
    }
    live.title = `polling /api/runs every 2 s; last check ${new Date().toLocaleTimeString()}`;
  }

  async poll() {
    let body;
    try {
      [body, this.sentinels] = await Promise.all([this.api.runs(), this.api.sentinels()]);
      this.pollOk = true;
    } catch {
      this.pollOk = false;
      this.setLive();
      return;
    }
    const before = this.runInfo;
    const hadRuns = this.runs.length;
    this.setRuns(body);
    if (this.state.sentinel !== null) {
      await this.refreshSentinel();
      this.setLive();
      return;
    }
    if (!hadRuns && this.runs.length) {
      this.lastChange = Date.now();
      await this.loadRun();
      this.setLive();
      return;
    }
    const info = this.runs.find((r) => r.run === this.state.run);
    if (!info || !before) {
      this.setLive();
      return;
    }
    const genChanged = info.generation !== before.generation;
    const grew = info.num_executions !== before.num_executions || info.num_graph_execution_traces !== before.num_graph_execution_traces;
    const errChanged = info.error !== before.error;
    this.runInfo = info;
    if (errChanged) {
      this.lastChange = Date.now();
      await this.loadRun();
    } else if (genChanged || grew) {
      this.lastChange = Date.now();
      if (genChanged) this.api.setRun(info.run, info.generation);
      else this.api.dropTailPages();
      this.updateMeta();
      await this.refreshTotals();
      this.dropStaleVerdict();
      this.loadAlerts();
      this.loadSourceFiles();
      if (genChanged && this.state.sel) this.select(this.state.sel, { from: "refresh", src: this.state.src });
    } else if (JSON.stringify(info.problems) !== JSON.stringify(before.problems) || info.incomplete !== before.incomplete || info.num_incomplete !== before.num_incomplete) {
      this.updateMeta();
      // Damage found since the analysis: its verdict is asked again (never a stale all-clear).
      this.dropStaleVerdict();
      this.loadAlerts();
    }
    this.setLive();
  }

  // ---- the diff view ----------------------------------------------------------------------

  /** Compare the run in view (A) with state.against (B), in place of the run's panels. */
  async showDiff() {
    const run = this.state.run;
    const against = this.state.against;
    document.body.classList.add("view-diff");
    const view = $("#diff-view");
    view.hidden = false;
    this.showBanner(null);
    this.booted = true;
    this.writeHash();
    const seq = (this.diffSeq = (this.diffSeq || 0) + 1);
    renderDiffLoading(view, $("#diff-body"));
    $("#diff-sub").textContent = `${run} against ${against}`;
    try {
      const data = await this.api.diff(run, against);
      if (seq !== this.diffSeq) return;
      renderDiff(view, $("#diff-body"), $("#diff-sub"), data, this);
    } catch (e) {
      if (seq === this.diffSeq) renderDiffError(view, $("#diff-body"), e.message);
    }
    this.markReady();
  }

  hideDiff() {
    this.diffSeq = (this.diffSeq || 0) + 1;
    $("#diff-view").hidden = true;
    document.body.classList.remove("view-diff");
  }

  /** Open a run at an event (from the diff view): its panels, the event selected. */
  async openEvent(run, ref) {
    this.hideDiff();
    Object.assign(this.state, { run, against: null, process: null, sel: ref, src: null, tab: null, nf: false, op: "" });
    await this.loadRun();
  }

  // ---- the sentinel view -----------------------------------------------------------------

  /**
   * Show a sentinel's history in place of the run's panels. opts.mode: "lead" (a trip's
   * lead-up; opts.trip its step) or "whole"; the history is fetched again when it is another
   * one or opts.refetch.
   */
  async showSentinel(name, opts = {}) {
    Object.assign(this.state, { sentinel: name, sv: opts.mode || null, trip: opts.trip ?? null });
    document.body.classList.add("view-sentinel");
    document.body.classList.remove("no-runs");
    this.hideDiff();
    this.state.against = null;
    $("#compare-field").hidden = true;
    const view = $("#sentinel-view");
    view.hidden = false;
    $("#sentinel-back").hidden = true;
    this.showBanner(null);
    const select = $("#run-select");
    select.value = `sentinel:${name}`;
    this.booted = true;
    this.writeHash();
    const seq = ++this.sentinelSeq;
    let data = this.sentinelData;
    if (!data || data.history !== name || opts.refetch) {
      renderSentinelLoading(view, $("#sn-body"));
      try {
        data = await this.api.sentinel(name);
      } catch (e) {
        if (seq === this.sentinelSeq) {
          renderSentinelError(view, $("#sn-body"), e.message);
          this.markReady();
        }
        return;
      }
      if (seq !== this.sentinelSeq || this.state.sentinel !== name) return;
      this.sentinelData = data;
    }
    this.sentinelChart = renderSentinel(view, $("#sn-body"), $("#sn-sub"), data, this, { mode: this.state.sv, trip: this.state.trip });
    this.markReady();
  }

  /** A poll while the history shows: draw it again when it grew, ended or was damaged. */
  async refreshSentinel() {
    const name = this.state.sentinel;
    const old = this.sentinelData;
    let data;
    try {
      data = await this.api.sentinel(name);
    } catch {
      return;
    }
    if (this.state.sentinel !== name) return;
    const sig = (d) => d && JSON.stringify([d.num_steps, d.ended, d.problems, d.error, (d.trips || []).map((t) => [t.step, t.run, t.reproduced])]);
    if (sig(old) === sig(data)) return;
    this.lastChange = Date.now();
    this.sentinelData = data;
    this.sentinelChart = renderSentinel($("#sentinel-view"), $("#sn-body"), $("#sn-sub"), data, this, { mode: this.state.sv, trip: this.state.trip });
  }

  hideSentinel() {
    if (this.state.sentinel === null) return;
    Object.assign(this.state, { sentinel: null, sv: null, trip: null });
    ++this.sentinelSeq;
    this.sentinelChart = null;
    $("#sentinel-view").hidden = true;
    document.body.classList.remove("view-sentinel");
    this.fillCompare();
  }

  /** Open a trip's replay: its run, on its root cause (the first view). */
  async openReplay(run) {
    this.hideSentinel();
    Object.assign(this.state, { run, process: null, sel: null, src: null, tab: null, nf: false, op: "" });
    this.sentinelData = null; // read again on the way back (it may have grown)
    await this.loadRun();
  }

  /** #sentinel-back: shown in a run that is the replay of a sentinel's trip. */
  updateSentinelBack() {
    const b = $("#sentinel-back");
    const run = this.state.run;
    const s = this.state.sentinel === null && run !== null ? this.sentinels.find((x) => (x.runs || []).includes(run)) : null;
    b.hidden = !s;
    if (!s) return;
    const m = /replay-step-(\d+)$/.exec(run);
    b.dataset.history = s.history;
    if (m) b.dataset.step = m[1];
    else delete b.dataset.step;
    b.textContent = m ? `◂ sentinel: replay of step ${fmtInt(Number(m[1]))}` : "◂ sentinel history";
  }

  // ---- lists and timeline ----------------------------------------------------------------

  async totalOf(kind, filter) {
    const noFilter = filter.process === null && !filter.nonfinite && !filter.op_type;
    if (noFilter && this.runInfo) return kind === TRACE ? this.runInfo.num_graph_execution_traces : this.runInfo.num_executions;
    const body = await this.api.list(kind, 0, 0, filter);
    return body.total;
  }

  async setupLists() {
    this.updateTabs();
    this.listPos = null;
    const kind = this.listKind;
    const filter = this.listFilter;
    try {
      const [tlTotal, listTotal] = await Promise.all([this.totalOf(EXEC, this.processFilter), this.totalOf(kind, filter)]);
      this.timeline.setSource(EXEC, this.state.process, tlTotal);
      this.vlist.setSource(kind, filter, listTotal);
      this.vlist.setSelected(this.state.sel && this.state.sel.kind === kind ? this.state.sel.index : null);
      this.updateListFoot();
      // A new filter or tab: scroll the new list to the selection.
      if (this.state.sel && this.state.sel.kind === kind && listTotal) this.placeInList(this.state.sel, ++this.placeSeq);
    } catch (e) {
      this.vlist.setSource(kind, filter, 0);
      this.vlist.setError(e.message);
    }
    this.updateTimelineRange();
  }

  async refreshTotals() {
    try {
      const [tlTotal, listTotal] = await Promise.all([this.totalOf(EXEC, this.processFilter), this.totalOf(this.listKind, this.listFilter)]);
      this.timeline.setTotal(tlTotal); // refetches the buckets
      this.vlist.setTotal(listTotal);
      this.vlist.schedule();
      this.updateListFoot();
      this.updateTimelineRange();
    } catch (e) {
      this.vlist.setError(e.message);
    }
  }

  updateTabs() {
    const tab = this.state.tab || "executions";
    for (const b of document.querySelectorAll(".tab")) {
      b.classList.toggle("active", b.dataset.tab === tab);
      b.setAttribute("aria-selected", String(b.dataset.tab === tab));
    }
    $("#only-nonfinite").checked = this.state.nf;
    renderListHeader($("#list-header"), tab === "traces");
    const filt = $("#list-filter");
    filt.hidden = !this.state.op;
    if (this.state.op) {
      setChildren(
        filt,
        el("span", { className: "muted", text: "op type = " }),
        el("code", { text: this.state.op }),
        el("button", {
          className: "linkbtn",
          text: "✕ clear",
          on: {
            click: () => {
              this.state.op = "";
              this.setupLists();
              this.writeHash();
            },
          },
        }),
      );
    }
    const noTraces = this.runInfo && this.runInfo.num_graph_execution_traces === 0;
    this.vlist.emptyText = tab === "traces" && noTraces ? "No graph traces in this dump (eager only): see the Executions tab." : this.state.nf ? "No events hold Inf or NaN." : "No events.";
  }

  updateListFoot() {
    const total = this.vlist.total;
    const what = this.listKind === TRACE ? "graph traces" : "executions";
    const foot = `${fmtInt(total)} ${this.state.nf ? "Inf/NaN " : ""}${what}${this.state.op ? ` of type ${this.state.op}` : ""}${this.vlist.scaled ? " · scaled scrollbar" : ""}`;
    $("#list-foot-text").textContent = foot;
  }

  updateTimelineRange() {
    $("#tl-range").textContent = this.timeline.rangeText();
  }

  async setTab(tab, opts = {}) {
    if (tab === this.state.tab && !opts.force) return;
    this.state.tab = tab;
    await this.setupLists();
    this.writeHash();
  }

  renderRow(row) {
    // TensorFlow's dumps record no steps: show none rather than a misleading 0.
    const stepsKnown = !this.runInfo || this.runInfo.steps_known !== false;
    return renderListRow(row, this.listKind === TRACE, stepsKnown);
  }

  // ---- alerts ----------------------------------------------------------------------------

  /**
   * The dump changed: an analysis that found no harm is asked again, since what was written
   * or damaged since may change its verdict (a harmful one stands: later events do not undo
   * the first harm, and re-analysing a growing dump on every poll would cost the server).
   */
  dropStaleVerdict() {
    if (this.analysis && this.analysis.verdict !== "harmful") {
      this.staleAnalysis = this.analysis;
      this.analysis = null;
    }
  }

  /** The alert counts of the process in view (/api/alerts), then the whole run's root cause. */
  async loadAlerts() {
    const seq = ++this.alertSeq;
    const run = this.state.run;
    const process = this.state.process;
    try {
      const a = await this.api.alerts(process);
      if (seq !== this.alertSeq || run !== this.state.run) return;
      this.alerts = a;
      renderAlerts($("#alert-lists"), $("#alert-total"), a, this, process === null ? "" : this.processLabel(process) || `process ${process}`);
      setChildren($("#op-types"), ...(a.by_op_type || []).map((o) => el("option", { value: o.op_type })));
      if (this.state.sel) this.updateAlertPosSoon(this.state.sel);
      else this.updateAlertPos(null);
    } catch (e) {
      if (seq !== this.alertSeq) return;
      setChildren($("#alert-lists"), el("div", { className: "error", text: e.message }));
    }
    this.markReady();
    // The root cause (of the whole run, whatever the process) second: slower on large dumps,
    // so the first paint does not wait for it.
    if (this.analysis) {
      renderRootCause($("#rootcause"), this.analysis, this);
      return;
    }
    // Asked again after a change: the old verdict stays meanwhile unless it was the all-clear.
    const stale = this.staleAnalysis;
    this.staleAnalysis = null;
    renderRootCause($("#rootcause"), stale && stale.verdict !== "clean" ? stale : null, this);
    try {
      const an = await this.api.analysis();
      if (seq !== this.alertSeq || run !== this.state.run) return;
      this.analysis = an;
      renderRootCause($("#rootcause"), an, this);
      leadOpTypesWithCause($("#alert-lists"), this.alerts, this);
      this.openOnRootCause(an);
      this.loadRanks(an);
      this.loadHeadroom(an);
    } catch (e) {
      if (seq === this.alertSeq) {
        renderRootCauseError($("#rootcause"), e.message);
        this.openOnRootCause(null);
      }
    }
  }

  /** The event the root cause box names first: the cause, else the first Inf/NaN (null: none). */
  rootCauseRef(an = this.analysis) {
    const ev = an ? an.cause || an.origin : null;
    if (!ev || ev.index === null || ev.index === undefined) return null;
    return { kind: ev.kind || EXEC, index: ev.index };
  }

  /**
   * The first view: select the root cause (its detail, graph, source and stack) when the
   * analysis found harm and nothing was selected meanwhile (by the URL or by the user).
   */
  openOnRootCause(an) {
    const pick = this.pickRootCause;
    this.pickRootCause = false;
    const ref = an && an.verdict === "harmful" ? this.rootCauseRef(an) : null;
    if (pick && ref && !this.state.sel) this.select(ref, { from: "rootcause" });
    else if (!this.state.sel) this.showDetailHint();
  }

  /** The Ranks panel, when the analysis found Inf/NaN across several processes. */
  async loadRanks(an) {
    const run = this.state.run;
    if (!an || !an.ranks) {
      hideRanks($("#ranks"));
      return;
    }
    renderRanksLoading($("#ranks"), $("#ranks-body"));
    try {
      const data = await this.api.ranks(RANKS_WINDOW);
      if (run !== this.state.run || this.analysis !== an) return;
      if (data.ranks) renderRanks($("#ranks"), $("#ranks-body"), $("#ranks-sub"), data, this);
      else hideRanks($("#ranks"));
    } catch (e) {
      if (run === this.state.run) renderRanksError($("#ranks"), $("#ranks-body"), e.message);
    }
  }

  /**
   * The Headroom panel: each module's largest |x| per step against its format's largest
   * value (or the one chosen in #headroom-format); hidden when the dump records no ranges.
   */
  async loadHeadroom(an) {
    const run = this.state.run;
    const format = $("#headroom-format").value;
    const seq = (this.headroomSeq = (this.headroomSeq || 0) + 1);
    if (this.headroomChart) renderHeadroomLoading($("#headroom"), $("#headroom-body"));
    try {
      const data = await this.api.headroom(format);
      if (seq !== this.headroomSeq || run !== this.state.run || this.analysis !== an) return;
      if (headroomShown(data)) {
        this.headroomChart = renderHeadroom($("#headroom"), $("#headroom-body"), $("#headroom-sub"), data, this);
        this.collapseHeadroom(!(this.headroomOpen ?? headroomNearLimit(data)));
      } else {
        this.headroomChart = null;
        hideHeadroom($("#headroom"));
      }
    } catch (e) {
      if (seq === this.headroomSeq && run === this.state.run) {
        renderHeadroomError($("#headroom"), $("#headroom-body"), e.message);
        this.collapseHeadroom(false);
      }
    }
  }

  /** Collapse the Headroom chart to its head, or open it (drawn again at its width). */
  collapseHeadroom(collapsed) {
    setHeadroomCollapsed($("#headroom"), $("#headroom-body"), $("#headroom-toggle"), collapsed);
    if (!collapsed && this.headroomChart) this.headroomChart.redraw();
  }

  /** "k / N" in the Alerts head: the selection's place among the alerts of its kind. */
  async updateAlertPos(ref, known) {
    const a = this.alerts;
    const posEl = $("#alert-pos");
    if (!a || !a.total || !ref) {
      posEl.textContent = a && a.total ? fmtInt(a.total) : "";
      posEl.title = "Inf/NaN alerts: n / N go to the next / previous one";
      return;
    }
    let p = known;
    if (!p) {
      try {
        p = await this.api.positionOf(ref.kind, this.alertFilter, ref.index);
      } catch {
        posEl.textContent = "";
        return;
      }
    }
    if (!this.state.sel || this.state.sel.index !== ref.index || this.state.sel.kind !== ref.kind) return;
    const k = p.exact ? fmtInt(p.position + 1) : "–";
    posEl.textContent = `${k} / ${fmtInt(p.total)}`;
    posEl.title = ref.kind === TRACE ? "alert among the graph traces" : "alert among the executions";
  }

  /** n / N: the next or previous alert (one position_of probe, then the row's page). */
  async nextAlert(dir) {
    // Alerts of the kind in view: the timeline's executions or the list's kind; the other
    // kind when this one has none.
    const a = this.alerts;
    const sel = this.state.sel;
    let kind = this.state.focus === "timeline" ? EXEC : this.listKind;
    if (a && ((kind === EXEC && !a.executions) || (kind === TRACE && !a.graph_execution_traces))) kind = kind === EXEC ? TRACE : EXEC;
    const filter = this.alertFilter;
    const cur = sel && sel.kind === kind ? sel.index : -1;
    try {
      let pos;
      let total;
      if (dir > 0) {
        const p = await this.api.positionOf(kind, filter, cur + 1);
        if (p.position === null) return this.toast(p.total ? "no later alert" : "no alerts");
        pos = p.position;
        total = p.total;
      } else {
        if (cur < 0) return this.toast("no earlier alert");
        const p = await this.api.positionOf(kind, filter, cur);
        pos = (p.position === null ? p.total : p.position) - 1;
        total = p.total;
        if (pos < 0) return this.toast("no earlier alert");
      }
      const row = await this.api.rowAt(kind, filter, pos);
      if (!row) return;
      const opts = { from: "alert", alertPos: { position: pos, exact: true, total } };
      if (this.listIsAlerts) opts.pos = pos; // the list shows the alerts: no probe to place it
      await this.select({ kind, index: row.index }, opts);
    } catch (e) {
      this.toast(e.message, 4000);
    }
  }

  // ---- selection -------------------------------------------------------------------------

  async selectTimelinePos(pos, row) {
    this.setFocus("timeline");
    if (!row) {
      try {
        row = await this.api.rowAt(EXEC, this.processFilter, pos);
      } catch (e) {
        return this.toast(e.message, 4000);
      }
    }
    if (row) this.select({ kind: EXEC, index: row.index }, { from: "timeline", tlPos: pos });
  }

  /** Keyboard: move the selection by `delta` in the focused list or the timeline. */
  async move(delta) {
    if (this.state.focus === "timeline") {
      const total = this.timeline.total;
      if (!total) return;
      const cur = this.timeline.selectedPos;
      const pos = clamp(cur === null ? (delta > 0 ? 0 : total - 1) : cur + delta, 0, total - 1);
      if (pos === cur) return;
      this.timeline.setSelectedPos(pos);
      let row;
      try {
        row = await this.api.rowAt(EXEC, this.processFilter, pos);
      } catch (e) {
        return this.toast(e.message, 4000);
      }
      if (row && this.timeline.selectedPos === pos) this.select({ kind: EXEC, index: row.index }, { from: "timeline", tlPos: pos });
      return;
    }
    const total = this.vlist.total;
    if (!total) return;
    const kind = this.listKind;
    const onList = this.listPos !== null && this.state.sel && this.state.sel.kind === kind;
    const pos = clamp(onList ? this.listPos + delta : Math.floor(this.vlist.pos) + (delta > 0 ? 0 : Math.ceil(this.vlist.viewRows) - 1), 0, total - 1);
    if (onList && pos === this.listPos) return;
    this.moveListTo(pos);
  }

  async moveTo(where) {
    if (this.state.focus === "timeline") {
      const total = this.timeline.total;
      if (!total) return;
      this.timeline.selectedPos = null;
      const target = where === Infinity ? total - 1 : 0;
      this.timeline.setSelectedPos(target);
      const row = await this.api.rowAt(EXEC, this.processFilter, target);
      if (row) this.select({ kind: EXEC, index: row.index }, { from: "timeline", tlPos: target });
      return;
    }
    const total = this.vlist.total;
    if (total) this.moveListTo(where === Infinity ? total - 1 : 0);
  }

  async moveListTo(pos) {
    const kind = this.listKind;
    const filter = this.listFilter;
    this.listPos = pos;
    this.vlist.reveal(pos, false);
    let row;
    try {
      row = await this.api.rowAt(kind, filter, pos);
    } catch (e) {
      return this.toast(e.message, 4000);
    }
    if (row && this.listPos === pos && kind === this.listKind) this.select({ kind, index: row.index }, { from: "list", pos });
  }

  /**
   * Select an event: {kind, index}. opts.from: alert | list | timeline | graph | link | url |
   * key | refresh | rootcause (the first view); opts.pos (its position in the list in view),
   * opts.tlPos (timeline position), opts.alertPos ({position, exact, total} among the alerts), opts.src (the source
   * location to show instead of the event's own line).
   */
  async select(ref, opts = {}) {
    const kind = ref.kind || EXEC;
    const index = Number(ref.index);
    const seq = ++this.selSeq;
    this.state.sel = { kind, index };
    markRanksSelection($("#ranks-body"), this.state.sel);
    if (!opts.src && opts.from !== "refresh") this.state.src = null;
    this.writeHash();
    document.body.dataset.selected = "";

    if (kind === TRACE && this.state.tab !== "traces") {
      this.state.tab = "traces";
      await this.setupLists();
      this.writeHash();
    }
    this.placeSelection({ kind, index }, opts);

    // Detail.
    const d = $("#exec-detail");
    d.classList.add("loading");
    let ev;
    try {
      ev = await this.api.event(kind, index);
    } catch (e) {
      if (seq !== this.selSeq) return;
      d.classList.remove("loading");
      renderDetailError($("#detail-body"), $("#detail-title"), e instanceof ApiError ? e.message : String(e));
      renderGraphMessage($("#graph-body"), $("#graph-sub"), "");
      setChildren($("#stack-body"), el("div", { className: "empty-state", text: "" }));
      return;
    }
    if (seq !== this.selSeq) return;
    d.classList.remove("loading");
    this.detail = { kind, index, ev };
    renderDetail($("#detail-body"), $("#detail-title"), $("#detail-sub"), ev, kind, this);
    if (this.headroomChart) this.headroomChart.markStep(ev.step ?? null);
    d.dataset.kind = kind;
    d.dataset.index = String(index);

    // Source: the URL's location, else the innermost user frame that was recorded.
    const src = opts.src || this.defaultSource(ev);
    this.source.setStack(ev.stack, ev.process ?? 0);
    if (src) this.openSource(src, { keepStack: true });
    else {
      this.state.src = null;
      this.source.clear("This event's source was not recorded in the dump.");
      this.writeHash();
    }
    renderStack($("#stack-body"), $("#stack-sub"), ev, kind, this, this.state.src);
    document.body.dataset.selected = kindLetter(kind) + index;

    // Graph structure.
    if (kind === TRACE) {
      if (!ev.graph_id || !ev.op_name) {
        renderGraphMessage($("#graph-body"), $("#graph-sub"), "This trace names no graph op.");
      } else {
        renderGraphMessage($("#graph-body"), $("#graph-sub"), "loading…");
        try {
          const op = await this.api.graphOp(ev.process ?? 0, ev.graph_id, ev.op_name, index);
          if (seq !== this.selSeq) return;
          const marked = renderTraceGraph($("#graph-body"), $("#graph-sub"), op, ev, this);
          this.vlist.setMarked(this.listKind === TRACE ? marked : []);
        } catch (e) {
          if (seq !== this.selSeq) return;
          renderGraphMessage($("#graph-body"), $("#graph-sub"), e.message, true);
        }
      }
    } else {
      const marked = renderExecGraph($("#graph-body"), $("#graph-sub"), ev, this);
      this.vlist.setMarked(this.listKind === EXEC ? marked : []);
    }
    if (opts.alertPos) this.updateAlertPos({ kind, index }, opts.alertPos);
    else this.updateAlertPosSoon({ kind, index });
  }

  /** Mark the selection in the list and the timeline, scrolling them to it. */
  placeSelection(ref, opts) {
    const { kind, index } = ref;
    const listKind = this.listKind;
    this.vlist.setSelected(kind === listKind ? index : null);
    if (kind === listKind) {
      if (opts.pos !== undefined) {
        ++this.placeSeq; // a placement still under way is stale
        this.listPos = opts.pos;
        this.vlist.reveal(opts.pos, opts.from !== "list");
      } else {
        this.listPos = null;
        this.placeInList(ref, ++this.placeSeq);
      }
    } else this.listPos = null;
    if (kind === EXEC) {
      if (opts.tlPos !== undefined) this.timeline.setSelectedPos(opts.tlPos);
      else if (this.state.process === null) this.timeline.setSelectedPos(index);
      else {
        this.api
          .positionOf(EXEC, this.processFilter, index)
          .then((p) => {
            if (this.state.sel && this.state.sel.index === index && this.state.sel.kind === EXEC) this.timeline.setSelectedPos(p.exact ? p.position : null);
          })
          .catch(() => {});
      }
    }
    this.updateTimelineRange();
  }

  async placeInList(ref, seq) {
    const filter = this.listFilter;
    const plain = filter.process === null && !filter.nonfinite && !filter.op_type;
    let pos;
    if (plain) pos = ref.index;
    else {
      try {
        const p = await this.api.positionOf(ref.kind, filter, ref.index);
        if (seq !== this.placeSeq) return;
        if (!p.exact) {
          // Not in this filtered list: show where it would be.
          if (p.total) this.vlist.reveal(p.position === null ? p.total - 1 : p.position, true);
          return;
        }
        pos = p.position;
      } catch {
        return;
      }
    }
    if (seq !== this.placeSeq || !this.state.sel || this.state.sel.index !== ref.index) return;
    this.listPos = pos;
    this.vlist.reveal(pos, true);
  }

  defaultSource(ev) {
    const stack = ev.stack || [];
    const proc = ev.process ?? 0;
    for (let i = stack.length - 1; i >= 0; i--) {
      const f = stack[i];
      if (f.user && f.file_index >= 0) return { process: proc, file: f.file_index, line: f.line };
    }
    if (ev.source && ev.source.file) return { process: proc, path: ev.source.file, line: ev.source.line };
    for (let i = stack.length - 1; i >= 0; i--) {
      const f = stack[i];
      if (f.file_index >= 0) return { process: proc, file: f.file_index, line: f.line };
    }
    return null;
  }

  /** The Source section's file picker: every file the dump recorded (of the process in view). */
  async loadSourceFiles() {
    const run = this.state.run;
    const process = this.state.process;
    let files;
    try {
      files = await this.api.sourceFiles(process);
    } catch {
      files = [];
    }
    if (run !== this.state.run || process !== this.state.process) return;
    const multi = this.runInfo && (this.runInfo.processes || []).length > 1;
    this.source.setFiles(files, multi && process === null ? (p) => this.processLabel(p) : null);
  }

  /** Show a source location: {process, file (index) or path, line}. */
  openSource(loc, opts = {}) {
    this.state.src = { process: loc.process ?? 0, file: loc.file, path: loc.file === undefined || loc.file === null ? loc.path : undefined, line: loc.line };
    this.writeHash();
    this.source.show(this.state.src);
    if (!opts.keepStack) {
      for (const f of document.querySelectorAll("#stack-body .frame")) {
        const same = Number(f.dataset.line) === loc.line && ((loc.file !== undefined && loc.file !== null && Number(f.dataset.fileIndex) === loc.file) || (loc.path && f.dataset.file === loc.path));
        f.classList.toggle("active", same);
      }
    }
  }

  /** A frame whose file the dump did not record: say so without asking the server. */
  sourceNotRecorded(frame) {
    this.state.src = null;
    this.writeHash();
    this.source.clear(`${frame.file}:${frame.line} was not recorded in the dump (by default only the program's own files are).`);
    for (const f of document.querySelectorAll("#stack-body .frame")) f.classList.toggle("active", f.dataset.file === frame.file && Number(f.dataset.line) === frame.line);
  }

  async jump(text) {
    if (!text) {
      if (this.state.op) {
        this.state.op = "";
        await this.setupLists();
        this.writeHash();
      }
      return;
    }
    const m = /^([et])?\s*#?\s*(\d+)$/i.exec(text);
    if (m) {
      const kind = m[1] ? kindFromLetter(m[1].toLowerCase()) : this.listKind;
      $("#jump").blur();
      await this.select({ kind, index: Number(m[2]) }, { from: "jump" });
      return;
    }
    this.state.op = text;
    await this.setupLists();
    this.writeHash();
    $("#jump").blur();
    if (!this.vlist.total) this.toast(`no ${this.listKind === TRACE ? "graph traces" : "executions"} of op type "${text}" (exact name, e.g. aten.log.default)`, 4000);
  }
}

const app = new App();
window.nanscope = app; // for debugging from the console
app.boot();
