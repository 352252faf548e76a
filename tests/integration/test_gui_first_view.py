"""The GUI's first view in Chromium: what a page shows before anything is clicked.

A dump with a root cause opens on it: its detail, graph structure, source line and stack are
filled without a click. While the page loads (the API slowed down here) no pane says that
nothing was recorded. ``#sel=e3`` without ``run=`` opens that event of the first run. The
Headroom panel opens only when something is near a limit, and is a collapsed head otherwise.
A user who moves the view before the analysis comes in keeps it. The Alerts' op-type list
leads with the root cause's op type, marked, even where other op types hold more events. The dumps are written here
with nanscope's writer. Pages fail on any JavaScript error, failed request or CSP violation
(the fixtures of test_gui_browser.py, which also skip the module without Playwright or
/usr/bin/chromium).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope.events import DumpWriter, ExecutionEvent, Phase
from nanscope.format.proto.types_pb2 import DataType

from ..helpers import full_health
from . import test_gui_browser as gui
from .test_gui_browser import api, open_run, wait_selected

browser, page, page_errors, demo = gui.browser, gui.page, gui.page_errors, gui.demo

CAUSE_RUN, NEAR_RUN, FAR_RUN = "a_cause", "b_near", "c_far"  # runs are listed by name
ABSORBED_RUN = "d_absorbed"
STEPS = 4
BAD_STEP = 2
HALF = int(DataType.DT_HALF)
FLOAT16_MAX = 65504.0


def _write_cause(logdir: Path) -> None:
    """Per step mm -> log -> mul; at BAD_STEP the log's input holds zeros: -inf, then NaN."""
    w = DumpWriter(logdir, "FULL_HEALTH", circular_buffer_size=-1, framework="test", rank=0)
    stack = w.capture_stack()
    for step in range(STEPS):
        bad = step == BAD_STEP
        t = 10 * step
        for op, out, inp, health in (
            ("aten.mm.default", t + 1, t, full_health()),
            ("aten.log.default", t + 2, t + 1, full_health(neg_inf=2 if bad else 0)),
            ("aten.mul.Tensor", t + 3, t + 2, full_health(nan=2 if bad else 0)),
        ):
            w.write_execution(
                ExecutionEvent(op, [out], [inp], summaries=[health], stack=stack, step=step)
            )
    w.close()


def _write_absorbed(logdir: Path) -> None:
    """A -inf mask made once, added to the scores each step, absorbed by the softmax: four
    add alerts, one full alert, and no harmful cause."""
    w = DumpWriter(logdir, "FULL_HEALTH", circular_buffer_size=-1, framework="test", rank=0)
    stack = w.capture_stack()
    mask = full_health(neg_inf=2)
    w.write_execution(ExecutionEvent("aten.full.default", [1], [], summaries=[mask], stack=stack))
    for step in range(STEPS):
        t = 10 * (step + 1)
        for op, out, inp, health in (
            ("aten.mm.default", t, [t - 1], full_health()),
            ("aten.add.Tensor", t + 1, [t, 1], full_health(neg_inf=2)),
            ("aten._softmax.default", t + 2, [t + 1], full_health()),
        ):
            w.write_execution(
                ExecutionEvent(op, [out], inp, summaries=[health], stack=stack, step=step)
            )
    w.close()


def _ranges(amax: float) -> np.ndarray:
    """A FULL_HEALTH summary of a float16 output with its ranges (tfdbg2's 11 slots, then
    the largest and the smallest non-zero |x|)."""
    return np.array([-1, -1, HALF, 1, 10, 0, 0, 0, 4, 1, 5, amax, 1e-3])


def _write_levels(logdir: Path, level: float) -> None:
    """Two modules over 30 steps; `fc`'s largest |x| is ``level`` of float16's maximum."""
    w = DumpWriter(logdir, "FULL_HEALTH", circular_buffer_size=-1, framework="test", rank=0)
    stack = w.capture_stack()
    tid = 0
    for step in range(30):
        for module, amax in (("net.fc", level * FLOAT16_MAX), ("net.norm", 3.0)):
            tid += 1
            w.write_execution(
                ExecutionEvent(
                    "aten.mm.default",
                    [tid],
                    [tid - 1],
                    summaries=[_ranges(amax)],
                    stack=stack,
                    module_path=module,
                    phase=Phase.FORWARD,
                    step=step,
                )
            )
    w.close()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gui_first_view")
    _write_cause(root / CAUSE_RUN)
    _write_levels(root / NEAR_RUN, 0.8)  # past half of the maximum: a warning
    _write_levels(root / FAR_RUN, 1e-3)  # nowhere near: no warning
    _write_absorbed(root / ABSORBED_RUN)
    return root


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[Any]:
    from nanscope.server import serve_in_thread

    srv = serve_in_thread(logdir, host="127.0.0.1", port=0)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def cause(server: Any) -> dict[str, Any]:
    """The root cause the analysis names: the log at BAD_STEP."""
    an = api(server, "/api/analysis", run=CAUSE_RUN)
    assert an["verdict"] == "harmful"
    ev: dict[str, Any] = an["cause"] or an["origin"]
    assert (ev["op_type"], ev["step"], ev["kind"]) == ("aten.log.default", BAD_STEP, "execution")
    return ev


def test_the_page_opens_on_the_root_cause(page: Any, server: Any, cause: dict[str, Any]) -> None:
    idx = cause["index"]
    open_run(page, server, CAUSE_RUN)
    wait_selected(page, f"e{idx}")  # no click: the first view is the root cause
    assert page.get_attribute("#exec-detail", "data-index") == str(idx)
    assert page.text_content("#detail-op") == "aten.log.default"
    # Its graph structure: the mm that fed it.
    page.wait_for_selector(f"#graph-structure .gnode[data-index='{idx - 1}']")
    # Its source line, marked.
    line = cause["source"]["line"]
    marked = page.locator("#source .ln.marked")
    marked.wait_for()
    assert marked.get_attribute("data-line") == str(line)
    assert "capture_stack()" in (marked.text_content() or "")
    # Its stack, innermost frame first, the user's frame at that line.
    assert page.locator("#stack .frame").count() >= 1
    assert page.locator(f"#stack .frame.user[data-line='{line}']").count() >= 1
    # The list and the timeline mark it, and the URL holds it (a reload keeps it).
    page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{idx}']")
    assert page.get_attribute(".tl-wrap", "data-selected") == str(idx)
    assert f"sel=e{idx}" in page.url


def test_a_view_the_user_moved_before_the_analysis_stays_theirs(
    page: Any, server: Any, cause: dict[str, Any]
) -> None:
    held: list[Any] = []
    moved: list[bool] = []

    def hold(route: Any) -> None:  # answered once the user has moved
        if moved:
            route.continue_()
        else:
            held.append(route)

    page.route("**/api/analysis*", hold)
    open_run(page, server, CAUSE_RUN)
    while not held:
        page.wait_for_timeout(50)
    page.hover("#graph-execs .vl-viewport")
    page.mouse.wheel(0, 48)
    moved.append(True)
    for route in held:
        route.continue_()
    page.wait_for_selector("#rootcause .rc-headline")
    page.wait_for_selector("body[data-pending='0']", state="attached")
    assert not page.get_attribute("body", "data-selected")
    assert "Select an alert" in (page.text_content("#detail-body") or "")
    # The root cause is still one key away.
    page.keyboard.press("r")
    wait_selected(page, f"e{cause['index']}")


# Records, from the page's first script on, every text drawn on a canvas and whether the
# panes' visible text ever said that nothing was recorded (checked on every change).
WATCH = """
window.__drawn = [];
window.__said = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
  window.__drawn.push(String(text));
  return fillText.call(this, text, ...rest);
};
const EMPTY = /no executions recorded|no events/i;
// Not the Source pane: it shows this file, which spells the phrases out.
const PANES = "#topbar, #banner, #alerts, #timeline, #exec-detail, #graph-structure, #graph-execs, #stack";
new MutationObserver(() => {
  const text = [...document.querySelectorAll(PANES)].map((e) => e.innerText).join(" ");
  const m = EMPTY.exec(text);
  if (m) window.__said.push(m[0]);
}).observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
"""


def _slow(page: Any, pattern: str, seconds: float) -> None:
    """Delay the first request matching ``pattern`` by ``seconds``."""
    done: list[bool] = []

    def handle(route: Any) -> None:
        if not done:
            done.append(True)
            time.sleep(seconds)
        route.continue_()

    page.route(pattern, handle)


def test_no_pane_says_nothing_was_recorded_while_loading(
    page: Any, server: Any, cause: dict[str, Any]
) -> None:
    page.add_init_script(WATCH)
    _slow(page, "**/api/runs*", 1.5)
    _slow(page, "**/api/analysis*", 1.5)
    page.goto(f"{server.url}#run={CAUSE_RUN}")
    wait_selected(page, f"e{cause['index']}")
    page.wait_for_selector("body[data-pending='0']", state="attached")
    drawn: list[str] = page.evaluate("window.__drawn")
    said: list[str] = page.evaluate("window.__said")
    assert not [t for t in drawn if "no executions recorded" in t], drawn
    assert said == [], said
    assert "loading…" in drawn  # the loading window was seen (the checks above saw it)
    assert page.get_attribute(".tl-wrap", "data-state") == "ready"


def test_a_selection_without_a_run_opens_in_the_first_run(
    page: Any, server: Any, cause: dict[str, Any]
) -> None:
    runs = [r["run"] for r in api(server, "/api/runs")["runs"]]
    assert runs[0] == CAUSE_RUN
    other = cause["index"] - 2  # the mul of the step before: not the root cause
    page.goto(f"{server.url}#sel=e{other}")
    page.wait_for_selector("body[data-ready='1']")
    wait_selected(page, f"e{other}")
    assert page.text_content("#detail-op") == "aten.mul.Tensor"
    assert page.input_value("#run-select") == CAUSE_RUN
    # The analysis coming in does not replace the selection the URL named.
    page.wait_for_selector("#rootcause .rc-headline")
    page.wait_for_selector("body[data-pending='0']", state="attached")
    assert page.get_attribute("body", "data-selected") == f"e{other}"
    assert f"sel=e{other}" in page.url and f"run={CAUSE_RUN}" in page.url


def _open_headroom(page: Any, server: Any, run: str) -> None:
    open_run(page, server, run)
    page.wait_for_selector("#headroom[data-collapsed]", state="attached")
    page.wait_for_selector("body[data-pending='0']", state="attached")


def test_the_headroom_chart_is_collapsed_when_nothing_is_near_a_limit(
    page: Any, server: Any
) -> None:
    data = api(server, "/api/headroom", run=FAR_RUN)
    assert data["recorded"] and data["series"] and data["warnings"] == []
    _open_headroom(page, server, FAR_RUN)
    assert page.is_visible("#headroom")  # its head: how high the values came
    assert page.get_attribute("#headroom", "data-collapsed") == "1"
    assert page.get_attribute("#headroom-toggle", "aria-expanded") == "false"
    assert not page.is_visible("#headroom svg.hr-svg")
    sub = page.text_content("#headroom-sub") or ""
    assert "no warnings" in sub and "highest 0.1% of max" in sub
    # Opened on request: the chart, drawn at the panel's width.
    page.click("#headroom-toggle")
    page.wait_for_selector("#headroom svg.hr-svg")
    assert page.get_attribute("#headroom", "data-collapsed") == "0"
    assert page.get_attribute("#headroom-toggle", "aria-expanded") == "true"
    assert page.locator("#headroom polyline.hr-line").count() == 2


def test_the_headroom_chart_is_open_when_something_is_near_a_limit(page: Any, server: Any) -> None:
    data = api(server, "/api/headroom", run=NEAR_RUN)
    assert [w["module"] for w in data["warnings"]] == ["net.fc"]
    _open_headroom(page, server, NEAR_RUN)
    assert page.get_attribute("#headroom", "data-collapsed") == "0"
    assert page.get_attribute("#headroom-toggle", "aria-expanded") == "true"
    page.wait_for_selector("#headroom svg.hr-svg")
    assert page.locator("#headroom .hr-warn").count() == 1
    # Collapsed on request, and the choice stands when another format is measured.
    page.click("#headroom-toggle")
    assert not page.is_visible("#headroom svg.hr-svg")
    page.select_option("#headroom-format", "bfloat16")
    page.wait_for_function(
        "() => document.querySelector('#headroom-sub').textContent.includes('bfloat16')"
    )
    page.wait_for_selector("body[data-pending='0']", state="attached")
    assert page.get_attribute("#headroom", "data-collapsed") == "1"


def _op_rows(page: Any) -> list[tuple[str, str, str]]:
    """The Alerts' op-type rows, in order: (op type, count, mark)."""
    rows: list[list[str]] = page.eval_on_selector_all(
        "#alerts .a-ops .arow.op",
        """els => els.map(e => [e.dataset.opType, e.querySelector('.a-count').textContent,
                             (e.querySelector('.a-cause') || {}).textContent || ''])""",
    )
    return [(op, count, mark) for op, count, mark in rows]


def test_the_op_type_list_leads_with_the_cause(page: Any, server: Any, demo: str) -> None:
    cause = api(server, "/api/analysis", run=demo)["cause"]
    assert cause["op_type"] == "aten.log.default"
    counts = api(server, "/api/alerts", run=demo)["by_op_type"]
    assert counts[0]["op_type"] != cause["op_type"]  # the cause is not the most frequent
    open_run(page, server, demo)
    page.wait_for_selector("#rootcause .rc-headline")
    page.wait_for_selector("#alerts .a-ops .arow.op .a-cause")
    rows = _op_rows(page)
    assert rows[0][0] == "aten.log.default" and rows[0][2] == "← the cause"
    assert [r[2] for r in rows[1:]] == [""] * (len(rows) - 1)  # one row marked
    # The others as before, most events first.
    rest = [c["op_type"] for c in counts if c["op_type"] != cause["op_type"]]
    assert [r[0] for r in rows[1:]] == rest[: len(rows) - 1]
    # A click still jumps to the op type's first event.
    first = next(c for c in counts if c["op_type"] == cause["op_type"])["first_index"]
    page.click("#alerts .a-ops .arow.op.cause")
    wait_selected(page, f"e{first}")


def test_the_op_type_list_keeps_count_order_without_a_cause(page: Any, server: Any) -> None:
    an = api(server, "/api/analysis", run=ABSORBED_RUN)
    assert an["verdict"] == "absorbed" and an["cause"] is None
    assert an["origin"]["op_type"] == "aten.full.default"  # not moved up either
    open_run(page, server, ABSORBED_RUN)
    page.wait_for_selector("#rootcause .rc-headline")
    page.wait_for_selector("body[data-pending='0']", state="attached")
    assert _op_rows(page) == [("aten.add.Tensor", "4", ""), ("aten.full.default", "1", "")]
