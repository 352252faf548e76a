// A virtualised list over a paged API list, usable with millions of rows.
//
// Browsers cap an element's height (about 16-33M px), so the spacer that gives the scrollbar
// its range is capped at MAX_SPACER px and scrollTop is mapped to a row position
// proportionally. The authoritative state is `pos`, a fractional row position of the top
// edge; wheel and keys move `pos` by rows, the scrollbar thumb maps back to it. Only the
// visible rows (plus a small overscan) exist in the DOM, and rows come from the Api's
// bounded LRU page cache.

import { PAGE } from "./api.js";
import { el, clamp } from "./util.js";

const MAX_SPACER = 4_000_000; // px; well under every browser's cap

export class VList {
  /**
   * @param {HTMLElement} host   element to fill
   * @param {object} opts        {api, rowHeight, renderRow(row, pos) -> HTMLElement,
   *                              onClick(row, pos, event), emptyText}
   */
  constructor(host, opts) {
    this.api = opts.api;
    this.rowHeight = opts.rowHeight || 24;
    this.renderRow = opts.renderRow;
    this.onClick = opts.onClick;
    this.emptyText = opts.emptyText || "nothing to show";
    this.kind = "execution";
    this.filter = {};
    this.total = 0;
    this.pos = 0;
    this.selectedIndex = null;
    this.marked = new Set(); // event indices to highlight (inputs of the focused op)
    this.expectScroll = -1;
    this.raf = 0;
    this.loadTimer = 0;
    this.error = null;
    this.loaded = false; // no source given yet: "loading…", never the empty text

    this.viewport = el("div", { className: "vl-viewport", attrs: { tabindex: "0" } });
    this.spacer = el("div", { className: "vl-spacer" });
    this.rows = el("div", { className: "vl-rows" });
    this.empty = el("div", { className: "vl-empty empty-state" });
    this.viewport.append(this.spacer, this.rows);
    host.append(this.viewport, this.empty);

    this.viewport.addEventListener("scroll", () => this.onScroll());
    this.viewport.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    this.rows.addEventListener("click", (e) => {
      const rowEl = e.target.closest(".vrow");
      if (!rowEl || rowEl.dataset.pos === undefined) return;
      const pos = Number(rowEl.dataset.pos);
      const row = this.rowAt(pos);
      if (row && this.onClick) this.onClick(row, pos, e);
    });
    new ResizeObserver(() => this.layout()).observe(this.viewport);
  }

  /** Point the list at another list (kind + filter); resets the scroll position. */
  setSource(kind, filter, total) {
    this.loaded = true;
    this.kind = kind;
    this.filter = { ...filter };
    this.total = total;
    this.pos = 0;
    this.error = null;
    this.layout();
  }

  setTotal(total) {
    if (total === this.total) return;
    this.total = total;
    this.layout();
  }

  setError(message) {
    this.error = message;
    this.schedule();
  }

  get viewRows() {
    return Math.max(1, this.viewport.clientHeight / this.rowHeight);
  }
  get maxPos() {
    return Math.max(0, this.total - this.viewRows);
  }
  get spacerHeight() {
    return Math.min(this.total * this.rowHeight, MAX_SPACER);
  }
  get maxScroll() {
    return Math.max(0, this.spacerHeight - this.viewport.clientHeight);
  }
  /** Whether the scrollbar is scaled (more rows than the spacer can hold at full height). */
  get scaled() {
    return this.total * this.rowHeight > MAX_SPACER;
  }

  layout() {
    this.spacer.style.height = `${this.spacerHeight}px`;
    this.pos = clamp(this.pos, 0, this.maxPos);
    this.syncScrollTop();
    this.schedule();
  }

  syncScrollTop() {
    const maxPos = this.maxPos;
    const top = maxPos > 0 ? (this.pos / maxPos) * this.maxScroll : 0;
    this.expectScroll = top;
    if (Math.abs(this.viewport.scrollTop - top) >= 0.5) this.viewport.scrollTop = top;
  }

  onScroll() {
    const st = this.viewport.scrollTop;
    if (this.expectScroll >= 0 && Math.abs(st - this.expectScroll) < 1.5) {
      this.schedule();
      return;
    }
    this.expectScroll = -1;
    const maxScroll = this.maxScroll;
    this.pos = maxScroll > 0 ? (st / maxScroll) * this.maxPos : 0;
    this.schedule();
  }

  onWheel(e) {
    if (e.ctrlKey) return; // browser zoom
    e.preventDefault();
    let dy = e.deltaY;
    if (e.deltaMode === 1) dy *= this.rowHeight;
    else if (e.deltaMode === 2) dy *= this.viewport.clientHeight;
    this.setPos(this.pos + dy / this.rowHeight);
  }

  setPos(pos) {
    this.pos = clamp(pos, 0, this.maxPos);
    this.syncScrollTop();
    this.schedule();
  }

  /** Scroll so that `pos` is visible (centred when it was off screen). */
  reveal(pos, center = true) {
    const vr = this.viewRows;
    if (pos >= this.pos && pos + 1 <= this.pos + vr) return;
    if (center) this.setPos(pos - vr / 2 + 0.5);
    else if (pos < this.pos) this.setPos(pos);
    else this.setPos(pos + 1 - vr);
  }

  setSelected(index) {
    this.selectedIndex = index;
    this.schedule();
  }

  setMarked(indices) {
    this.marked = new Set(indices);
    this.schedule();
  }

  /** The row at a position if its page is cached. */
  rowAt(pos) {
    const page = this.api.cachedPage(this.kind, this.filter, Math.floor(pos / PAGE));
    if (!page) return null;
    return page.rows[pos - page.begin] || null;
  }

  /** The visible positions [first, last). */
  visibleRange() {
    const first = Math.floor(this.pos);
    const last = Math.min(this.total, Math.ceil(this.pos + this.viewRows));
    return [first, last];
  }

  schedule() {
    if (this.raf) return;
    this.raf = requestAnimationFrame(() => {
      this.raf = 0;
      this.render();
    });
  }

  render() {
    if (this.error) {
      this.empty.textContent = this.error;
      this.empty.hidden = false;
      this.empty.classList.add("error");
      this.rows.replaceChildren();
      return;
    }
    this.empty.classList.remove("error");
    if (!this.total) {
      this.empty.textContent = this.loaded ? this.emptyText : "loading…";
      this.empty.hidden = false;
      this.rows.replaceChildren();
      return;
    }
    this.empty.hidden = true;
    const rh = this.rowHeight;
    const first = Math.floor(this.pos);
    const frac = this.pos - first;
    const count = Math.min(this.total - first, Math.ceil(this.viewRows) + 2);
    this.rows.style.transform = `translateY(${this.viewport.scrollTop - frac * rh}px)`;
    const missing = new Set();
    const out = [];
    for (let i = 0; i < count; i++) {
      const pos = first + i;
      const row = this.rowAt(pos);
      let node;
      if (row) {
        node = this.renderRow(row, pos);
        if (row.index === this.selectedIndex) node.classList.add("selected");
        if (this.marked.has(row.index)) node.classList.add("marked");
      } else {
        missing.add(Math.floor(pos / PAGE));
        node = el("div", { className: "vrow loading" }, el("span", { className: "c-idx", text: "" }), el("span", { className: "muted", text: "…" }));
      }
      node.dataset.pos = String(pos);
      node.style.height = `${rh}px`;
      out.push(node);
    }
    this.rows.replaceChildren(...out);
    if (missing.size) this.load(missing);
  }

  load(pageNos) {
    clearTimeout(this.loadTimer);
    // A short delay while the thumb is being dragged through millions of rows: only the
    // pages where it stops are fetched.
    this.loadTimer = setTimeout(() => {
      const [first, last] = this.visibleRange();
      const wanted = new Set();
      for (let p = Math.floor(first / PAGE); p <= Math.floor(Math.max(first, last - 1) / PAGE); p++) wanted.add(p);
      for (const p of pageNos) {
        if (!wanted.has(p)) continue;
        const kind = this.kind;
        const filterKey = JSON.stringify(this.filter);
        this.api
          .page(kind, this.filter, p)
          .then((page) => {
            if (kind !== this.kind || filterKey !== JSON.stringify(this.filter)) return;
            if (page.total !== this.total) this.setTotal(page.total);
            this.schedule();
          })
          .catch((e) => this.setError(e.message));
      }
    }, 40);
  }
}
