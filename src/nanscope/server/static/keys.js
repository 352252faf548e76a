// Keyboard handling: the page's shortcuts, the jump box's Enter/Escape, and the ? overlay that
// lists the shortcuts (index.html's #help). The keys only call the app (app.js); what moving,
// selecting or zooming does is the app's.
//
// Keys: j/k or ↓/↑ move in the focused list or timeline (←/→ too on the timeline), PgDn/PgUp,
//   Home/End, n/N next/previous alert, t toggles the focus, +/-/0/c zoom the timeline,
//   r root cause, / jump box, Esc closes popups, ? help. Text boxes and drop-downs keep their
//   own keys (Esc leaves them); keys with Ctrl, Meta or Alt are the browser's.

const $ = (sel) => document.querySelector(sel);

/** Wire the keyboard and the help overlay to `app`. */
export function bindKeys(app) {
  $("#help-btn").addEventListener("click", () => toggleHelp());
  $("#help-close").addEventListener("click", () => toggleHelp(false));
  $("#help").addEventListener("click", (e) => {
    if (e.target.id === "help") toggleHelp(false);
  });
  $("#jump").addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      app.jump(e.target.value.trim());
    } else if (e.key === "Escape") {
      e.target.blur();
    }
    e.stopPropagation();
  });
  document.addEventListener("keydown", (e) => onKey(app, e));
}

/** Show or hide (`show` undefined: toggle) the keyboard help. */
function toggleHelp(show) {
  const help = $("#help");
  help.hidden = show === undefined ? !help.hidden : !show;
  if (!help.hidden) $("#help-close").focus();
}

/** PgDn/PgUp's step: a list page less a row, or half the timeline's view. */
function pageStep(app) {
  return app.state.focus === "list" ? Math.max(1, Math.floor(app.vlist.viewRows) - 1) : Math.max(1, Math.floor(app.timeline.viewSpan / 2));
}

function onKey(app, e) {
  if (e.ctrlKey || e.metaKey || e.altKey) return;
  const tag = (e.target && e.target.tagName) || "";
  // Text boxes and drop-downs keep their keys; a checkbox (only Inf/NaN) leaves them to the page.
  const typing = (tag === "INPUT" && e.target.type !== "checkbox") || tag === "SELECT" || tag === "TEXTAREA";
  if (typing) {
    if (e.key === "Escape") e.target.blur();
    return;
  }
  const key = e.key;
  if (key === "Escape") {
    $("#help").hidden = true;
    $("#problems-pop").hidden = true;
    $("#toast").hidden = true;
    return;
  }
  if (!$("#help").hidden && key !== "?") return;
  const handled = () => e.preventDefault();
  switch (key) {
    case "j":
    case "ArrowDown":
      handled();
      app.move(1);
      break;
    case "k":
    case "ArrowUp":
      handled();
      app.move(-1);
      break;
    case "ArrowRight":
      if (app.state.focus === "timeline") {
        handled();
        app.move(1);
      }
      break;
    case "ArrowLeft":
      if (app.state.focus === "timeline") {
        handled();
        app.move(-1);
      }
      break;
    case "PageDown":
      handled();
      app.move(pageStep(app));
      break;
    case "PageUp":
      handled();
      app.move(-pageStep(app));
      break;
    case "Home":
      handled();
      app.moveTo(0);
      break;
    case "End":
      handled();
      app.moveTo(Infinity);
      break;
    case "n":
      handled();
      app.nextAlert(1);
      break;
    case "N":
      handled();
      app.nextAlert(-1);
      break;
    case "t":
      handled();
      app.setFocus(app.state.focus === "list" ? "timeline" : "list");
      break;
    case "+":
    case "=":
      handled();
      app.timeline.zoomButton(0.5);
      break;
    case "-":
      handled();
      app.timeline.zoomButton(2);
      break;
    case "0":
      handled();
      app.timeline.fit();
      break;
    case "c":
      handled();
      app.timeline.centerOnSelection();
      break;
    case "r":
      handled();
      if (app.rootCauseRef()) app.select(app.rootCauseRef(), { from: "key" });
      break;
    case "/":
      handled();
      $("#jump").focus();
      $("#jump").select();
      break;
    case "?":
      handled();
      toggleHelp();
      break;
    default:
  }
}
