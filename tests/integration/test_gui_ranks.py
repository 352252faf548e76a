"""The GUI's Ranks panel in Chromium, on a 4-rank DDP run (gloo, torchrun's static rendezvous).

Rank 2 makes -inf at step 1 and the gradient allreduce carries it to ranks 0, 1 and 3
(tests/programs/ddp_train.py). The panel must name rank 2 the origin and the others as
received through that allreduce, line up every rank's copy of it side by side, and select an
event on a click; a one-process dump shows no panel. Pages fail on any JavaScript error,
failed request or CSP violation (the fixtures of test_gui_browser.py, which also skip the
module without Playwright or /usr/bin/chromium).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..helpers import write_small_dump
from . import test_gui_browser as gui
from .test_distributed import HAS_TORCH, DdpRun, launch_ddp
from .test_gui_browser import api, open_run, wait_selected

# The browser tests' fixtures: Chromium, a page that fails its test on any error, and where
# screenshots go (docs/images with NANSCOPE_SCREENSHOTS=1, else a temporary folder).
browser, page, page_errors, images = gui.browser, gui.page, gui.page_errors, gui.images

BAD_RANK, BAD_STEP = 2, 1


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gui_ranks")
    write_small_dump(root / "single")  # one process: no Ranks panel
    return root


@pytest.fixture(scope="module")
def ddp(logdir: Path) -> DdpRun:
    if not HAS_TORCH:
        pytest.skip("needs PyTorch")
    return launch_ddp(logdir / "ddp", world=4, bad_rank=BAD_RANK, bad_step=BAD_STEP, steps=3,
                      static=True)  # fmt: skip


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[Any]:
    from nanscope.server import serve_in_thread

    srv = serve_in_thread(logdir, host="127.0.0.1", port=0)
    yield srv
    srv.close()


@pytest.mark.torch
@pytest.mark.slow
def test_ranks_panel_names_the_origin_and_lines_up_the_allreduce(
    page: Any, server: Any, ddp: DdpRun, images: Path
) -> None:
    data = api(server, "/api/ranks", run="ddp")
    ranks = data["ranks"]
    label = {p["process"]: p["label"] for p in ranks["processes"]}
    process = {p["rank"]: p["process"] for p in ranks["processes"]}
    spread = ranks["spread"]
    assert spread["op_type"] == "c10d.allreduce_.default"

    open_run(page, server, "ddp")
    page.wait_for_selector("#ranks .rk-side")
    assert page.is_visible("#ranks")
    # The root cause says how the rank was told.
    rank_line = page.text_content("#rootcause .rc-rank")
    assert rank_line == f"rank {BAD_RANK}, told by {spread['collective']['label']}"

    # (a) One row per rank: rank 2 the origin, the others received through the allreduce.
    rows = page.locator("#ranks tr.rk-row")
    assert rows.count() == 4
    assert rows.locator(".rk-label").all_text_contents() == [f"rank {r}" for r in range(4)]
    for r in range(4):
        row = page.locator(f"#ranks tr.rk-row[data-process='{process[r]}']")
        role = row.locator(".rk-role").text_content()
        if r == BAD_RANK:
            assert row.get_attribute("data-role") == "origin" and role == "origin"
            assert row.locator(".rk-first").text_content() == f"log · step {BAD_STEP}"
        else:
            assert row.get_attribute("data-role") == "received"
            via = spread["collective"]["label"]
            assert role == f"received via {via} from {label[process[BAD_RANK]]}"
            assert row.locator(".rk-first").text_content() == f"c10d.allreduce_ · step {BAD_STEP}"
            assert row.locator(".rk-time").text_content().startswith("+")  # after the birth

    # (b) One column per rank, every rank's copy of the allreduce on one line, highlighted.
    cols = page.locator("#ranks .rk-side > .rk-col")
    assert cols.count() == 4
    copies = {c["process"]: c["index"] for c in spread["copies"]}
    tops = []
    for i in range(4):
        col = cols.nth(i)
        coll = col.locator(".rk-op.coll")
        assert coll.count() == 1
        assert coll.get_attribute("data-index") == str(
            copies[int(col.get_attribute("data-process"))]
        )
        box = coll.bounding_box()
        assert box is not None
        tops.append(box["y"])
        # Highlighted: a frame the plain rows do not have.
        assert coll.evaluate("e => getComputedStyle(e).boxShadow") != "none"
        # Rows holding Inf/NaN are marked as the lists mark them: the origin's column at least.
        if int(col.get_attribute("data-process")) == process[BAD_RANK]:
            assert col.locator(".rk-op.inf, .rk-op.nan").count() > 0
    assert max(tops) - min(tops) < 1, tops

    # A click on rank 0's copy opens it: the allreduce and its collective's label.
    rank0 = page.locator(f"#ranks .rk-col[data-process='{process[0]}'] .rk-op.coll")
    rank0.click()
    wait_selected(page, f"e{copies[process[0]]}")
    assert page.text_content("#detail-op") == "c10d.allreduce_.default"
    assert spread["collective"]["label"] in page.text_content("#exec-detail .d-collective")
    assert page.text_content("#detail-sub") == "rank 0"
    # The keyboard: Enter on a table row selects that rank's first Inf/NaN.
    origin_row = page.locator(f"#ranks tr.rk-row[data-process='{process[BAD_RANK]}']")
    origin_row.focus()
    page.keyboard.press("Enter")
    wait_selected(page, f"e{ranks['origin']['index']}")
    assert page.text_content("#detail-op") == "aten.log.default"
    assert "selected" in (origin_row.get_attribute("class") or "")
    # docs/images/gui_ranks.png: rank 0's copy of the allreduce selected.
    rank0.click()
    wait_selected(page, f"e{copies[process[0]]}")
    page.locator("#ranks .rk-side").scroll_into_view_if_needed()
    page.mouse.move(0, 0)
    page.wait_for_timeout(300)
    images.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(images / "gui_ranks.png"))
    assert (images / "gui_ranks.png").stat().st_size > 2000


def test_one_process_shows_no_ranks_panel(page: Any, server: Any) -> None:
    assert api(server, "/api/ranks", run="single") == {"ranks": None}
    open_run(page, server, "single")
    page.wait_for_selector("#rootcause .rc-headline")
    page.wait_for_selector("body[data-pending='0']", state="attached")
    assert not page.is_visible("#ranks")
    assert page.locator("#rootcause .rc-rank").count() == 0
    assert "has-ranks" not in (page.get_attribute("body", "class") or "")
