// The client of nanscope's JSON API (src/nanscope/server/http_api.md).
// Errors come back as ApiError carrying the server's {"error": ...} line, shown as text.
// Routes are relative to the page (api/runs, not /api/runs): the same page works served at
// the root by `nanscope serve` and under a prefix, e.g. TensorBoard's /data/plugin/nanscope/.

import { LRU } from "./util.js";

export const PAGE = 200; // rows per list page (Debugger V2 uses 200 too)

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

let pending = 0;
function setPending(delta) {
  pending += delta;
  document.body.dataset.pending = String(pending);
}

/** GET a JSON route; params with null/undefined/"" values are left out. */
export async function getJSON(path, params = {}) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === null || v === undefined || v === "") continue;
    qs.set(k, String(v));
  }
  const url = qs.toString() ? `${path}?${qs}` : path;
  setPending(1);
  try {
    let resp;
    try {
      resp = await fetch(url, { headers: { Accept: "application/json" } });
    } catch (e) {
      throw new ApiError(`cannot reach the nanscope server (${e.message || e})`, 0);
    }
    let body = null;
    try {
      body = await resp.json();
    } catch {
      body = null;
    }
    if (!resp.ok) {
      const msg = body && body.error ? body.error : `HTTP ${resp.status} from ${path}`;
      throw new ApiError(msg, resp.status);
    }
    if (body === null) throw new ApiError(`bad JSON from ${path}`, resp.status);
    return body;
  } finally {
    setPending(-1);
  }
}

/**
 * Per-run data access with bounded caches. `ctx()` gives {run, generation}; every cache
 * key holds both, so a new generation (rewritten circular buffer) never reuses stale pages.
 */
export class Api {
  constructor() {
    this.run = null;
    this.generation = 0;
    this.pages = new LRU(60); // list pages: at most 60 * 200 rows in memory
    this.inflight = new Map();
    this.events = new LRU(100); // event details
    this.sources = new LRU(20);
    this.positions = new LRU(200); // position_of answers
    this.files = new Map(); // /api/source_files answers, by process
  }

  setRun(run, generation) {
    if (run !== this.run || generation !== this.generation) {
      this.pages.clear();
      this.inflight.clear();
      this.events.clear();
      this.sources.clear();
      this.positions.clear();
      this.files.clear();
    }
    this.run = run;
    this.generation = generation;
  }

  /** Totals grew (a live dump): pages that were short at the tail must be refetched. */
  dropTailPages() {
    this.positions.clear(); // totals and positions past the old tail changed
    this.files.clear(); // a live run may record more files
    for (const [key, page] of [...this.pages.map.entries()]) {
      if (page.rows.length < PAGE) this.pages.map.delete(key);
    }
  }

  params(extra = {}) {
    return { run: this.run, ...extra };
  }

  runs() {
    return getJSON("api/runs");
  }
  /** Two runs compared op by op (/api/diff): the first op where they part, side by side. */
  diff(run, against) {
    return getJSON("api/diff", { run, against });
  }
  /** The sentinel histories under the logdir: [{history, path, runs}]. */
  sentinels() {
    return getJSON("api/sentinels").then((body) => body.sentinels || []);
  }
  /** A sentinel's history (/api/sentinel): buckets of the steps, each trip's lead-up. */
  sentinel(history, params = {}) {
    return getJSON("api/sentinel", { history, ...params });
  }
  alerts(process) {
    return getJSON("api/alerts", this.params({ process }));
  }

  /** The recorded source files (of one process, or all): [{process, file_index, path, host, num_lines, user}]. */
  sourceFiles(process) {
    const key = `${this.run}|${process ?? ""}`;
    if (!this.files.has(key)) {
      const p = getJSON("api/source_files", this.params({ process })).then((body) => body.files || []);
      p.catch(() => this.files.delete(key)); // retry next time
      this.files.set(key, p);
    }
    return this.files.get(key);
  }
  analysis() {
    return getJSON("api/analysis", this.params());
  }
  /** The cross-rank verdict and each rank's rows around the spreading collective. */
  ranks(window) {
    return getJSON("api/ranks", this.params({ window }));
  }
  /** Each module's largest |x| per step over its format's largest value (or `format`'s), with the headroom warnings. */
  headroom(format) {
    return getJSON("api/headroom", this.params({ format }));
  }
  timeline(kind, begin, end, buckets, process) {
    return getJSON("api/timeline", this.params({ kind, begin, end, buckets, process }));
  }
  graphOp(process, graphId, opName, near) {
    return getJSON("api/graph_op", this.params({ process, graph_id: graphId, op_name: opName, near }));
  }
  tensor(kind, index, slot, limit) {
    return getJSON("api/tensor", this.params({ kind, index, slot, limit }));
  }

  async source(process, fileIndex, path) {
    const key = `${this.run}|${process}|${fileIndex}|${path || ""}`;
    const hit = this.sources.get(key);
    if (hit) return hit;
    const params = { process };
    if (path) params.path = path;
    else params.file = fileIndex;
    const body = await getJSON("api/source", this.params(params));
    this.sources.set(key, body);
    return body;
  }

  async event(kind, index) {
    const key = `${this.run}|${this.generation}|${kind}|${index}`;
    const hit = this.events.get(key);
    if (hit) return hit;
    const route = kind === "graph_execution_trace" ? "api/traces/" : "api/executions/";
    const body = await getJSON(route + encodeURIComponent(index), this.params());
    this.events.set(key, body);
    return body;
  }

  /** A raw list request (no cache). filter: {process, nonfinite, op_type}; extra: more params. */
  list(kind, begin, end, filter = {}, extra = {}) {
    const route = kind === "graph_execution_trace" ? "api/traces" : "api/executions";
    return getJSON(
      route,
      this.params({
        begin,
        end,
        process: filter.process,
        nonfinite: filter.nonfinite ? 1 : null,
        op_type: filter.op_type,
        ...extra,
      }),
    );
  }

  pageKey(kind, filter, pageNo) {
    return `${this.run}|${this.generation}|${kind}|${filter.process ?? ""}|${filter.nonfinite ? 1 : 0}|${filter.op_type || ""}|${pageNo}`;
  }

  /** The cached page (or undefined). */
  cachedPage(kind, filter, pageNo) {
    return this.pages.get(this.pageKey(kind, filter, pageNo));
  }

  /** Fetch (deduplicated) one page of PAGE rows; resolves to {rows, total, begin}. */
  page(kind, filter, pageNo) {
    const key = this.pageKey(kind, filter, pageNo);
    const hit = this.pages.get(key);
    if (hit) return Promise.resolve(hit);
    if (this.inflight.has(key)) return this.inflight.get(key);
    const p = this.list(kind, pageNo * PAGE, (pageNo + 1) * PAGE, filter)
      .then((body) => {
        const page = { rows: body.rows, total: body.total, begin: body.begin };
        this.pages.set(key, page);
        return page;
      })
      .finally(() => this.inflight.delete(key));
    this.inflight.set(key, p);
    return p;
  }

  /** The row at a list position (fetches its page). */
  async rowAt(kind, filter, pos) {
    const page = await this.page(kind, filter, Math.floor(pos / PAGE));
    return page.rows[pos - page.begin] || null;
  }

  /**
   * Where event `index` sits in a filtered list (one request, `position_of`): resolves to
   * {position, exact, total}; `position` is that of the first event at or after `index`
   * (null when there is none) and `exact` whether `index` itself is in the list.
   */
  positionOf(kind, filter, index) {
    const key = `${this.pageKey(kind, filter, "pos")}|${index}`;
    const hit = this.positions.get(key);
    if (hit) return Promise.resolve(hit);
    if (this.inflight.has(key)) return this.inflight.get(key);
    const p = this.list(kind, 0, 0, filter, { position_of: index })
      .then((body) => {
        const out = { position: body.position ?? null, exact: Boolean(body.exact), total: body.total };
        this.positions.set(key, out);
        return out;
      })
      .finally(() => this.inflight.delete(key));
    this.inflight.set(key, p);
    return p;
  }
}
