"""The GUI's diff view in Chromium, on two real recordings of a small MLP (one with an injected
bug in ``fc2``'s output: tests/unit/test_api_diff.py records the pair).

Picking a second run in #compare-select shows the two runs side by side at the first op where
they part: its op type, module path, both source lines, both values and the relative error,
the injected op that only the buggy run has (on the line the program marks), the ops around it
paired, and the loss's first parted step; an op's index opens its run at that event. A run
against itself agrees. Pages fail on any JavaScript error, failed request or CSP violation
(the fixtures of test_gui_browser.py, which also skip the module without Playwright or
/usr/bin/chromium).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_api_diff import BUGGY, CLEAN, injected_line, record_pair

from . import test_gui_browser as gui
from .test_gui_browser import api, open_run, wait_selected

browser, page, page_errors, images = gui.browser, gui.page, gui.page_errors, gui.images


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gui_diff")
    program = record_pair(root)
    return root / "logs", program


@pytest.fixture(scope="module")
def server(pair: tuple[Path, Path]) -> Iterator[Any]:
    from nanscope.server import serve_in_thread

    srv = serve_in_thread(pair[0], host="127.0.0.1", port=0)
    yield srv
    srv.close()


def _fmt(x: float) -> str:
    """A value as the view writes it (six significant digits, or exponent form)."""
    a = abs(x)
    if a != 0 and (a < 1e-3 or a >= 1e6):
        mantissa, exp = f"{x:.4e}".split("e")
        return f"{mantissa}e{int(exp):+d}"
    return repr(float(f"{x:.6g}")).removesuffix(".0")


def test_two_runs_side_by_side_at_the_first_op_where_they_part(
    page: Any, server: Any, pair: tuple[Path, Path], images: Path
) -> None:
    _, program = pair
    answer = api(server, "/api/diff", run=CLEAN, against=BUGGY)
    p = answer["diff"]["parted"]

    open_run(page, server, CLEAN)
    assert page.is_visible("#compare-field")
    page.select_option("#compare-select", BUGGY)
    page.wait_for_selector("#diff-view[data-state='ready']")
    page.wait_for_selector("body[data-pending='0']", state="attached")
    assert page.locator("#diff-view").get_attribute("data-status") == "parted"
    assert page.is_hidden("#layout")
    assert f"against={BUGGY}" in page.url
    verdict = page.text_content(".df-verdict")
    assert p["op_type"] in verdict and f"step {p['step']}" in verdict
    # Both runs' sides: op, module path, source line, and their index.
    for side, run in (("a", CLEAN), ("b", BUGGY)):
        card = page.locator(f".df-side[data-run='{side}']")
        assert card.locator(".df-op").text_content() == p[side]["op_type"]
        assert card.locator(".df-module").text_content() == p[side]["module_path"]
        src = p[side]["source"]
        assert card.locator(".df-file").text_content() == f"{Path(src['file']).name}:{src['line']}"
        link = card.locator("a.df-event")
        assert link.get_attribute("data-run") == run
        assert link.get_attribute("data-index") == str(p[side]["index"])
    # Both values of the statistic that parted, and its relative error.
    out = next(o for o in p["outputs"] if o["parted"])
    row = page.locator(f".df-values tr[data-stat='{out['statistic']}']")
    assert "parted" in (row.get_attribute("class") or "")
    assert row.locator(".df-a").text_content() == _fmt(out["value_a"])
    assert row.locator(".df-b").text_content() == _fmt(out["value_b"])
    mantissa, exp = f"{out['relative_error']:.2e}".split("e")
    assert row.locator(".df-err").text_content() == f"{mantissa}e{int(exp):+d}"
    # The injected op, only in the buggy run, on the line the program marks.
    only = page.locator(".df-only")
    assert only.get_attribute("data-run") == "b"
    assert f"{program.name}:{injected_line(program)}" in only.text_content()
    assert "# <- injected" in only.text_content()
    # The ops around it: the parted pair on one line, the injected op alone on B's side.
    lines = page.locator(".df-around tr.df-line")
    assert lines.count() == len(answer["around"]["lines"])
    parted = page.locator(".df-around tr.df-line.parted")
    assert parted.locator("a.df-event").all_text_contents() == [
        f"#{p['a']['index']}",
        f"#{p['b']['index']}",
    ]
    alone = page.locator(".df-around tr.df-line.only-b a.df-event")
    assert alone.all_text_contents() == [f"#{p['only_in_one_run']['index']}"]
    # The loss.
    loss = answer["diff"]["loss"]
    step = loss["first_parted_step"] if loss else None
    block = page.locator(".df-loss")
    assert block.get_attribute("data-step") == ("" if step is None else str(step))
    if step is not None:
        assert f"first parts at step {step}" in block.text_content()
    page.screenshot(path=str(images / "gui_diff.png"))

    # An op's index opens its run at that event.
    page.click(".df-side[data-run='b'] a.df-event")
    wait_selected(page, f"e{p['b']['index']}")
    assert page.is_visible("#layout") and page.is_hidden("#diff-view")
    assert page.input_value("#run-select") == BUGGY
    assert page.text_content("#detail-op") == p["b"]["op_type"]


def test_a_run_against_itself_agrees(page: Any, server: Any) -> None:
    page.goto(f"{server.url}#run={CLEAN}&against={CLEAN}")
    page.wait_for_selector("#diff-view[data-state='ready']")
    assert page.locator("#diff-view").get_attribute("data-status") == "agree"
    assert "agree within tolerance" in page.text_content(".df-banner.agree")
    assert page.locator(".df-verdict").count() == 0
    page.click("#diff-close")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_function("!document.body.classList.contains('view-diff')")
    assert page.is_visible("#layout")
    assert "against=" not in page.url
