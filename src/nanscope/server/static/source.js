// Source code (#source): a file recorded in the dump (/api/source), highlighted from the
// server's pygments token classes (each token a <span class="tok-CLS"> with textContent),
// the op's line marked and scrolled into view. The file picker lists the files of the
// selected event's stack.

import { el, setChildren, basename } from "./util.js";

export class SourceView {
  constructor(body, pathEl, picker, app) {
    this.body = body;
    this.section = body.closest("section");
    this.pathEl = pathEl;
    this.picker = picker;
    this.app = app;
    this.key = null; // the rendered file
    this.lineEls = [];
    this.marked = null;
    this.seq = 0;
    this.choices = [];
    picker.addEventListener("change", () => {
      const c = this.choices[Number(picker.value)];
      if (c) app.openSource(c);
    });
  }

  /** The files of the current stack, for the picker: [{process, file, path, line, label}]. */
  setChoices(choices) {
    this.choices = choices;
    const opts = choices.map((c, i) => el("option", { value: String(i), text: c.label, title: c.path || "" }));
    if (!choices.length) opts.push(el("option", { value: "", text: "no recorded files" }));
    setChildren(this.picker, ...opts);
    this.syncPicker();
  }

  syncPicker() {
    const i = this.choices.findIndex((c) => this.current && c.process === this.current.process && (c.file === this.current.file || (this.current.path && c.path === this.current.path)));
    this.picker.value = i >= 0 ? String(i) : "";
  }

  clear(message) {
    this.key = null;
    this.current = null;
    this.lineEls = [];
    this.pathEl.textContent = "";
    delete this.section.dataset.path;
    delete this.section.dataset.line;
    setChildren(this.body, el("div", { className: "empty-state", text: message || "No source." }));
  }

  /** Show {process, file (index) or path, line}; resolves once rendered. */
  async show(loc) {
    const seq = ++this.seq;
    const key = `${loc.process}|${loc.file ?? ""}|${loc.path || ""}`;
    this.current = loc;
    if (key !== this.key) {
      let src;
      try {
        src = await this.app.api.source(loc.process ?? 0, loc.file, loc.path);
      } catch (e) {
        if (seq !== this.seq) return;
        this.key = null;
        this.lineEls = [];
        this.pathEl.textContent = loc.path || "";
        setChildren(this.body, el("div", { className: "error", text: e.message }));
        this.section.dataset.line = "";
        this.syncPicker();
        return;
      }
      if (seq !== this.seq) return;
      this.render(src);
      this.key = key;
      // Remember what this file is called the other way round, so the picker matches.
      this.current = { ...loc, file: src.file_index, path: src.path };
    } else {
      this.current = { ...loc, file: this.current.file ?? loc.file, path: this.current.path || loc.path };
    }
    this.mark(loc.line);
    this.syncPicker();
  }

  render(src) {
    this.pathEl.textContent = `${src.path}${src.host ? " @ " + src.host : ""}`;
    this.pathEl.title = src.path;
    this.section.dataset.path = src.path;
    const frag = document.createDocumentFragment();
    this.lineEls = [];
    const width = String(src.num_lines || src.lines.length).length;
    src.lines.forEach((tokens, i) => {
      const code = el("span", { className: "ln-code" });
      for (const [cls, text] of tokens) {
        if (!text) continue;
        code.appendChild(cls ? el("span", { className: `tok-${cls}`, text }) : document.createTextNode(text));
      }
      const line = el("div", { className: "ln", dataset: { line: String(i + 1) } }, el("span", { className: "ln-no", text: String(i + 1).padStart(width, " ") }), code);
      this.lineEls.push(line);
      frag.appendChild(line);
    });
    this.marked = null;
    setChildren(this.body, el("div", { className: "code-lines" }, frag));
  }

  mark(lineNo) {
    if (this.marked) this.marked.classList.remove("marked");
    this.marked = null;
    this.section.dataset.line = lineNo ? String(lineNo) : "";
    const line = lineNo ? this.lineEls[lineNo - 1] : null;
    if (!line) return;
    line.classList.add("marked");
    this.marked = line;
    // Centre the line inside the panel (not scrollIntoView: that would scroll the page too).
    const body = this.body;
    const top = line.offsetTop - body.clientHeight / 2 + line.offsetHeight / 2;
    body.scrollTop = Math.max(0, top);
  }
}

/** The picker's entries for a stack: one per recorded file, innermost first. */
export function stackChoices(stack, process) {
  const seen = new Map();
  for (let i = (stack || []).length - 1; i >= 0; i--) {
    const f = stack[i];
    if (f.file_index === undefined || f.file_index < 0 || /^<.*>$/.test(basename(f.file))) continue;
    if (seen.has(f.file_index)) continue;
    seen.set(f.file_index, { process, file: f.file_index, path: f.file, line: f.line, label: `${basename(f.file)}${f.user ? "" : " (library)"}` });
  }
  return [...seen.values()];
}
