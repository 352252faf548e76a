// Rendering of tensor health `Counts` ({size, neg_inf, pos_inf, nan, neg, zero, pos, dtype}).

import { el, fmtInt, fmtCompact } from "./util.js";

// Stacking order of the breakdown bar, and the column order of count tables.
export const CATS = [
  { key: "neg", label: "−", name: "negative" },
  { key: "zero", label: "0", name: "zero" },
  { key: "pos", label: "+", name: "positive" },
  { key: "neg_inf", label: "−∞", name: "-inf" },
  { key: "pos_inf", label: "+∞", name: "+inf" },
  { key: "nan", label: "NaN", name: "NaN" },
];

export function hasNonfinite(c) {
  if (!c) return false;
  return (c.neg_inf || 0) + (c.pos_inf || 0) + (c.nan || 0) > 0;
}

/** "2 −∞, 996 negative, 2 zero of 1,000 float32" */
export function countsText(c) {
  if (!c) return "not recorded";
  const parts = [];
  for (const cat of [CATS[3], CATS[4], CATS[5], CATS[0], CATS[1], CATS[2]]) {
    const v = c[cat.key];
    if (v) parts.push(`${fmtInt(v)} ${cat.name}`);
  }
  const of = c.size !== null && c.size !== undefined ? ` of ${fmtInt(c.size)}` : "";
  const dtype = c.dtype ? ` ${c.dtype}` : "";
  if (!parts.length) return `${c.size === 0 ? "empty" : "no counts"}${of}${dtype}`;
  return parts.join(", ") + of + dtype;
}

/**
 * A small stacked bar of neg/zero/pos/-inf/+inf/nan. Non-finite segments get a minimum
 * width so that one NaN among a million values still shows.
 */
export function countsBar(c) {
  const bar = el("span", { className: "cbar", title: countsText(c) });
  if (!c || c.neg === null || c.neg === undefined) return bar;
  const total = CATS.reduce((s, cat) => s + (c[cat.key] || 0), 0);
  if (!total) {
    bar.classList.add("empty");
    return bar;
  }
  for (const cat of CATS) {
    const v = c[cat.key] || 0;
    if (!v) continue;
    let pct = (100 * v) / total;
    const nonfinite = cat.key === "neg_inf" || cat.key === "pos_inf" || cat.key === "nan";
    if (nonfinite) pct = Math.max(pct, 12);
    bar.appendChild(el("span", { className: `seg seg-${cat.key}`, style: { flexGrow: String(pct) } }));
  }
  return bar;
}

/** "float32" -> "f32", "bfloat16" -> "bf16", "int64" -> "i64": the list's summary column is narrow. */
export function shortDtype(dtype) {
  const m = /^(b?float|u?int|complex|bool)(\d*)$/.exec(String(dtype));
  if (!m) return String(dtype);
  const head = { float: "f", bfloat: "bf", int: "i", uint: "u", complex: "c", bool: "bool" }[m[1]];
  return head + m[2];
}

function dtypeSpan(dtype) {
  return el("span", { className: "dtype", text: shortDtype(dtype), title: dtype });
}

/** The per-mode summary of a list row (FULL_HEALTH bar, SHAPE shape, CONCISE counts, ...). */
export function summaryCell(row) {
  const c = row.counts;
  const cell = el("span", { className: "summary" });
  if (c && c.neg !== null && c.neg !== undefined) {
    cell.appendChild(countsBar(c));
    if (c.dtype) cell.appendChild(dtypeSpan(c.dtype));
    if (hasNonfinite(c)) {
      const bad = [];
      if (c.nan) bad.push(`NaN×${fmtCompact(c.nan)}`);
      if (c.neg_inf) bad.push(`−∞×${fmtCompact(c.neg_inf)}`);
      if (c.pos_inf) bad.push(`+∞×${fmtCompact(c.pos_inf)}`);
      cell.appendChild(el("span", { className: "badtxt", text: bad.join(" "), title: bad.join(" ") }));
    }
    return cell;
  }
  if (row.shape) {
    cell.appendChild(el("span", { className: "shape", text: shapeText(row.shape) }));
    if (c && c.dtype) cell.appendChild(dtypeSpan(c.dtype));
    return cell;
  }
  if (c && c.nan !== null && c.nan !== undefined) {
    const bad = [];
    if (c.nan) bad.push(`NaN×${fmtCompact(c.nan)}`);
    if (c.neg_inf) bad.push(`−∞×${fmtCompact(c.neg_inf)}`);
    if (c.pos_inf) bad.push(`+∞×${fmtCompact(c.pos_inf)}`);
    cell.appendChild(el("span", { className: "concise", text: `n=${fmtCompact(c.size)}`, title: countsText(c) }));
    cell.appendChild(el("span", { className: bad.length ? "badtxt" : "dtype", text: bad.length ? bad.join(" ") : "finite" }));
    return cell;
  }
  if (!c) {
    cell.appendChild(el("span", { className: "flag none", text: "–", title: "not recorded (the mode or the dtype filter skips this output)" }));
    return cell;
  }
  if (row.nonfinite === true) cell.appendChild(el("span", { className: "flag bad", text: "Inf/NaN" }));
  else if (row.nonfinite === false) cell.appendChild(el("span", { className: "flag ok", text: "finite" }));
  return cell;
}

export function shapeText(shape) {
  if (!shape) return "";
  return "[" + shape.map((d) => (d === null ? "?" : String(d))).join(", ") + "]";
}

/**
 * A table of counts, one row per entry: {label (node or text), counts, shape, extra}.
 * Columns: what, dtype, shape, size, −∞, +∞, NaN, −, 0, +.
 */
export function countsTable(entries, { firstHeader = "" } = {}) {
  const head = el(
    "tr",
    {},
    el("th", { text: firstHeader }),
    el("th", { text: "dtype" }),
    el("th", { text: "shape" }),
    el("th", { className: "num", text: "size" }),
    ...[CATS[3], CATS[4], CATS[5], CATS[0], CATS[1], CATS[2]].map((cat) =>
      el("th", { className: `num col-${cat.key}`, text: cat.label, title: cat.name }),
    ),
  );
  const body = el("tbody");
  for (const entry of entries) {
    const c = entry.counts;
    const tr = el("tr", { className: hasNonfinite(c) ? "bad" : "" });
    if (entry.dataset) Object.assign(tr.dataset, entry.dataset);
    tr.appendChild(el("td", { className: "what" }, entry.label));
    tr.appendChild(el("td", { className: "dtype", text: (c && c.dtype) || "" }));
    tr.appendChild(el("td", { className: "shape", text: shapeText(entry.shape) }));
    tr.appendChild(el("td", { className: "num", text: c ? fmtInt(c.size) : "–" }));
    for (const cat of [CATS[3], CATS[4], CATS[5], CATS[0], CATS[1], CATS[2]]) {
      const v = c ? c[cat.key] : null;
      const nonfinite = cat.key === "neg_inf" || cat.key === "pos_inf" || cat.key === "nan";
      const cls = ["num", `col-${cat.key}`];
      if (v && nonfinite) cls.push("hot");
      if (v === 0) cls.push("nil");
      if (v === null || v === undefined) cls.push("na");
      tr.appendChild(el("td", { className: cls.join(" "), text: c ? fmtInt(v) : "–", title: cat.name }));
    }
    body.appendChild(tr);
  }
  return el("table", { className: "counts" }, el("thead", {}, head), body);
}
