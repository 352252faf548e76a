// Small DOM and formatting helpers. Everything that shows dump-derived text goes through
// textContent (see el()): nothing from the dump is ever parsed as HTML.

/**
 * Create an element. `props`: className, text (textContent), title, dataset (object),
 * attrs (object of attributes), on (object of event listeners), style (object).
 * Children: nodes, strings (become text nodes), or null/false (skipped).
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "className") node.className = value;
    else if (key === "text") node.textContent = String(value);
    else if (key === "title") node.title = String(value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "attrs") for (const [a, v] of Object.entries(value)) node.setAttribute(a, String(v));
    else if (key === "on") for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else if (key === "style") Object.assign(node.style, value);
    else node[key] = value;
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

/** Replace all children of `node`. */
export function setChildren(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

const nf = new Intl.NumberFormat("en-US");
export function fmtInt(n) {
  if (n === null || n === undefined) return "–";
  return nf.format(n);
}

/** 1234567 -> "1.2M"; for compact badges. */
export function fmtCompact(n) {
  if (n === null || n === undefined) return "–";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
  if (a >= 1e4) return (n / 1e3).toFixed(a >= 1e5 ? 0 : 1) + "k";
  return String(n);
}

export function basename(path) {
  if (!path) return "";
  const parts = String(path).split(/[\\/]/);
  return parts[parts.length - 1] || String(path);
}

/** "aten.log.default" -> "log"; "aten._softmax.default" -> "_softmax"; "MatMul" -> "MatMul". */
export function shortOp(opType) {
  if (!opType) return "";
  const s = String(opType);
  if (s.startsWith("aten.") || s.startsWith("prims.")) {
    const parts = s.split(".");
    return parts[1] || s;
  }
  const stripped = s.replace(/^__(inference|forward|backward)_/, "");
  return stripped;
}

export function clamp(x, lo, hi) {
  return Math.max(lo, Math.min(hi, x));
}

/** A Map-based LRU of bounded size. */
export class LRU {
  constructor(max) {
    this.max = max;
    this.map = new Map();
  }
  get(key) {
    if (!this.map.has(key)) return undefined;
    const v = this.map.get(key);
    this.map.delete(key);
    this.map.set(key, v);
    return v;
  }
  has(key) {
    return this.map.has(key);
  }
  set(key, value) {
    if (this.map.has(key)) this.map.delete(key);
    this.map.set(key, value);
    while (this.map.size > this.max) this.map.delete(this.map.keys().next().value);
  }
  clear() {
    this.map.clear();
  }
  get size() {
    return this.map.size;
  }
}

export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

/** A labelled key/value line: <span class=k>label</span><span class=v>value</span>. */
export function kv(label, value, cls = "") {
  return el("span", { className: "kv " + cls }, el("span", { className: "kv-k", text: label }), el("span", { className: "kv-v", text: value }));
}

export function kindLetter(kind) {
  return kind === "graph_execution_trace" ? "t" : "e";
}

export function kindFromLetter(letter) {
  return letter === "t" ? "graph_execution_trace" : "execution";
}

export function kindLabel(kind) {
  return kind === "graph_execution_trace" ? "Graph trace" : "Execution";
}
