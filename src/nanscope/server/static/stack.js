// Stack trace (#stack): the selected event's frames, innermost first. The program's own
// frames are emphasised; runs of library frames fold behind an "N library frames" toggle.
// Clicking a frame opens it in Source code.

import { el, setChildren, basename, kindLabel } from "./util.js";

export function renderStack(host, subEl, ev, kind, app, active) {
  // Innermost first. The server marks <frozen ...> frames as library code, and gives
  // file_index -1 to a file whose text the dump does not hold.
  const frames = (ev.stack || []).slice().reverse();
  subEl.textContent = `${kindLabel(kind)} #${ev.index}: ${ev.op_type || ev.op_name || ""}`;
  if (!frames.length) {
    setChildren(host, el("div", { className: "empty-state", text: "No stack recorded for this event." }));
    return;
  }
  const out = [el("div", { className: "st-order muted small", text: `${frames.length} frames, innermost first` })];
  let i = 0;
  let depth = frames.length;
  while (i < frames.length) {
    if (frames[i].user) {
      out.push(frameRow(frames[i], ev, app, active, depth--));
      i++;
      continue;
    }
    const group = [];
    while (i < frames.length && !frames[i].user) group.push(frames[i++]);
    if (group.length === 1 && frames.every((f) => !f.user)) {
      out.push(frameRow(group[0], ev, app, active, depth--));
      continue;
    }
    const inner = el("div", { className: "st-lib", hidden: true });
    for (const f of group) inner.appendChild(frameRow(f, ev, app, active, depth--));
    const toggle = el("button", {
      className: "st-fold",
      text: `▸ ${group.length} library frame${group.length > 1 ? "s" : ""}`,
      attrs: { "aria-expanded": "false" },
      on: {
        click: () => {
          inner.hidden = !inner.hidden;
          toggle.setAttribute("aria-expanded", String(!inner.hidden));
          toggle.textContent = `${inner.hidden ? "▸" : "▾"} ${group.length} library frame${group.length > 1 ? "s" : ""}`;
        },
      },
    });
    // Unfold when the frame shown in Source code is inside.
    if (active && group.some((f) => isActive(f, active))) {
      inner.hidden = false;
      toggle.setAttribute("aria-expanded", "true");
      toggle.textContent = `▾ ${group.length} library frame${group.length > 1 ? "s" : ""}`;
    }
    out.push(toggle, inner);
  }
  setChildren(host, ...out);
}

function isActive(f, active) {
  return active && f.line === active.line && ((active.file !== undefined && active.file !== null && f.file_index === active.file) || (active.path && f.file === active.path));
}

function frameRow(f, ev, app, active, depth) {
  const recorded = Number.isInteger(f.file_index) && f.file_index >= 0;
  const row = el(
    "button",
    {
      className: `frame ${f.user ? "user" : "lib"} ${recorded ? "" : "unrecorded"} ${isActive(f, active) ? "active" : ""}`,
      title: `${f.file}:${f.line}${recorded ? "" : " (source not recorded)"}`,
      dataset: { file: f.file, line: String(f.line), fileIndex: String(f.file_index) },
      on: {
        click: () => {
          if (recorded) app.openSource({ process: ev.process ?? 0, file: f.file_index, line: f.line });
          else app.sourceNotRecorded(f);
        },
      },
    },
    el("span", { className: "f-depth", text: String(depth) }),
    el("span", { className: "f-func", text: f.function || "?" }),
    el("span", { className: "f-loc", text: `${basename(f.file)}:${f.line}` }),
  );
  return row;
}
