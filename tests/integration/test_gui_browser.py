"""The web GUI in a real browser: Debian's Chromium driven by Playwright.

The tests walk the Debugger V2 tutorial on the PyTorch demo dump (alerts, root cause, the
``log`` op with the zeros in its input, its source line), then check the URL, the keyboard,
alert navigation by ``position_of`` probes, per-process alerts of a two-rank dump, the source
file picker on TensorFlow's dump, the virtual list over 200k graph traces, the graph
structure, live updates and that dump-derived text never becomes HTML. Every page fails its
test on a JavaScript error, a failed request or a Content-Security-Policy violation.
``test_screenshots*`` refresh ``docs/images/gui_*.png`` when ``NANSCOPE_SCREENSHOTS=1``
(else they write to a temporary folder).

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

from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, TraceEvent
from nanscope.server import serve_in_thread

from ..helpers import chromium, extract_tf_dumps, require_chromium, write_small_dump

pytest.importorskip("playwright.sync_api")
require_chromium(module_level=True)

DOC_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


@pytest.fixture()
def images(tmp_path: Path) -> Path:
    """Where screenshots go: docs/images with NANSCOPE_SCREENSHOTS=1, else a temporary folder
    (so that a test run leaves the checkout as it was)."""
    return DOC_IMAGES if os.environ.get("NANSCOPE_SCREENSHOTS") else tmp_path


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


def extract_tf(root: Path) -> None:
    """TensorFlow's own FULL_HEALTH dump (tests/data/tf_dumps.tar.xz), as run "tf"."""
    extract_tf_dumps(root, only="FULL_HEALTH")
    (root / "FULL_HEALTH").rename(root / "tf")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gui")
    write_big(root / "big")
    write_inject(root / "inject")
    # Two ranks: -inf at steps 6 and 8 in rank 0, at step 3 in rank 1.
    write_small_dump(root / "ranks", n=10, bad=(6, 8), rank=0, world_size=2)
    write_small_dump(root / "ranks", n=10, bad=(3,), rank=1, world_size=2)
    extract_tf(root)
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
    with chromium() as b:
        yield b


# Reports every Content-Security-Policy violation (an inline style="...", an eval, a script
# or a fetch from elsewhere) to Python: Chromium logs its "Refused to ..." lines through the
# DevTools Log domain, which Playwright's console events never see.
CSP_WATCH = """
document.addEventListener("securitypolicyviolation", (e) =>
  window.__nanscopeCsp(`${e.violatedDirective} blocked ${e.blockedURI || "inline"}`
                       + ` at ${e.sourceFile}:${e.lineNumber} ${e.sample || ""}`));
"""


@pytest.fixture
def page_errors() -> list[str]:
    """What went wrong in the test's page: the ``page`` fixture fails the test unless empty."""
    return []


@pytest.fixture
def page(browser: Any, page_errors: list[str]) -> Iterator[Any]:
    """A fresh 1400x900 page; a JavaScript error, a console error, a failed request or a CSP
    violation fails the test."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    errors = page_errors
    ctx.expose_function("__nanscopeCsp", lambda text: errors.append(f"CSP violation: {text}"))
    ctx.add_init_script(CSP_WATCH)
    pg = ctx.new_page()
    pg.set_default_timeout(10_000)
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
    indices: list[int] = page.eval_on_selector_all(
        "#graph-execs .vrow[data-index]", "els => els.map(e => Number(e.dataset.index))"
    )
    return indices


def wait_js(page: Any, expr: str, timeout_s: float = 10) -> None:
    """Wait until a JavaScript expression is true (as a function: the page's CSP forbids eval)."""
    page.wait_for_function(f"() => ({expr})", timeout=timeout_s * 1000)


def wait_idle(page: Any) -> None:
    """Until no API request is in flight (after a short pause for debounced ones)."""
    page.wait_for_timeout(250)
    page.wait_for_selector("body[data-pending='0']", state="attached")


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
    open_run(page, server, demo, "&sel=e3")  # not the first view's root cause
    wait_selected(page, "e3")
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


def test_alert_steps_and_next_alert_take_few_requests(page: Any, server: Any, demo: str) -> None:
    """A step's row selects its first alert; with only Inf/NaN listed, n / N cost one probe."""
    step = api(server, "/api/alerts", run=demo)["by_step"][1]
    first = step["first"]["index"]
    bad = [
        r["index"] for r in api(server, "/api/executions", run=demo, nonfinite=1, end=1000)["rows"]
    ]
    k = bad.index(first)
    assert 0 < k < len(bad) - 1
    open_run(page, server, demo)
    page.click(f"#alerts .arow.step[data-step='{step['step']}']")
    wait_selected(page, f"e{first}")
    assert api(server, f"/api/executions/{first}", run=demo)["step"] == step["step"]
    page.check("#only-nonfinite")  # the keys still work with the checkbox focused
    page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{first}']")
    wait_js(page, f"document.querySelector('#alert-pos').textContent === '{k + 1} / {len(bad)}'")
    wait_idle(page)

    requests: list[str] = []
    page.on(
        "request",
        lambda r: (
            requests.append(r.url)
            if urllib.parse.urlparse(r.url).path.startswith("/api/executions")
            else None
        ),
    )
    for key, pos in (("n", k + 1), ("n", k + 2), ("N", k + 1)):
        requests.clear()
        page.keyboard.press(key)
        wait_selected(page, f"e{bad[pos]}")
        page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{bad[pos]}']")
        wait_idle(page)
        assert len(requests) <= 3, (key, requests)  # position_of, maybe a page, the detail
        assert page.text_content("#alert-pos") == f"{pos + 1} / {len(bad)}"
        assert page.get_attribute(".tl-wrap", "data-selected") == str(bad[pos])


def test_alerts_of_one_process(page: Any, server: Any) -> None:
    """Two ranks: choosing a process shows its alert counts; the root cause stays whole-run."""
    whole = api(server, "/api/alerts", run="ranks")
    rank1 = api(server, "/api/alerts", run="ranks", process=1)
    assert (whole["total"], rank1["total"]) == (6, 2)
    open_run(page, server, "ranks", "&tab=executions&sel=e0")  # not the root cause's tab
    assert page.text_content("#alert-total") == "6 NaN/∞"
    assert page.locator("#alerts .arow.step").count() == 3
    page.wait_for_selector("#rootcause .rc-title")
    assert page.locator("#rootcause .rc-scope").count() == 0
    assert page.locator("#process-select option").all_text_contents() == [
        "All (2)", "rank 0", "rank 1"
    ]  # fmt: skip

    page.select_option("#process-select", "1")
    wait_js(page, "document.querySelector('#alert-total').textContent === '2 NaN/∞'")
    assert "rank 1" in page.text_content("#alerts .a-scope")
    assert page.text_content("#rootcause .rc-scope") == "whole run"
    assert "process=1" in page.url
    steps = page.locator("#alerts .arow.step")
    assert steps.count() == 1 and steps.get_attribute("data-step") == "3"
    steps.click()
    first = rank1["by_step"][0]["first"]
    wait_selected(page, f"{first['kind'][0]}{first['index']}")
    ev = api(server, f"/api/executions/{first['index']}", run="ranks")
    assert (ev["process"], ev["step"]) == (1, 3)
    # The process filter lists rank 1 only, with the selection in it; the timeline too.
    wait_rows_loaded(page)
    assert len(list_indices(page)) == 10
    page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{first['index']}']")
    wait_js(page, "document.querySelector('.tl-wrap').dataset.total === '10'")
    wait_js(page, "document.querySelector('.tl-wrap').dataset.selected === '3'")
    # A reload keeps the process and its counts.
    page.reload()
    wait_selected(page, f"{first['kind'][0]}{first['index']}")
    wait_js(page, "document.querySelector('#alert-total').textContent === '2 NaN/∞'")
    page.select_option("#process-select", "")
    wait_js(page, "document.querySelector('#alert-total').textContent === '6 NaN/∞'")
    assert page.locator("#rootcause .rc-scope").count() == 0
    assert page.locator("#alerts .a-scope").count() == 0


def test_the_token_url_opens_the_page_and_its_requests_carry_the_token(
    page: Any, logdir: Path
) -> None:
    """A server that needs a token (as one bound beyond loopback does): its printed URL opens
    the page, the token moves from the address bar to a cookie, and the page's own requests
    (alerts, lists, details) carry it; a reload keeps working. Without it: 401."""
    srv = serve_in_thread(logdir, host="127.0.0.1", port=0, token="browser-test-token")
    try:
        assert srv.url.endswith("/?token=browser-test-token")
        page.goto(f"{srv.url}#run=ranks")
        page.wait_for_selector("body[data-ready='1']")
        assert "token" not in page.url and "run=ranks" in page.url
        assert page.text_content("#alert-total") == "6 NaN/∞"
        page.locator("#alerts .arow.step").first.click()
        page.wait_for_selector("body[data-selected^='e']")
        (cookie,) = [c for c in page.context.cookies() if c["name"] == f"nanscope_token_{srv.port}"]
        assert cookie["value"] == "browser-test-token" and cookie["httpOnly"]
        page.reload()
        page.wait_for_selector("body[data-ready='1']")
        assert page.text_content("#alert-total") == "6 NaN/∞"
        stranger = page.context.browser.new_context()
        try:
            resp = stranger.new_page().goto(f"http://127.0.0.1:{srv.port}/#run=ranks")
            assert resp is not None and resp.status == 401 and "token" in resp.text()
        finally:
            stranger.close()
    finally:
        # The page leaves first: its next poll of a closed server would be a reset
        # connection, which the page fixture counts as an error.
        page.goto("about:blank")
        srv.close()


def test_source_file_picker_lists_the_recorded_files(page: Any, server: Any) -> None:
    """TensorFlow's dump records library files too: all are listed, the program's first."""
    files = api(server, "/api/source_files", run="tf")["files"]
    assert len(files) > 10
    user = [f for f in files if f["user"]]
    lib = next(f for f in files if f["path"].endswith("/op_callbacks.py"))
    # A source line in the URL, no event: nothing selected (not the root cause's first view).
    open_run(page, server, "tf", f"&sp=0&sf={user[0]['file_index']}&sl=1")
    picker = page.locator("#source-file")
    wait_js(
        page,
        f"document.querySelectorAll('#source-file option[value]:not([value=\"\"])').length === {len(files)}",
    )
    values = picker.locator("option:not([disabled])").evaluate_all("os => os.map(o => o.value)")
    assert values[: len(user)] == [f"{f['process']}:{f['file_index']}" for f in user]
    assert picker.locator("optgroup").first.get_attribute("label") == "the program"
    # Nothing selected: a picked file opens at its top.
    page.select_option("#source-file", f"0:{lib['file_index']}")
    page.wait_for_selector(f"#source[data-path='{lib['path']}']")
    assert page.locator("#source .ln").count() == lib["num_lines"]
    assert page.locator("#source .ln.marked").count() == 0
    assert f"sf={lib['file_index']}" in page.url
    # The Log trace: its own line; then the library file opens at the stack's frame in it.
    page.click("#alerts .arow[data-op-type='Log'][data-kind='graph_execution_trace']")
    page.wait_for_selector("body[data-selected^='t']")
    tr = api(server, f"/api/traces/{page.get_attribute('#exec-detail', 'data-index')}", run="tf")
    line = tr["source"]["line"]
    page.wait_for_selector(f"#source[data-line='{line}'] .ln.marked")
    assert page.input_value("#source-file") == f"0:{user[0]['file_index']}"
    frame = next(f for f in reversed(tr["stack"]) if f["file_index"] == lib["file_index"])
    page.select_option("#source-file", f"0:{lib['file_index']}")
    marked = page.locator(f"#source[data-path='{lib['path']}'] .ln.marked")
    marked.wait_for()
    assert marked.get_attribute("data-line") == str(frame["line"])


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
    open_run(page, server, "big", "&tab=traces&sel=t0")  # not scrolled to the root cause
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
        # The writer has not closed: none in what was read, which is no all-clear yet.
        assert page.text_content("#alert-total") == "none read"
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
    # The graph panel fills in after the selection (its own request): wait for it.
    wait_js(page, "!document.querySelector('#graph-structure').textContent.includes('loading')")
    assert INJECT in page.text_content("#graph-structure")
    assert INJECT in page.text_content("#alerts")
    assert "<b>fw</b>" in page.text_content("#run-meta")
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.querySelectorAll('b').length") == 0
    assert page.evaluate("window.__pwned") is None


def test_csp_violations_fail_the_test(page: Any, server: Any, page_errors: list[str]) -> None:
    """The page sets styles only through the CSSOM; an inline style would be reported."""
    open_run(page, server, "inject")
    assert not page_errors
    page.evaluate("document.body.setAttribute('style', 'outline: 1px solid red')")
    deadline = time.monotonic() + 5
    while not any("style-src" in e for e in page_errors):
        assert time.monotonic() < deadline, page_errors
        page.wait_for_timeout(50)
    page.wait_for_timeout(300)  # the <meta> policy and the header's each report it
    assert all("style-src" in e for e in page_errors), page_errors
    page_errors.clear()  # the violation was the point


# ---- screenshots for the docs -------------------------------------------------------------


def test_screenshots(page: Any, server: Any, demo: str, images: Path) -> None:
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
    images.mkdir(parents=True, exist_ok=True)
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
        path = images / name
        if selector is None:
            page.screenshot(path=str(path))
        else:
            page.locator(selector).screenshot(path=str(path))
        assert path.stat().st_size > 2000, name


def test_screenshots_tf(page: Any, server: Any, images: Path) -> None:
    """docs/images/gui_tf_graph.png: TensorFlow's dump, the Log trace in its graph."""
    open_run(page, server, "tf")
    page.click("#alerts .arow[data-op-type='Log'][data-kind='graph_execution_trace']")
    page.wait_for_selector("body[data-selected^='t']")
    index = int(page.get_attribute("#exec-detail", "data-index"))
    assert page.text_content("#detail-op") == "Log"
    # TensorFlow's dumps record no steps; nanscope counts them from the calls of the
    # training function (docs/TENSORFLOW.md): the program's second step made the -inf.
    badge = page.locator("#exec-detail .badge", has=page.locator(".b-k", has_text="step"))
    assert badge.count() == 1 and badge.text_content().replace(" ", "").endswith("1")
    assert page.locator("#graph-execs .vrow .c-step").first.text_content() == "0"
    softmax = page.locator(f"#graph-structure .gnode[data-index='{index - 1}']")
    assert "Softmax" in softmax.text_content()
    page.wait_for_selector("#source .ln.marked")
    page.wait_for_selector("#rootcause .rc-headline")
    wait_rows_loaded(page)
    wait_idle(page)
    page.evaluate(
        "document.querySelector('#alerts .panel-body').scrollTop = 0"
    )  # the click scrolled it
    page.mouse.move(0, 0)
    path = images / "gui_tf_graph.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 2000
