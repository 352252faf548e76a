"""The GUI's sentinel view in Chromium, on sentinel logdirs written with the sentinel's own
:class:`HistoryWriter` and a real replay dump (``nanscope run`` of a log of zero).

A page opened on a logdir with a history shows it first: the trip, "replayed: <headline>" (the
replay run's own headline), and the loss, gradient norm and largest |x| per step up to the trip,
the trip marked and the step with Inf/NaN flagged. The link opens the replay's run on its root
cause (the first view), and the run leads back. A history without an end says it is incomplete
and gives no all-clear; a replay that did not reproduce says so; a complete history without
trips gives the all-clear. Pages fail on any JavaScript error, failed request or CSP violation
(the fixtures of test_gui_browser.py, which also skip the module without Playwright or
/usr/bin/chromium).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nanscope.server.runs import RunSet
from tests.helpers import call, write_small_dump
from tests.unit.test_api_sentinel import TRIP, sentinel_logdir, write_history

from . import test_gui_browser as gui
from .test_gui_browser import api, wait_selected

browser, page, page_errors, images = gui.browser, gui.page, gui.page_errors, gui.images

MAIN, CRASHED, FLAKY, HEALTHY = "a_main", "b_crashed", "c_flaky", "d_ok"
REPLAY = f"{MAIN}/replay-step-{TRIP}"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gui_sentinel")
    sentinel_logdir(root / MAIN)
    write_history(root / CRASHED, 120, trip=None, close=False)
    # Replayed, and the replay stayed finite: its dump is clean.
    write_history(root / FLAKY, 300, 250, reproduced=False)
    write_small_dump(root / FLAKY / "replay-step-250", bad=())
    write_history(root / HEALTHY, 100, trip=None)
    return root


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[Any]:
    from nanscope.server import serve_in_thread

    srv = serve_in_thread(logdir, host="127.0.0.1", port=0)
    yield srv
    srv.close()


def _open(page: Any, server: Any, hash_: str = "") -> None:
    page.goto(f"{server.url}{hash_}")
    page.wait_for_selector("#sentinel-view[data-state='ready']")
    page.wait_for_selector("body[data-pending='0']", state="attached")


def test_the_history_shows_first_with_the_trip_and_its_replay(
    page: Any, server: Any, logdir: Path, images: Path
) -> None:
    replay = call(RunSet(logdir), "/api/analysis", run=REPLAY)
    _open(page, server)
    view = page.locator("#sentinel-view")
    assert view.get_attribute("data-mode") == "lead"
    assert view.get_attribute("data-trip") == str(TRIP)
    assert view.get_attribute("data-complete") == "1"
    assert page.is_hidden("#layout")
    assert page.input_value("#run-select") == f"sentinel:{MAIN}"
    assert f"sentinel={MAIN}" in page.url
    # The trip: its step, what saw Inf/NaN, and the replay's own headline.
    trip = page.locator(f".sn-trip[data-step='{TRIP}']")
    assert "Inf/NaN in loss, gradients" in trip.text_content()
    assert "the run stopped" in trip.text_content()
    link = trip.locator("a.sn-replay")
    assert link.text_content() == f"replayed: {replay['headline']}"
    assert page.locator(".sn-banner").count() == 0  # complete, reproduced: nothing to warn of
    # Three charts up to the trip, the trip marked in each, the bad step flagged.
    for series in ("loss", "grad_norm", "amax"):
        chart = page.locator(f".sn-chart[data-series='{series}']")
        assert chart.locator("polyline.sn-line").count() >= 1, series
        assert chart.locator(f"line.sn-trip-line[data-step='{TRIP}']").count() == 1
        assert chart.locator(f"g.sn-nonfinite[data-step='{TRIP}']").count() == 1, series
        assert chart.locator("svg").get_attribute("data-to") == str(TRIP)
    # Over the lead-up the gradient norm grows 12-fold: a linear scale (log past 100-fold).
    assert (
        page.locator(".sn-chart[data-series='grad_norm']").get_attribute("data-scale") == "linear"
    )
    legend = page.locator(".sn-chart-box:has(.sn-chart[data-series='amax']) .sn-lg")
    assert "head (Linear)" in legend.all_text_contents()
    # Hovering: the step and its figures.
    box = page.locator(".sn-chart[data-series='loss'] svg").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
    tip = page.locator(".sn-chart-box:has(.sn-chart[data-series='loss']) .sn-tip")
    tip.wait_for(state="visible")
    assert "step " in tip.text_content() and "loss: " in tip.text_content()
    page.mouse.move(0, 0)
    page.screenshot(path=str(images / "gui_sentinel.png"))

    # The whole history: buckets from the first step to the trip.
    page.click("#sn-whole")
    page.wait_for_selector("#sentinel-view[data-mode='whole']")
    assert "sv=whole" in page.url
    svg = page.locator(".sn-chart[data-series='loss'] svg")
    assert (svg.get_attribute("data-from"), svg.get_attribute("data-to")) == ("0", str(TRIP))
    assert page.locator(".sn-chart[data-series='grad_norm']").get_attribute("data-scale") == "log"
    assert page.locator(".sn-chart[data-series='loss'] polygon.sn-band").count() >= 1

    # The replay opens on its root cause, as the first view of any run does.
    page.click("a.sn-replay")
    cause = replay["cause"]["index"]
    wait_selected(page, f"e{cause}")
    assert page.is_visible("#layout") and page.is_hidden("#sentinel-view")
    assert page.input_value("#run-select") == REPLAY
    assert page.text_content("#detail-op") == replay["cause"]["op_type"]
    back = page.locator("#sentinel-back")
    assert back.is_visible() and str(TRIP) in back.text_content()
    back.click()
    page.wait_for_selector(f"#sentinel-view[data-state='ready'][data-trip='{TRIP}']")
    assert page.is_hidden("#layout")


def test_a_history_without_an_end_gives_no_all_clear(page: Any, server: Any) -> None:
    _open(page, server, f"#sentinel={CRASHED}")
    view = page.locator("#sentinel-view")
    assert view.get_attribute("data-complete") == "0"
    assert view.get_attribute("data-mode") == "whole"  # no trip: the whole history
    banner = page.locator(".sn-banner.incomplete")
    assert "Incomplete history" in banner.text_content()
    assert "no all-clear" in banner.text_content()
    assert any("has no end" in p for p in banner.locator(".sn-problem").all_text_contents())
    assert page.locator(".sn-banner.ok").count() == 0
    assert page.locator(".sn-chart[data-series='loss'] svg").get_attribute("data-to") == "119"


def test_a_replay_that_did_not_reproduce_says_so(page: Any, server: Any) -> None:
    _open(page, server, f"#sentinel={FLAKY}")
    banner = page.locator(".sn-banner.not-reproduced[data-step='250']")
    assert "did not reproduce" in banner.text_content()
    assert "not deterministic" in banner.text_content()
    link = page.locator(".sn-trip[data-step='250'] a.sn-replay")
    assert link.get_attribute("data-run") == f"{FLAKY}/replay-step-250"
    assert "replayed without Inf/NaN" in link.text_content()
    assert api(server, "/api/sentinel", history=FLAKY)["trips"][0]["reproduced"] is False


def test_a_complete_history_without_trips_is_the_all_clear(page: Any, server: Any) -> None:
    _open(page, server, f"#sentinel={HEALTHY}")
    ok = page.locator(".sn-banner.ok")
    assert "No Inf/NaN in the 100 steps the sentinel checked" in ok.text_content()
    assert page.locator(".sn-banner").count() == 1
    assert page.locator(".sn-trip").count() == 0
