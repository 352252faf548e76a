"""The web GUI in Chromium on a JAX dump: ``tests/programs/jax_mlp.py`` (a jitted training
step whose loss takes the log of a zero, a jitted ``predict``, an eager ``jnp.log`` and
``jnp.exp``), recorded by :func:`tests.helpers.jax_mlp_dump`.

Each section must show the JAX program: the alerts and root cause (the ``log`` equation of
the jitted step), the timeline and the executions (the jitted functions' calls and the
eager primitives), the graph structure (the jaxpr's equations are the graph's ops), the
tensor summaries, the source code (the ``jnp.log`` line once the origin is clicked) and
the stack. Pages fail their test on any JavaScript error, failed request or CSP violation
(the fixtures of test_gui_browser.py, which also skip the module without Playwright or
/usr/bin/chromium, an error with NANSCOPE_REQUIRE_BROWSER=1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nanscope.server import serve_in_thread

from ..helpers import JAX_MLP, jax_mlp_dump, marked_line
from . import test_gui_browser as gui
from .test_gui_browser import api, list_indices, open_run, wait_js, wait_rows_loaded, wait_selected

# Chromium, and a page that fails its test on any error.
browser, page, page_errors = gui.browser, gui.page, gui.page_errors

PROGRAM = str(JAX_MLP)
RUN = "mlp"


def line_of(marker: str) -> int:
    """The line of the program that ends with ``# SITE:<marker>``."""
    return marked_line(PROGRAM, f"# SITE:{marker}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    dump = jax_mlp_dump(tmp_path_factory)
    assert dump.name == RUN
    srv = serve_in_thread(dump.parent, host="127.0.0.1", port=0)
    yield srv
    srv.close()


def test_origin_of_the_jax_dump_in_every_section(server: Any, page: Any) -> None:
    analysis = api(server, "/api/analysis", run=RUN)
    origin = analysis["origin"]
    assert (origin["kind"], origin["op_type"], origin["graph_name"]) == (
        "graph_execution_trace", "log", "train_step",
    )  # fmt: skip
    idx = origin["index"]
    (producer,) = [i["producer"]["index"] for i in origin["inputs"]]
    fnan = analysis["first_nan"]
    assert fnan["op_type"] == "mul"

    open_run(page, server, RUN)
    # Alerts: the total, the root cause naming the log equation and its line.
    assert "NaN" in page.text_content("#alert-total")
    page.wait_for_selector("#rootcause .rc-headline")
    assert origin["op_name"] in page.text_content("#rootcause .rc-headline")
    assert "jnp.log(p)" in page.text_content("#rootcause .rc-code")
    assert page.locator("#alerts .arow[data-op-type='log']").count() == 2  # in the graph, eager

    # The origin: the log's trace, in the list of graph traces.
    page.click(f"#rootcause a.evlink[data-kind='graph_execution_trace'][data-index='{idx}']")
    wait_selected(page, f"t{idx}")
    assert page.text_content("#detail-op") == "log"
    assert page.get_attribute("#tab-traces", "aria-selected") == "true"
    page.wait_for_selector(f"#graph-execs .vrow.selected[data-index='{idx}']")
    assert origin["op_name"] in page.text_content("#graph-execs .vrow.selected")

    # Tensor summaries: one -inf out of the log, from the one zero of its input.
    out = "#exec-detail tr[data-slot='0']"
    assert page.text_content(f"{out} td.col-neg_inf") == str(origin["counts"]["neg_inf"]) == "1"
    assert page.text_content(f"{out} td.col-zero") == str(origin["counts"]["zero"])
    zeros = page.locator("#exec-detail tr[data-input='0'] td.col-zero")
    assert zeros.text_content() == str(origin["inputs"][0]["counts"]["zero"]) == "1"
    assert zeros.is_visible()

    # Graph structure: the jaxpr's equations, the softmax's div feeding the log, the labels'
    # product reading it.
    page.wait_for_selector(f"#graph-structure .gnode[data-index='{producer}']")
    assert "div" in page.text_content(f"#graph-structure .gnode[data-index='{producer}']")
    consumer = page.locator(f"#graph-structure .gnode[data-index='{fnan['index']}']")
    assert "mul" in consumer.text_content()
    assert "train_step" in page.text_content("#graph-structure")

    # Source code: the jnp.log line, marked.
    marked = page.locator("#source .ln.marked")
    marked.wait_for()
    assert marked.get_attribute("data-line") == str(line_of("log"))
    assert "jnp.log(p)" in marked.text_content()
    assert marked.is_visible()

    # Stack: loss_fn's line innermost, train_step's call of value_and_grad outside it. A
    # click on the outer frame moves the source there; on the inner one, back to jnp.log.
    frames = page.locator("#stack .frame.user")
    assert frames.count() == 2
    assert frames.nth(0).get_attribute("data-line") == str(line_of("log"))
    assert frames.nth(0).locator(".f-func").text_content() == "loss_fn"
    assert frames.nth(1).locator(".f-func").text_content() == "train_step"
    frames.nth(1).click()
    page.wait_for_selector(f"#source[data-line='{frames.nth(1).get_attribute('data-line')}']")
    assert "value_and_grad" in page.text_content("#source .ln.marked")
    frames.nth(0).click()
    page.wait_for_selector(f"#source[data-line='{line_of('log')}'] .ln.marked")

    # The consumer's node selects the first NaN.
    consumer.click()
    wait_selected(page, f"t{fnan['index']}")
    assert page.text_content("#detail-op") == "mul"
    assert page.text_content("#exec-detail tr[data-slot='0'] td.col-nan") == "1"


def test_executions_of_the_jax_dump(server: Any, page: Any) -> None:
    """The timeline and the executions list: two training steps, predict, the eager log and
    exp; the eager log's input is the labels (zeros), its consumer the eager exp."""
    rows = api(server, "/api/executions", run=RUN, end=100)["rows"]
    assert [r["op_type"] for r in rows] == ["train_step", "train_step", "predict", "log", "exp"]
    log = rows[3]["index"]

    open_run(page, server, RUN, "&tab=executions&sel=e0")  # not the root cause's tab (traces)
    wait_js(page, "document.querySelector('.tl-wrap').dataset.total === '5'")
    wait_rows_loaded(page)
    assert list_indices(page) == [r["index"] for r in rows]
    assert page.locator("#graph-execs .vrow.nan").count() == 3  # the steps and predict
    assert page.locator("#graph-execs .vrow.inf").count() == 1  # the eager log

    page.click(f"#graph-execs .vrow[data-index='{log}']")
    wait_selected(page, f"e{log}")
    assert page.text_content("#detail-op") == "log"
    assert page.get_attribute(".tl-wrap", "data-selected") == str(log)
    assert page.text_content("#exec-detail tr[data-slot='0'] td.col-neg_inf") == "16"
    assert page.text_content("#exec-detail tr[data-input='0'] td.col-zero") == "16"
    # Data flow: the eager exp reads the log's output.
    exp = page.locator(f"#graph-structure .gnode[data-index='{rows[4]['index']}']")
    assert "exp" in exp.text_content()
    # The stack's innermost user frame is the eager call in main(); JAX's own frames fold.
    user = page.locator("#stack .frame.user").first
    assert user.get_attribute("data-line") == str(line_of("eager_log"))
    assert user.locator(".f-func").text_content() == "main"
    page.wait_for_selector(f"#source[data-line='{line_of('eager_log')}'] .ln.marked")

    # A training step: a graph call with its five outputs (the new parameters, the loss).
    page.click("#graph-execs .vrow[data-index='0']")
    wait_selected(page, "e0")
    assert page.text_content("#detail-op") == "train_step"
    assert page.locator("#exec-detail tr[data-slot]").count() == 5
    assert page.text_content("#exec-detail tr[data-slot='4'] td.col-nan") == "1"  # the loss
    user = page.locator("#stack .frame.user").first
    assert user.get_attribute("data-line") == str(line_of("train_step"))


def test_program_path_is_the_recorded_source(server: Any) -> None:
    files = api(server, "/api/source_files", run=RUN)["files"]
    user = [f["path"] for f in files if f["user"]]
    assert user == [PROGRAM]
    assert Path(PROGRAM).read_text().count("\n") == next(
        f["num_lines"] for f in files if f["path"] == PROGRAM
    )
