"""The GUI's Headroom panel in Chromium, on a real float16 run that diverges.

``tests/programs/real/fp16_divergence.py`` (``--lr-factor 1.01``) grows the outputs of
``head (Linear)`` until float16 overflows; the report warns of it long before. The panel must
chart each module's largest ``|x|`` per step against float16's 65,504, list the warnings,
select the clicked point's execution (the module's own, at that step or later), measure
against another format on request, show no warnings for a healthy run (``--lr-factor 0.5``)
and stay hidden for a dump without ranges. Pages fail on any JavaScript error, failed
request or CSP violation (the fixtures of test_gui_browser.py, which also skip the module
without Playwright or /usr/bin/chromium).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nanscope.events import DumpWriter, ExecutionEvent

from . import test_gui_browser as gui
from .test_gui_browser import api, open_run, wait_selected

browser, page, page_errors, images = gui.browser, gui.page, gui.page_errors, gui.images

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "programs" / "real" / "fp16_divergence.py"
HEAD = "head (Linear)"


def _record(logdir: Path, *args: str) -> None:
    pytest.importorskip("torch")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "--logdir", str(logdir), str(PROGRAM), *args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]


def _write_no_tensor(logdir: Path) -> None:
    """NO_TENSOR mode: executions without summaries, so no ranges."""
    w = DumpWriter(logdir, "NO_TENSOR", circular_buffer_size=-1, framework="test", rank=0)
    stack = w.capture_stack()
    for i in range(10):
        w.write_execution(ExecutionEvent(f"op{i % 3}", [i + 1], [i], stack=stack, step=i))
    w.close()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gui_headroom")
    _write_no_tensor(root / "noranges")
    return root


@pytest.fixture(scope="module")
def diverging(logdir: Path) -> str:
    _record(logdir / "div", "--steps", "600", "--lr-factor", "1.01")
    return "div"


@pytest.fixture(scope="module")
def healthy(logdir: Path) -> str:
    _record(logdir / "ok", "--steps", "300", "--lr-factor", "0.5")
    return "ok"


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[Any]:
    from nanscope.server import serve_in_thread

    srv = serve_in_thread(logdir, host="127.0.0.1", port=0)
    yield srv
    srv.close()


def _open_chart(page: Any, server: Any, run: str) -> None:
    open_run(page, server, run)
    page.wait_for_selector("#headroom svg.hr-svg")
    page.wait_for_selector("body[data-pending='0']", state="attached")


def _point(page: Any, module: str, phase: str, at: float) -> tuple[float, float]:
    """Page coordinates of the point a fraction ``at`` along a series' (first) polyline."""
    xy: list[float] = page.evaluate(
        """([module, phase, at]) => {
             const p = [...document.querySelectorAll('#headroom polyline.hr-line')]
               .find(e => e.dataset.module === module && e.dataset.phase === phase);
             const q = p.points.getItem(Math.floor((p.points.numberOfItems - 1) * at));
             const m = p.getScreenCTM();
             return [m.a * q.x + m.c * q.y + m.e, m.b * q.x + m.d * q.y + m.f];
           }""",
        [module, phase, at],
    )
    return xy[0], xy[1]


def _badge(page: Any, key: str) -> str:
    text: str = page.evaluate(
        """key => { const b = [...document.querySelectorAll('#detail-body .badge')]
                      .find(e => e.querySelector('.b-k')?.textContent === key);
                    return b ? b.querySelector('.b-v').textContent : ''; }""",
        key,
    )
    return text


def test_headroom_chart_warns_and_links_to_the_timeline(
    page: Any, server: Any, diverging: str, images: Path
) -> None:
    data = api(server, "/api/headroom", run=diverging)
    assert data["recorded"] and data["before_step"] is not None
    assert any(s["module"] == HEAD for s in data["series"])

    _open_chart(page, server, diverging)
    assert page.is_visible("#headroom")
    assert "has-headroom" in (page.get_attribute("body", "class") or "")
    # One line per module and phase, named in the legend with its peak.
    assert page.locator("#headroom polyline.hr-line").count() >= 2
    names = page.locator("#headroom .hr-lg-name").all_text_contents()
    assert HEAD in names
    head_peak = page.locator(f"#headroom .hr-lg[data-module='{HEAD}'] .hr-lg-peak").first
    assert head_peak.text_content().endswith("%")
    # The overflow line and its label, half of max, the first Inf.
    assert "65,504" in page.text_content("#headroom .hr-overflow-label")
    assert "float16" in page.text_content("#headroom .hr-overflow-label")
    assert page.locator("#headroom line.hr-half").count() == 1
    inf = page.locator("#headroom line.hr-inf")
    assert inf.get_attribute("data-step") == str(data["before_step"])
    # The warnings, as text, each marked on its module's line where it began.
    warns = page.locator("#headroom .hr-warn-text").all_text_contents()
    assert warns and any("near overflow" in w for w in warns), warns
    assert any(HEAD in w for w in warns)
    assert page.locator("#headroom g.hr-warn-mark").count() == len(data["warnings"])

    # Hovering a point of the head's line: its module, step, |x| and share of the maximum.
    x, y = _point(page, HEAD, "forward", 0.95)
    page.mouse.move(x, y)
    page.wait_for_selector("#headroom .hr-tip:not([hidden])")
    tip = page.text_content("#headroom .hr-tip")
    assert HEAD in tip and "step " in tip and "% of float16 max" in tip and "|x| " in tip

    # A click selects the head's own execution at that step or later: the detail follows.
    page.mouse.click(x, y)
    page.wait_for_selector("#headroom .hr-chart[data-clicked-index]", state="attached")
    clicked_step = int(page.get_attribute("#headroom .hr-chart", "data-clicked-step") or -1)
    index = page.get_attribute("#headroom .hr-chart", "data-clicked-index")
    assert page.get_attribute("#headroom .hr-chart", "data-clicked-module") == HEAD
    wait_selected(page, f"e{index}")
    assert _badge(page, "module") == HEAD
    assert int(_badge(page, "step")) >= clicked_step
    # The timeline follows the selection; the chart marks its step.
    page.wait_for_selector(f".tl-wrap[data-selected='{index}']", state="attached")
    page.wait_for_selector("#headroom line.hr-sel", state="attached")

    # The keyboard: the legend entries are focusable; Enter on a warning selects its
    # module's execution at the warning's step.
    assert page.locator("#headroom .hr-lg").first.get_attribute("tabindex") == "0"
    head_warn = page.locator(f"#headroom .hr-warn[data-module='{HEAD}'][data-phase='forward']")
    warning = next(w for w in data["warnings"] if w["module"] == HEAD and w["phase"] == "forward")
    head_warn.focus()
    page.keyboard.press("Enter")
    page.wait_for_function(
        "s => document.querySelector('#headroom .hr-chart').dataset.clickedStep === s"
        " && document.querySelector('#headroom .hr-chart').dataset.clickedIndex !== undefined",
        arg=str(_nearest_step(data, warning)),
    )
    index = page.get_attribute("#headroom .hr-chart", "data-clicked-index")
    wait_selected(page, f"e{index}")
    assert _badge(page, "module") == HEAD
    assert int(_badge(page, "step")) >= warning["step"] - 1

    # docs/images/gui_headroom.png (with NANSCOPE_SCREENSHOTS=1).
    page.locator("#headroom").scroll_into_view_if_needed()
    page.mouse.move(x, y)
    page.wait_for_timeout(300)
    images.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(images / "gui_headroom.png"))
    assert (images / "gui_headroom.png").stat().st_size > 2000

    # Against float8_e4m3fn: the route is asked again and the warnings say "beyond".
    page.select_option("#headroom-format", "float8_e4m3fn")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#headroom .hr-warn-text')]"
        ".some(e => e.textContent.startsWith('beyond float8_e4m3fn'))"
    )
    assert "448" in page.text_content("#headroom .hr-overflow-label")
    assert "float8_e4m3fn" in page.text_content("#headroom-sub")
    # Levels past 1: the scale reaches above the overflow line.
    assert int(page.get_attribute("#headroom svg.hr-svg", "data-hi") or 0) > 0
    page.select_option("#headroom-format", "")
    page.wait_for_function(
        "() => document.querySelector('#headroom .hr-overflow-label')?.textContent"
        ".includes('65,504')"
    )


def _nearest_step(data: dict[str, Any], warning: dict[str, Any]) -> int:
    """The head's plotted step nearest the warning's, among points with an execution."""
    s = next(
        s
        for s in data["series"]
        if s["module"] == warning["module"] and s["phase"] == warning["phase"]
    )
    pts = [int(st) for st, i in zip(s["steps"], s["index"], strict=True) if i >= 0]
    target = int(warning["step"])
    return min(pts, key=lambda st: abs(st - target))


def test_healthy_run_has_no_warnings(page: Any, server: Any, healthy: str) -> None:
    data = api(server, "/api/headroom", run=healthy)
    assert data["recorded"] and data["warnings"] == []
    open_run(page, server, healthy)
    page.wait_for_selector("#headroom[data-collapsed='1']", state="attached")  # nothing near
    page.click("#headroom-toggle")  # opened on request
    page.wait_for_selector("#headroom svg.hr-svg")
    assert page.is_visible("#headroom")
    assert page.locator("#headroom polyline.hr-line").count() >= 2
    assert page.locator("#headroom .hr-warn").count() == 0
    assert page.locator("#headroom g.hr-warn-mark").count() == 0
    assert "No headroom warnings" in page.text_content("#headroom .hr-ok")
    assert page.locator("#headroom line.hr-inf").count() == 0  # no Inf: no marker


def test_dump_without_ranges_shows_no_panel(page: Any, server: Any) -> None:
    data = api(server, "/api/headroom", run="noranges")
    assert data["recorded"] is False and data["series"] == []
    open_run(page, server, "noranges")
    page.wait_for_selector("#rootcause .rc-title")  # the analysis is in: the panel was asked
    page.wait_for_selector("body[data-pending='0']", state="attached")
    assert not page.is_visible("#headroom")
    assert "has-headroom" not in (page.get_attribute("body", "class") or "")
