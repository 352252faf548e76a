// URL state: the page's view kept in location.hash, so that reloading restores it and a copied
// URL shares it. Reading (parseHash), writing (formatHash, UrlState.write, through
// history.replaceState: no history entry per click) and noticing edits of the hash
// (UrlState's hashchange listener). What the view is, and how an edited hash is applied, stay
// with the app (app.js).
//
// The hash, e.g. #run=.&process=0&sel=e401&tab=executions&nf=1&sp=0&sf=3&sl=94
//   run, process (absent: all), sel (e<index> execution, t<index> trace), tab (executions |
//   traces), nf (only Inf/NaN), op (op type filter), sp/sf/spath/sl (source: process, file
//   index or recorded path, line).
// The diff view, e.g. #run=a&against=b: run a compared with run b (/api/diff).
// The sentinel view, e.g. #sentinel=.&sv=lead&trip=412: the history (its name in
//   /api/sentinels), the range charted (sv: lead | whole) and the trip whose lead-up it is.

import { kindLetter, kindFromLetter } from "./util.js";

/**
 * The view a hash names: {run (only when given), process, sel, tab, nf, op, src}; what the
 * hash leaves out comes back as its default (null, false or "").
 */
export function parseHash(hash) {
  const qs = new URLSearchParams(hash.replace(/^#/, ""));
  const s = {};
  if (qs.has("run")) s.run = qs.get("run");
  s.process = qs.has("process") && qs.get("process") !== "" ? Number(qs.get("process")) : null;
  const sel = qs.get("sel");
  const m = sel && /^([et])(\d+)$/.exec(sel);
  s.sel = m ? { kind: kindFromLetter(m[1]), index: Number(m[2]) } : null;
  const tab = qs.get("tab");
  s.tab = tab === "traces" || tab === "executions" ? tab : null;
  s.nf = qs.get("nf") === "1";
  s.op = qs.get("op") || "";
  if (qs.has("sl") && (qs.has("sf") || qs.has("spath"))) {
    s.src = {
      process: Number(qs.get("sp") || 0),
      file: qs.has("sf") ? Number(qs.get("sf")) : undefined,
      path: qs.get("spath") || undefined,
      line: Number(qs.get("sl")),
    };
  } else s.src = null;
  s.against = qs.get("against") || null;
  s.sentinel = qs.has("sentinel") ? qs.get("sentinel") : null;
  const sv = qs.get("sv");
  s.sv = sv === "lead" || sv === "whole" ? sv : null;
  s.trip = qs.has("trip") && /^-?\d+$/.test(qs.get("trip")) ? Number(qs.get("trip")) : null;
  return s;
}

/** The hash ("#…") of the app's state; defaults are left out. */
export function formatHash(s) {
  const qs = new URLSearchParams();
  if (s.sentinel !== null && s.sentinel !== undefined) {
    qs.set("sentinel", s.sentinel);
    if (s.sv) qs.set("sv", s.sv);
    if (s.trip !== null && s.trip !== undefined) qs.set("trip", String(s.trip));
    return "#" + qs.toString();
  }
  if (s.run !== null) qs.set("run", s.run);
  if (s.against) {
    qs.set("against", s.against);
    return "#" + qs.toString();
  }
  if (s.process !== null) qs.set("process", String(s.process));
  if (s.sel) qs.set("sel", kindLetter(s.sel.kind) + s.sel.index);
  if (s.tab) qs.set("tab", s.tab);
  if (s.nf) qs.set("nf", "1");
  if (s.op) qs.set("op", s.op);
  if (s.src) {
    qs.set("sp", String(s.src.process ?? 0));
    if (s.src.file !== undefined && s.src.file !== null) qs.set("sf", String(s.src.file));
    else if (s.src.path) qs.set("spath", s.src.path);
    qs.set("sl", String(s.src.line));
  }
  return "#" + qs.toString();
}

/**
 * The page's location.hash. `onNavigate(view)` runs when the hash changes to one this page
 * did not write itself (the user edited it, or went back), with the view parsed from it.
 */
export class UrlState {
  constructor(onNavigate) {
    this.onNavigate = onNavigate;
    this.lastHash = ""; // the hash last read or written here: its hashchange is no navigation
    window.addEventListener("hashchange", () => this.changed());
  }

  /** The view in the URL now (at boot). */
  read() {
    this.lastHash = location.hash;
    return parseHash(location.hash);
  }

  /** Put the state in the URL, replacing the current history entry. */
  write(state) {
    const hash = formatHash(state);
    if (hash !== location.hash) {
      this.lastHash = hash;
      history.replaceState(null, "", hash);
    }
  }

  changed() {
    if (location.hash === this.lastHash) return;
    this.lastHash = location.hash;
    return this.onNavigate(parseHash(location.hash));
  }
}
