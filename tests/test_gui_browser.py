"""The web GUI in a real browser: Debian's Chromium driven by Playwright.

The tests walk the Debugger V2 tutorial on the PyTorch demo dump (alerts, root cause, the
``log`` op with the zeros in its input, its source line), then check the URL, the keyboard,
the virtual list over 200k graph traces, the graph structure, live updates and that
dump-derived text never becomes HTML. ``test_screenshots`` refreshes ``docs/images/gui_*.png``.

Never downloads a browser: the module is skipped without Playwright or /usr/bin/chromium.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    # CI (.ci/run) installs it and sets NANSCOPE_REQUIRE_BROWSER: there, a skip would hide the GUI.
    if os.environ.get("NANSCOPE_REQUIRE_BROWSER"):
        raise RuntimeError(f"{CHROMIUM} is not installed: apt-get install chromium")
    pytest.skip(f"{CHROMIUM} is not installed", allow_module_level=True)

from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, TraceEvent  # noqa: E402
from nanscope.server import serve_in_thread  # noqa: E402

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
BIG_TRACES = 200_000
INJECT = '<img src=x onerror="window.__pwned=1">'
OPS = [
    ("x", "Placeholder", []),
    ("MatMul", "MatMul", ["x:0"]),
    ("Softmax", "Softmax", ["MatMul:0"]),
    ("Log", "Log", ["Softmax:0"]),
    ("mul", "Mul", ["Log:0", "x:0"]),
]
BAD_BATCH, LOG_ROW = 150, 503  # trace 150503 (a Log) holds -inf, 150504 (its Mul) NaN
FIRST_INF = BAD_BATCH * 1000 + LOG_ROW


def full_health(n: int, neg_inf: int = 0, nan: int = 0) -> np.ndarray:
    v = np.zeros((n, 11))
    v[:, :4] = [-1, -1, 1, 1]
    v[:, 4] = 100
    v[:, 5], v[:, 7] = neg_inf, nan
    v[:, 8], v[:, 9] = 40, 3
    v[:, 10] = 100 - 43 - neg_inf - nan
    return v


def write_big(root: Path) -> None:
    """200k graph traces of a 5-op graph (200 calls of 1000), one -inf Log and one NaN Mul."""
    w = DumpWriter(root, "FULL_HEALTH", circular_buffer_size=-1, framework="test", rank=0)
    stack = w.capture_stack()
    w.write_graph(Graph("g", "train_step"))
    for name, op_type, inputs in OPS:
        w.write_graph_op(GraphOp("g", op_type, name, "train_step", input_names=inputs, stack=stack))
    names = [OPS[i % len(OPS)][0] for i in range(1000)]
    for call in range(BIG_TRACES // 1000):
        s = full_health(1000)
        if call == BAD_BATCH:
            s[LOG_ROW, 5] = 2
            s[LOG_ROW + 1, 7] = 2
        w.write_traces("g", names, [0] * 1000, s, step=call)
    for i in range(50):
        w.write_execution(
            ExecutionEvent("__inference_train_step_1", [i + 1], summaries=[full_health(1)[0]],
                           stack=stack, step=i, graph_id="g")
        )  # fmt: skip
    w.close()


def write_inject(root: Path) -> None:
    """Op names, types and graph names that are HTML."""
    w = DumpWriter(root, "FULL_HEALTH", circular_buffer_size=-1, framework="<b>fw</b>", rank=0)
    stack = w.capture_stack()
    w.write_graph(Graph("g", INJECT))
    w.write_graph_op(GraphOp("g", INJECT, INJECT, INJECT, output_tensor_ids=[1], stack=stack))
    for i in range(10):
        h = full_health(1, nan=1 if i == 6 else 0)[0]
        w.write_execution(ExecutionEvent(INJECT, [i + 1], [i], summaries=[h], stack=stack, step=i))
        w.write_trace(TraceEvent("g", INJECT, 0, h, step=i))
    w.close()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gui")
    write_big(root / "big")
    write_inject(root / "inject")
    return root


@pytest.fixture(scope="module")
def demo(logdir: Path) -> str:
    """The tutorial's PyTorch demo dump, as run "demo"."""
    pytest.importorskip("torch")
    out = subprocess.run(
        [sys.executable, "-m", "nanscope.examples.debug_mnist",
         "--dump_dir", str(logdir / "demo"), "--max_steps", "6"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return "demo"


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[Any]:
    srv = serve_in_thread(logdir, host="127.0.0.1", port=0)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh 1400x900 page; a JavaScript error or a failed request fails the test."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(10_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    yield pg
    ctx.close()
    assert not errors, errors


def api(server: Any, path: str, **params: Any) -> Any:
    url = server.url.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)


def open_run(page: Any, server: Any, run: str, extra: str = "") -> None:
    page.goto(f"{server.url}#run={urllib.parse.quote(run)}{extra}")
    page.wait_for_selector("body[data-ready='1']")


def wait_selected(page: Any, letter_index: str) -> None:
    page.wait_for_selector(f"body[data-selected='{letter_index}']")


def list_indices(page: Any) -> list[int]:
    return page.eval_on_selector_all(
        "#graph-execs .vrow[data-index]", "els => els.map(e => Number(e.dataset.index))"
    )


def wait_js(page: Any, expr: str, timeout_s: float = 10) -> None:
    """Wait until a JavaScript expression is true (as a function: the page's CSP forbids eval)."""
    page.wait_for_function(f"() => ({expr})", timeout=timeout_s * 1000)


def wait_rows_loaded(page: Any) -> None:
    wait_js(
        page,
        "document.querySelectorAll('#graph-execs .vrow').length > 0 && "
        "document.querySelectorAll('#graph-execs .vrow.loading').length === 0",
    )


# ---- the tutorial -------------------------------------------------------------------------


def test_tutorial_alert_to_log_op_and_its_source_line(page: Any, server: Any, demo: str) -> None:
    analysis = api(server, "/api/analysis", run=demo)
    origin = analysis["origin"]
    assert origin["op_type"] == "aten.log.default"
    idx = origin["index"]
    zeros = origin["inputs"][0]["counts"]["zero"]
    assert zeros > 0

    open_run(page, server, demo)
    # Alerts: a total, the categories, and the root cause naming the log.
    assert "NaN" in page.text_content("#alert-total")
    page.wait_for_selector("#rootcause .rc-headline")
    assert "log" in page.text_content("#rootcause")
    assert page.locator("#run-select option").count() >= 3  # big, demo, inject

    # The -inf alert jumps to the first -inf event: the log.
    page.click("#alerts .arow[data-category='neg_inf']")
    wait_selected(page, f"e{idx}")
    assert page.text_content("#detail-op") == "aten.log.default"
    assert page.get_attribute("#exec-detail", "data-index") == str(idx)
    # The zeros of the log's input are visible in the inputs table.
    zero_cell = page.locator("#exec-detail tr[data-input='0'] td.col-zero")
    assert zero_cell.text_content() == str(zeros)
    assert zero_cell.is_visible()
    # The timeline and the execution list mark the same event.
    assert page.get_attribute(".tl-wrap", "data-selected") == str(idx)
    page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{idx}']")
    # Its graph structure: the softmax feeding it, the mul reading it.
    producer = origin["inputs"][0]["producer"]["index"]
    page.wait_for_selector(f"#graph-structure .gnode[data-index='{producer}']")

    # The user's innermost frame opens the torch.log(probs) line in Source code.
    frame = page.locator("#stack .frame.user").first
    assert frame.get_attribute("data-line") == str(origin["source"]["line"])
    page.click("#stack .frame.user:has(.f-func:text-is('main'))")  # move away first
    page.wait_for_function(
        "line => document.querySelector('#source').dataset.line !== String(line)",
        arg=origin["source"]["line"],
    )
    frame.click()
    marked = page.locator("#source .ln.marked")
    marked.wait_for()
    assert "torch.log(probs)" in marked.text_content()
    assert marked.get_attribute("data-line") == str(origin["source"]["line"])
    assert marked.is_visible()
    # Tokens are highlighted as spans with pygments classes.
    assert marked.locator("span.tok-k, span.tok-kn, span.tok-nb, span.tok-n").count() > 0

    # The root cause's first-NaN link selects the mul.
    fnan = analysis["first_nan"]["index"]
    page.click(f"#rootcause a.evlink[data-index='{fnan}']")
    wait_selected(page, f"e{fnan}")
    assert page.text_content("#detail-op") == "aten.mul.Tensor"


def test_url_hash_restores_the_selection(page: Any, server: Any, demo: str) -> None:
    idx = api(server, "/api/analysis", run=demo)["origin"]["index"]
    open_run(page, server, demo)
    page.click("#alerts .arow.first")
    wait_selected(page, f"e{idx}")
    page.wait_for_selector("#source .ln.marked")
    url = page.url
    assert f"sel=e{idx}" in url and "sl=" in url

    page.reload()
    wait_selected(page, f"e{idx}")
    assert page.text_content("#detail-op") == "aten.log.default"
    line = page.locator("#source .ln.marked")
    line.wait_for()
    assert "torch.log(probs)" in line.text_content()

    # A shared URL for another selection, source line and tab opens that view.
    page.goto(f"{server.url}#run={demo}&sel=e{idx + 1}&tab=executions&nf=1")
    wait_selected(page, f"e{idx + 1}")
    assert page.is_checked("#only-nonfinite")
    assert page.text_content("#detail-op") == "aten.mul.Tensor"
    wait_rows_loaded(page)
    assert idx in list_indices(page)  # the Inf/NaN-only list starts with the log


def test_keyboard_moves_the_selection(page: Any, server: Any, demo: str) -> None:
    alerts = api(server, "/api/alerts", run=demo)
    first = alerts["first"]["index"]
    open_run(page, server, demo)
    wait_rows_loaded(page)
    page.click("#graph-execs .vrow[data-index='3']")
    wait_selected(page, "e3")
    page.keyboard.press("j")
    wait_selected(page, "e4")
    page.keyboard.press("ArrowDown")
    wait_selected(page, "e5")
    page.keyboard.press("k")
    wait_selected(page, "e4")
    page.wait_for_selector("#graph-execs .vrow.selected[data-index='4']")
    # n: the next Inf/NaN event after the selection; N: back.
    page.keyboard.press("n")
    wait_selected(page, f"e{first}")
    page.keyboard.press("n")
    wait_selected(page, f"e{first + 1}")
    page.keyboard.press("N")
    wait_selected(page, f"e{first}")
    # The timeline takes the keys once focused.
    page.keyboard.press("t")
    page.keyboard.press("j")
    wait_selected(page, f"e{first + 1}")
    assert page.get_attribute(".tl-wrap", "data-selected") == str(first + 1)
    # ? opens the help, Escape closes it; / focuses the jump box.
    page.keyboard.press("?")
    assert page.is_visible("#help")
    page.keyboard.press("Escape")
    assert not page.is_visible("#help")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "jump"
    page.keyboard.type("7")
    page.keyboard.press("Enter")
    wait_selected(page, "e7")


def test_timeline_zooms_pans_and_selects_by_click(page: Any, server: Any, demo: str) -> None:
    total = api(server, "/api/runs")
    total = next(r for r in total["runs"] if r["run"] == demo)["num_executions"]
    open_run(page, server, demo)
    wrap = page.locator(".tl-wrap")
    wait_js(page, f"document.querySelector('.tl-wrap').dataset.span === '{total}'")
    page.click("#tl-zoom-in")
    page.click("#tl-zoom-in")
    assert abs(int(wrap.get_attribute("data-span")) - total / 4) <= 1
    # The wheel zooms in further around the pointer.
    box = page.locator(".tl-canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -300)
    wait_js(page, f"Number(document.querySelector('.tl-wrap').dataset.span) < {total / 4 - 5}")
    page.click("#tl-right")
    begin, span = int(wrap.get_attribute("data-begin")), int(wrap.get_attribute("data-span"))
    assert begin > 0
    # A click selects the event under the pointer.
    page.wait_for_timeout(300)  # the zoomed view's buckets
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector("body[data-selected^='e']")
    sel = int(page.evaluate("document.body.dataset.selected").lstrip("e"))
    assert abs(sel - (begin + span / 2)) <= 2, (sel, begin, span)
    assert wrap.get_attribute("data-selected") == str(sel)
    page.click("#tl-fit")
    assert wrap.get_attribute("data-span") == str(total)


# ---- scale --------------------------------------------------------------------------------


def test_virtual_list_scrolls_200k_traces_with_bounded_dom(page: Any, server: Any) -> None:
    open_run(page, server, "big", "&tab=traces")
    wait_rows_loaded(page)
    assert list_indices(page)[0] == 0
    vp = "#graph-execs .vl-viewport"
    # 200k rows at 24 px exceed the spacer cap: the scrollbar is scaled.
    assert page.evaluate(f"document.querySelector('{vp}').scrollHeight") < BIG_TRACES * 24
    seen = []
    for frac in (0.25, 0.5, 0.75, 1.0):
        page.evaluate(
            f"f => {{ const v = document.querySelector('{vp}'); "
            "v.scrollTop = (v.scrollHeight - v.clientHeight) * f; }",
            frac,
        )
        page.wait_for_function(
            f"f => {{ const r = document.querySelector('#graph-execs .vrow[data-index]'); "
            f"return r && Math.abs(Number(r.dataset.index) - f * {BIG_TRACES}) < 200; }}",
            arg=frac,
        )
        wait_rows_loaded(page)
        idx = list_indices(page)
        assert len(idx) <= 60, len(idx)
        assert idx == list(range(idx[0], idx[0] + len(idx)))  # contiguous
        seen.append(idx)
    assert seen[-1][-1] == BIG_TRACES - 1  # the very last trace is reachable
    # The wheel scrolls by rows even with a scaled scrollbar.
    top = seen[-1][0]
    page.hover(vp)
    page.mouse.wheel(0, -24 * 10)
    wait_js(
        page,
        f"document.querySelector('#graph-execs .vrow[data-index]').dataset.index === '{top - 10}'",
    )
    # The Inf/NaN filter leaves exactly the two bad traces.
    page.check("#only-nonfinite")
    wait_js(page, "document.querySelectorAll('#graph-execs .vrow[data-index]').length === 2")
    assert list_indices(page) == [FIRST_INF, FIRST_INF + 1]
    assert page.locator("#graph-execs .vrow.nan").count() == 1
    assert page.locator("#graph-execs .vrow.inf").count() == 1


def test_graph_structure_links_to_traces(page: Any, server: Any) -> None:
    open_run(page, server, "big")
    page.click("#alerts .arow.first")
    wait_selected(page, f"t{FIRST_INF}")
    assert page.text_content("#detail-op") == "Log"
    assert "traces" in page.url and page.get_attribute("#tab-traces", "aria-selected") == "true"
    page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{FIRST_INF}']")
    # Softmax feeds the Log (the latest trace before it); the Mul reads it.
    inp = page.locator(f"#graph-structure .gnode[data-index='{FIRST_INF - 1}']")
    assert "Softmax" in inp.text_content()
    out = page.locator(f"#graph-structure .gnode[data-index='{FIRST_INF + 1}']")
    assert "mul" in out.text_content()
    out.click()
    wait_selected(page, f"t{FIRST_INF + 1}")
    assert page.text_content("#detail-op") == "Mul"
    page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{FIRST_INF + 1}']")


def test_live_dump_updates_the_page(page: Any, server: Any, logdir: Path) -> None:
    w = DumpWriter(logdir / "live", "FULL_HEALTH", circular_buffer_size=-1, rank=0)
    try:
        for i in range(5):
            w.write_execution(
                ExecutionEvent("aten.add.Tensor", [i + 1], summaries=[full_health(1)[0]])
            )
        w.flush()
        deadline = time.monotonic() + 10
        while not any(r["run"] == "live" for r in api(server, "/api/runs")["runs"]):
            assert time.monotonic() < deadline, "the server never listed the new run"
            time.sleep(0.2)
        open_run(page, server, "live")
        wait_js(page, "document.querySelector('#list-foot').textContent.startsWith('5 ')")
        assert page.text_content("#alert-total") == "none"
        for i in range(20):
            h = full_health(1, nan=1 if i == 10 else 0)[0]
            w.write_execution(ExecutionEvent("aten.mul.Tensor", [i + 6], summaries=[h], step=1))
        w.flush()
        wait_js(page, "document.querySelector('#list-foot').textContent.startsWith('25 ')", 15)
        wait_js(page, "document.querySelector('#alert-total').textContent.includes('1')", 15)
        wait_js(page, "document.querySelector('.tl-wrap').dataset.total === '25'")
        assert page.text_content("#live .live-text") == "live"
    finally:
        w.close()


def test_dump_text_is_never_html(page: Any, server: Any) -> None:
    open_run(page, server, "inject")
    page.click("#alerts .arow.first")
    page.wait_for_selector("body[data-selected^='e'], body[data-selected^='t']")
    page.click("#tab-traces")
    wait_rows_loaded(page)
    page.click("#graph-execs .vrow[data-index='6']")
    wait_selected(page, "t6")
    assert page.text_content("#detail-op") == INJECT
    assert INJECT in page.text_content("#graph-execs")
    assert INJECT in page.text_content("#graph-structure")
    assert INJECT in page.text_content("#alerts")
    assert "<b>fw</b>" in page.text_content("#run-meta")
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.querySelectorAll('b').length") == 0
    assert page.evaluate("window.__pwned") is None


# ---- screenshots for the docs -------------------------------------------------------------


def test_screenshots(page: Any, server: Any, demo: str) -> None:
    """docs/images/gui_*.png: the tutorial's view of the log op, at 1400x900."""
    idx = api(server, "/api/analysis", run=demo)["origin"]["index"]
    open_run(page, server, demo)
    page.wait_for_selector("#rootcause .rc-headline")
    page.click("#alerts .arow.first")
    wait_selected(page, f"e{idx}")
    page.wait_for_selector("#source .ln.marked")
    wait_rows_loaded(page)
    page.mouse.move(0, 0)
    time.sleep(0.3)  # let the canvas and the list settle
    IMAGES.mkdir(parents=True, exist_ok=True)
    shots = {
        "gui_full.png": None,
        "gui_alerts.png": "#alerts",
        "gui_timeline.png": "#timeline",
        "gui_graph_execs.png": "#graph-execs",
        "gui_graph_structure.png": "#graph-structure",
        "gui_source.png": "#source",
        "gui_stack.png": "#stack",
    }
    for name, selector in shots.items():
        path = IMAGES / name
        if selector is None:
            page.screenshot(path=str(path))
        else:
            page.locator(selector).screenshot(path=str(path))
        assert path.stat().st_size > 2000, name
