// Source code (#source): a file recorded in the dump (/api/source), highlighted from the
// server's pygments token classes (each token a <span class="tok-CLS"> with textContent),
// the op's line marked and scrolled into view. The file picker (#source-file) lists every
// file whose text the dump holds (/api/source_files), the program's own files first; a file
// of the selected event's stack opens at that frame's line.

import { el, setChildren, basename } from "./util.js";

const fileKey = (process, fileIndex) => `${process ?? 0}:${fileIndex}`;

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
    this.files = new Map(); // picker value -> {process, file, path}
    this.stackLines = new Map(); // picker value -> the innermost line of the selected event's stack
    this.setFiles([]);
    picker.addEventListener("change", () => {
      const f = this.files.get(picker.value);
      if (!f) return;
      app.openSource({ process: f.process, file: f.file, line: this.stackLines.get(picker.value) ?? 0 });
    });
  }

  /**
   * The recorded files ([{process, file_index, path, host, num_lines, user}]); `procLabel`
   * (a function of the process index, or null) tells files of several processes apart.
   */
  setFiles(files, procLabel = null) {
    this.files = new Map();
    const sorted = files.slice().sort((a, b) => Number(b.user) - Number(a.user) || a.path.localeCompare(b.path) || a.process - b.process);
    const option = (f) => {
      const value = fileKey(f.process, f.file_index);
      this.files.set(value, { process: f.process, file: f.file_index, path: f.path });
      const who = procLabel ? procLabel(f.process) : "";
      return el("option", { value, text: `${basename(f.path)}${who ? " · " + who : ""}`, title: `${f.path}${f.host ? " @ " + f.host : ""} (${f.num_lines} lines)` });
    };
    const user = sorted.filter((f) => f.user).map(option);
    const lib = sorted.filter((f) => !f.user).map(option);
    const head = el("option", { value: "", text: files.length ? `${files.length} recorded file${files.length === 1 ? "" : "s"}…` : "no recorded files", disabled: true });
    setChildren(
      this.picker,
      head,
      user.length ? el("optgroup", { label: "the program" }, user) : null,
      lib.length ? el("optgroup", { label: "libraries" }, lib) : null,
    );
    this.picker.disabled = !files.length;
    this.syncPicker();
  }

  /** The selected event's stack: a picked file of it opens at its innermost frame's line. */
  setStack(stack, process) {
    this.stackLines = new Map();
    for (const f of stack || []) {
      if (Number.isInteger(f.file_index) && f.file_index >= 0) this.stackLines.set(fileKey(process, f.file_index), f.line);
    }
  }

  syncPicker() {
    const c = this.current;
    let value = "";
    if (c) {
      if (c.file !== undefined && c.file !== null && this.files.has(fileKey(c.process, c.file))) value = fileKey(c.process, c.file);
      else if (c.path) {
        for (const [k, f] of this.files) {
          if (f.process === (c.process ?? 0) && f.path === c.path) value = k;
        }
      }
    }
    this.picker.value = value;
  }

  clear(message) {
    this.key = null;
    this.current = null;
    this.lineEls = [];
    this.pathEl.textContent = "";
    delete this.section.dataset.path;
    delete this.section.dataset.line;
    setChildren(this.body, el("div", { className: "empty-state", text: message || "No source." }));
    this.syncPicker();
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
    // Plain text when the server did not highlight it (not Python, too long or too slow).
    this.pathEl.title = src.highlighted === false ? `${src.path} (shown as plain text)` : src.path;
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
