// The Python execution timeline: every execution as a compact strip on a <canvas>, drawn
// from /api/timeline buckets, so a run of millions of events costs one request per view.
//
// The main strip shows the view [viewBegin, viewBegin + viewSpan) (list positions, which are
// event indices unless a process is chosen); an overview strip below shows the whole run
// with the view as a window. Wheel zooms around the pointer (shift+wheel pans), dragging
// pans, a click selects the nearest event (the nearest Inf/NaN one inside a red bucket).

import { el, clamp, fmtInt, shortOp } from "./util.js";

const COLORS = {
  0: "#4a505c", // unknown / mode does not tell
  1: "#2e7d5b", // finite
  2: "#f0883e", // Inf
  3: "#f85149", // NaN
};
const MIN_SPAN = 8;

export class Timeline {
  /** opts: {api, onSelect(pos, row), onView()} */
  constructor(host, opts) {
    this.api = opts.api;
    this.onSelect = opts.onSelect;
    this.onView = opts.onView || (() => {});
    this.kind = "execution";
    this.process = null;
    this.total = 0;
    this.viewBegin = 0;
    this.viewSpan = 0;
    this.data = null; // last /api/timeline answer for the view
    this.overview = null; // /api/timeline answer for the whole run
    this.rows = null; // {begin, rows} when zoomed in enough to label events
    this.selectedPos = null;
    this.hover = null;
    this.fetchSeq = 0;
    this.error = null;
    this.loaded = false; // no source given yet: the run's size is not known, so nothing is "empty"

    this.canvas = el("canvas", { className: "tl-canvas", attrs: { "aria-label": "execution timeline" } });
    this.ocanvas = el("canvas", { className: "tl-overview", attrs: { "aria-label": "whole run" } });
    this.tip = el("div", { className: "tl-tip", hidden: true });
    this.wrap = el("div", { className: "tl-wrap", attrs: { tabindex: "0" } }, this.canvas, this.ocanvas, this.tip);
    host.appendChild(this.wrap);

    this.canvas.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    this.canvas.addEventListener("pointerdown", (e) => this.onDown(e));
    this.canvas.addEventListener("pointermove", (e) => this.onHover(e));
    this.canvas.addEventListener("pointerleave", () => {
      this.hover = null;
      this.tip.hidden = true;
    });
    this.ocanvas.addEventListener("pointerdown", (e) => this.onOverviewDown(e));
    new ResizeObserver(() => {
      this.draw();
      this.fetchSoon();
      this.fetchOverview();
    }).observe(this.wrap);
  }

  get width() {
    return Math.max(1, this.canvas.clientWidth);
  }

  setSource(kind, process, total) {
    const changed = kind !== this.kind || process !== this.process || !this.loaded;
    this.loaded = true;
    this.kind = kind;
    this.process = process;
    if (changed) {
      this.data = null;
      this.overview = null;
      this.rows = null;
      this.total = 0;
    }
    this.setTotal(total, changed);
  }

  /** New total (a growing dump). `reset`: show the whole run. */
  setTotal(total, reset = false) {
    const wasAll = this.viewBegin <= 0 && this.viewBegin + this.viewSpan >= this.total;
    const followEnd = this.total > 0 && this.viewBegin + this.viewSpan >= this.total;
    const old = this.total;
    this.total = total;
    if (reset || wasAll || old === 0) {
      this.viewBegin = 0;
      this.viewSpan = total;
    } else if (followEnd && total > old) {
      this.viewBegin = Math.max(0, total - this.viewSpan);
    }
    this.clampView();
    this.refresh();
  }

  /** Refetch everything (new data in a live dump). */
  refresh() {
    this.fetchSoon(0);
    this.fetchOverview();
  }

  clampView() {
    const total = this.total;
    const minSpan = Math.min(total, MIN_SPAN);
    this.viewSpan = clamp(this.viewSpan, minSpan, Math.max(total, minSpan));
    this.viewBegin = clamp(this.viewBegin, 0, Math.max(0, total - this.viewSpan));
  }

  setSelectedPos(pos, reveal = true) {
    this.selectedPos = pos;
    if (pos !== null && reveal && (pos < this.viewBegin || pos >= this.viewBegin + this.viewSpan)) {
      this.viewBegin = pos - this.viewSpan / 2;
      this.clampView();
      this.fetchSoon(0);
    }
    this.draw();
  }

  zoom(factor, anchorFrac = 0.5) {
    if (!this.total) return;
    const anchor = this.viewBegin + anchorFrac * this.viewSpan;
    this.viewSpan = this.viewSpan * factor;
    this.clampView();
    this.viewBegin = anchor - anchorFrac * this.viewSpan;
    this.clampView();
    this.viewChanged();
  }

  /** Zoom around the selection when it is in view, else around the centre. */
  zoomButton(factor) {
    const p = this.selectedPos;
    if (p !== null && p >= this.viewBegin && p < this.viewBegin + this.viewSpan && this.viewSpan > 0) {
      this.zoom(factor, (p + 0.5 - this.viewBegin) / this.viewSpan);
    } else this.zoom(factor);
  }

  pan(fraction) {
    this.viewBegin += fraction * this.viewSpan;
    this.clampView();
    this.viewChanged();
  }

  fit() {
    this.viewBegin = 0;
    this.viewSpan = this.total;
    this.clampView();
    this.viewChanged();
  }

  centerOnSelection() {
    if (this.selectedPos === null) return;
    this.viewBegin = this.selectedPos + 0.5 - this.viewSpan / 2;
    this.clampView();
    this.viewChanged();
  }

  viewChanged() {
    this.draw();
    this.fetchSoon();
    this.onView();
  }

  /** "i – j of N" for the toolbar. */
  rangeText() {
    if (!this.loaded) return "";
    if (!this.total) return "no events";
    const b = Math.floor(this.viewBegin);
    const e = Math.min(this.total, Math.ceil(this.viewBegin + this.viewSpan));
    return `${fmtInt(b)} – ${fmtInt(e - 1)} of ${fmtInt(this.total)}`;
  }

  fetchSoon(delay = 60) {
    clearTimeout(this.fetchTimer);
    this.fetchTimer = setTimeout(() => this.fetch(), delay);
  }

  async fetch() {
    if (!this.total) {
      this.data = null;
      this.draw();
      return;
    }
    const seq = ++this.fetchSeq;
    const begin = Math.max(0, Math.floor(this.viewBegin));
    const end = Math.min(this.total, Math.ceil(this.viewBegin + this.viewSpan));
    const buckets = clamp(Math.min(end - begin, Math.floor(this.width)), 1, 4000);
    try {
      const data = await this.api.timeline(this.kind, begin, end, buckets, this.process);
      if (seq !== this.fetchSeq) return;
      this.error = null;
      this.data = data;
      // Zoomed in far enough to label each event: fetch the rows too.
      const pxPerEvent = this.width / Math.max(1, end - begin);
      if (pxPerEvent >= 14 && end - begin <= 1000) {
        const list = await this.api.list(this.kind, begin, end, { process: this.process });
        if (seq !== this.fetchSeq) return;
        this.rows = { begin: list.begin, rows: list.rows };
      } else this.rows = null;
    } catch (e) {
      if (seq !== this.fetchSeq) return;
      this.error = e.message;
    }
    this.draw();
  }

  async fetchOverview() {
    if (!this.total) {
      this.overview = null;
      this.drawOverview();
      return;
    }
    const buckets = clamp(Math.min(this.total, Math.floor(this.ocanvas.clientWidth || 1)), 1, 4000);
    try {
      this.overview = await this.api.timeline(this.kind, 0, this.total, buckets, this.process);
    } catch {
      this.overview = null;
    }
    this.drawOverview();
  }

  xOf(pos) {
    return ((pos - this.viewBegin) / this.viewSpan) * this.width;
  }
  posOf(x) {
    return this.viewBegin + (x / this.width) * this.viewSpan;
  }

  /** Bucket i of an answer covers [b0, b1). */
  static bucketRange(d, i) {
    const w = d.bucket_size;
    return [d.begin + Math.floor(i * w), d.begin + Math.floor((i + 1) * w)];
  }

  prepare(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx, w, h };
  }

  draw() {
    this.wrap.dataset.begin = String(Math.floor(this.viewBegin));
    this.wrap.dataset.span = String(Math.round(this.viewSpan));
    this.wrap.dataset.total = String(this.total);
    this.wrap.dataset.selected = this.selectedPos === null ? "" : String(this.selectedPos);
    this.wrap.dataset.state = this.error ? "error" : !this.loaded ? "loading" : this.total ? "ready" : "empty";
    const { ctx, w, h } = this.prepare(this.canvas);
    ctx.clearRect(0, 0, w, h);
    const top = 16;
    const barH = h - top - 4;
    ctx.font = "10px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
    ctx.textBaseline = "middle";
    if (this.error) {
      ctx.fillStyle = "#f85149";
      ctx.fillText(this.error, 6, h / 2);
    } else if (!this.loaded) {
      ctx.fillStyle = "#8b949e";
      ctx.fillText("loading…", 6, h / 2);
    } else if (!this.total) {
      ctx.fillStyle = "#8b949e";
      ctx.fillText("no executions recorded", 6, h / 2);
    }
    const d = this.data;
    if (d && d.status && this.total) {
      const n = d.status.length;
      const pxPerEvent = w / Math.max(1, this.viewSpan);
      let lastStep = null;
      let lastLabelX = -1e9;
      let lastTickX = -1e9;
      for (let i = 0; i < n; i++) {
        const [b0, b1] = Timeline.bucketRange(d, i);
        if (b1 <= b0) continue;
        let x0 = this.xOf(b0);
        let x1 = this.xOf(b1);
        const st = d.status[i];
        // Step boundaries.
        const step = d.steps ? d.steps[i] : null;
        if (step !== null && step !== undefined && step !== lastStep) {
          if (lastStep !== null && x0 - lastTickX >= 4) {
            ctx.fillStyle = "rgba(139,148,158,0.45)";
            ctx.fillRect(Math.round(x0) - 0.5, top - 4, 1, h - top + 2);
            lastTickX = x0;
          }
          const label = `step ${step}`;
          const lw = ctx.measureText(label).width;
          if (x0 - lastLabelX > 0 && x0 + 3 + lw < w) {
            ctx.fillStyle = "#8b949e";
            ctx.fillText(label, Math.max(2, x0 + 3), 8);
            lastLabelX = x0 + 3 + lw + 8;
          }
          lastStep = step;
        }
        const gap = pxPerEvent >= 6 ? 1 : 0;
        x0 += gap;
        x1 -= gap;
        let bw = x1 - x0;
        if (st >= 2 && bw < 2) {
          // Make a lone Inf/NaN visible however far out we are zoomed.
          x0 -= (2 - bw) / 2;
          bw = 2;
        }
        if (bw <= 0) continue;
        ctx.fillStyle = COLORS[st] || COLORS[0];
        const y = st >= 2 ? top - 3 : top;
        const hh = st >= 2 ? barH + 3 : barH;
        ctx.fillRect(x0, y, bw, hh);
      }
      // Event labels when zoomed in.
      if (this.rows && pxPerEvent >= 14) {
        ctx.save();
        ctx.fillStyle = "#e6edf3";
        ctx.textAlign = "center";
        for (let i = 0; i < this.rows.rows.length; i++) {
          const pos = this.rows.begin + i;
          const x0 = this.xOf(pos);
          const x1 = this.xOf(pos + 1);
          if (x1 < 0 || x0 > w) continue;
          const label = shortOp(this.rows.rows[i].op_type);
          const maxChars = Math.floor((x1 - x0 - 4) / 6);
          if (maxChars < 1) continue;
          const text = label.length > maxChars ? label.slice(0, Math.max(1, maxChars - 1)) + (maxChars > 1 ? "…" : "") : label;
          ctx.fillText(text, (x0 + x1) / 2, top + barH / 2);
        }
        ctx.restore();
      }
    }
    // Selection marker.
    if (this.selectedPos !== null && this.total) {
      const p = this.selectedPos;
      ctx.fillStyle = "#58a6ff";
      ctx.strokeStyle = "#58a6ff";
      if (p >= this.viewBegin && p < this.viewBegin + this.viewSpan) {
        const x0 = this.xOf(p);
        const x1 = Math.max(x0 + 2, this.xOf(p + 1));
        ctx.lineWidth = 2;
        ctx.strokeRect(x0 - 1, top - 4, x1 - x0 + 2, barH + 6);
        const cx = (x0 + x1) / 2;
        ctx.beginPath();
        ctx.moveTo(cx - 5, top - 11);
        ctx.lineTo(cx + 5, top - 11);
        ctx.lineTo(cx, top - 5);
        ctx.closePath();
        ctx.fill();
      } else {
        // Off screen: an arrow at the edge pointing to it.
        const left = p < this.viewBegin;
        const x = left ? 2 : w - 2;
        ctx.beginPath();
        ctx.moveTo(x, top + barH / 2);
        ctx.lineTo(left ? x + 8 : x - 8, top + barH / 2 - 6);
        ctx.lineTo(left ? x + 8 : x - 8, top + barH / 2 + 6);
        ctx.closePath();
        ctx.fill();
      }
    }
    this.drawOverview();
  }

  drawOverview() {
    const { ctx, w, h } = this.prepare(this.ocanvas);
    ctx.clearRect(0, 0, w, h);
    ctx.fillStyle = "#21262d";
    ctx.fillRect(0, 0, w, h);
    const d = this.overview;
    if (d && d.status && this.total) {
      const n = d.status.length;
      for (let i = 0; i < n; i++) {
        const [b0, b1] = Timeline.bucketRange(d, i);
        if (b1 <= b0) continue;
        const st = d.status[i];
        let x0 = (b0 / this.total) * w;
        let bw = ((b1 - b0) / this.total) * w;
        if (st >= 2 && bw < 2) {
          x0 -= (2 - bw) / 2;
          bw = 2;
        }
        ctx.fillStyle = COLORS[st] || COLORS[0];
        ctx.globalAlpha = st >= 2 ? 1 : 0.55;
        ctx.fillRect(x0, 3, bw, h - 6);
      }
      ctx.globalAlpha = 1;
    }
    if (this.total) {
      const x0 = (this.viewBegin / this.total) * w;
      const x1 = ((this.viewBegin + this.viewSpan) / this.total) * w;
      ctx.strokeStyle = "#c9d1d9";
      ctx.lineWidth = 1;
      ctx.strokeRect(Math.max(0.5, x0 + 0.5), 0.5, Math.max(3, x1 - x0 - 1), h - 1);
      if (this.selectedPos !== null) {
        ctx.fillStyle = "#58a6ff";
        ctx.fillRect(((this.selectedPos + 0.5) / this.total) * w - 1, 0, 2, h);
      }
    }
  }

  onWheel(e) {
    if (!this.total) return;
    e.preventDefault();
    const rect = this.canvas.getBoundingClientRect();
    const frac = clamp((e.clientX - rect.left) / rect.width, 0, 1);
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      const d = e.shiftKey ? e.deltaY || e.deltaX : e.deltaX;
      this.pan(d / Math.max(200, rect.width));
    } else {
      const factor = Math.exp(clamp(e.deltaY, -300, 300) * 0.0025);
      this.zoom(factor, frac);
    }
  }

  onDown(e) {
    if (!this.total || e.button !== 0) return;
    const rect = this.canvas.getBoundingClientRect();
    const startX = e.clientX;
    const startBegin = this.viewBegin;
    let dragged = false;
    this.canvas.setPointerCapture(e.pointerId);
    const move = (ev) => {
      const dx = ev.clientX - startX;
      if (Math.abs(dx) > 3) dragged = true;
      if (dragged) {
        this.viewBegin = startBegin - (dx / rect.width) * this.viewSpan;
        this.clampView();
        this.draw();
        this.fetchSoon(80);
        this.onView();
      }
    };
    const up = (ev) => {
      this.canvas.removeEventListener("pointermove", move);
      this.canvas.removeEventListener("pointerup", up);
      if (!dragged) this.clickAt(ev.clientX - rect.left);
    };
    this.canvas.addEventListener("pointermove", move);
    this.canvas.addEventListener("pointerup", up);
  }

  onOverviewDown(e) {
    if (!this.total || e.button !== 0) return;
    const rect = this.ocanvas.getBoundingClientRect();
    this.ocanvas.setPointerCapture(e.pointerId);
    const go = (ev) => {
      const frac = clamp((ev.clientX - rect.left) / rect.width, 0, 1);
      this.viewBegin = frac * this.total - this.viewSpan / 2;
      this.clampView();
      this.draw();
      this.fetchSoon(80);
      this.onView();
    };
    go(e);
    const up = () => {
      this.ocanvas.removeEventListener("pointermove", go);
      this.ocanvas.removeEventListener("pointerup", up);
    };
    this.ocanvas.addEventListener("pointermove", go);
    this.ocanvas.addEventListener("pointerup", up);
  }

  bucketAt(pos) {
    const d = this.data;
    if (!d || !d.status) return null;
    const i = Math.floor((pos - d.begin) / d.bucket_size);
    if (i < 0 || i >= d.status.length) return null;
    const [b0, b1] = Timeline.bucketRange(d, i);
    return { i, b0, b1, status: d.status[i], nonfinite: d.nonfinite ? d.nonfinite[i] : 0, step: d.steps ? d.steps[i] : null };
  }

  /** Select the event under x: the nearest Inf/NaN one inside a bucket that holds some. */
  async clickAt(x) {
    let pos = Math.floor(this.posOf(x));
    pos = clamp(pos, 0, this.total - 1);
    const bucket = this.bucketAt(pos);
    if (bucket && bucket.status >= 2 && bucket.b1 - bucket.b0 > 1) {
      const b = Math.max(bucket.b0, pos - 500);
      const e = Math.min(bucket.b1, b + 1000);
      try {
        const list = await this.api.list(this.kind, b, e, { process: this.process });
        let best = null;
        list.rows.forEach((row, i) => {
          if (!row.nonfinite) return;
          const p = list.begin + i;
          if (best === null || Math.abs(p - pos) < Math.abs(best.pos - pos)) best = { pos: p, row };
        });
        if (best) {
          this.onSelect(best.pos, best.row);
          return;
        }
      } catch {
        /* fall back to the plain position */
      }
    }
    this.onSelect(pos, null);
  }

  onHover(e) {
    if (!this.total || e.buttons) return;
    const rect = this.canvas.getBoundingClientRect();
    const x = e.clientX - rect.left;
    const pos = clamp(Math.floor(this.posOf(x)), 0, this.total - 1);
    const bucket = this.bucketAt(pos);
    let text = `#${fmtInt(pos)}`;
    if (this.rows && pos >= this.rows.begin && pos < this.rows.begin + this.rows.rows.length) {
      const row = this.rows.rows[pos - this.rows.begin];
      text = `#${fmtInt(row.index)} ${row.op_type} · step ${row.step}${row.nonfinite ? " · Inf/NaN" : ""}`;
    } else if (bucket) {
      const span = bucket.b1 - bucket.b0;
      text = span > 1 ? `${fmtInt(bucket.b0)}–${fmtInt(bucket.b1 - 1)}` : `#${fmtInt(bucket.b0)}`;
      if (bucket.step !== null) text += ` · step ${bucket.step}`;
      if (bucket.nonfinite) text += ` · ${fmtInt(bucket.nonfinite)} with Inf/NaN`;
    }
    this.tip.textContent = text;
    this.tip.hidden = false;
    const wrapRect = this.wrap.getBoundingClientRect();
    const tipW = this.tip.offsetWidth;
    this.tip.style.left = `${clamp(e.clientX - wrapRect.left + 10, 0, wrapRect.width - tipW - 2)}px`;
    this.tip.style.top = `${this.canvas.offsetTop + this.canvas.clientHeight + 2}px`;
  }
}
