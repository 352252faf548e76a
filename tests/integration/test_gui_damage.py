"""Damage is never clean, in the page: a damaged or cut dump shows a damage panel, never the
green "No Inf or NaN recorded".

Each dump is written by :class:`nanscope.events.DumpWriter` with its NaN late, then damaged
before the NaN: its ``.execution`` file cut in the middle of a record, or overwritten with
garbage from a record on. What is left holds no Inf/NaN, which an unguarded page would call
clean. Debian's Chromium through Playwright, as ``test_gui_browser.py``; skipped without them.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.format.records import scan
from nanscope.server import serve_in_thread

from ..helpers import chromium, full_health, require_chromium

pytest.importorskip("playwright.sync_api")
require_chromium(module_level=True)

N, NAN_AT, CUT_AT = 40, 35, 20  # the NaN comes late; the damage comes before it
ALL_CLEAR = "no inf or nan recorded"


def write_late_nan(root: Path, nan: bool = True) -> Path:
    """``N`` executions, the one at ``NAN_AT`` holding NaN (unless ``nan`` is false); returns
    the ``.execution`` file."""
    w = DumpWriter(root, "FULL_HEALTH", circular_buffer_size=-1, framework="test", rank=0)
    stack = w.capture_stack()
    for i in range(N):
        h = full_health(nan=1 if nan and i == NAN_AT else 0)
        w.write_execution(ExecutionEvent("aten.mul.Tensor", [i + 1], summaries=[h], stack=stack,
                                         step=i // 4))  # fmt: skip
    w.close()
    (execution,) = root.glob("*.execution")
    return execution


def record_offset(execution: Path, k: int) -> int:
    """The byte offset of the ``k``-th record of ``execution``."""
    data = execution.read_bytes()
    return int(scan(data, str(execution), resync_limit=0).records[k].offset)


def cut(execution: Path, k: int = CUT_AT) -> None:
    """Cut the file in the middle of record ``k`` (a torn tail: what the writer's crash leaves)."""
    at = record_offset(execution, k) + 5
    with open(execution, "r+b") as f:
        f.truncate(at)


def garble(execution: Path, k: int = CUT_AT) -> None:
    """Overwrite record ``k`` and everything after it with garbage of the same length."""
    at = record_offset(execution, k)
    size = execution.stat().st_size
    with open(execution, "r+b") as f:
        f.seek(at)
        f.write(bytes((i * 37 + 11) % 251 for i in range(size - at)))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("damage")
    cut(write_late_nan(root / "cut"))
    garble(write_late_nan(root / "garbage"))
    write_late_nan(root / "whole", nan=False)  # the control: a whole dump without Inf/NaN
    write_late_nan(root / "later", nan=False)  # damaged while the page shows it
    return root


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[Any]:
    srv = serve_in_thread(logdir, host="127.0.0.1", port=0)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; a JavaScript error, a console error or a failed request fails the test."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    pg = ctx.new_page()
    pg.set_default_timeout(15_000)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    yield pg
    ctx.close()
    assert not errors, errors


def open_run(page: Any, server: Any, run: str) -> None:
    page.goto(f"{server.url}#run={urllib.parse.quote(run)}")
    page.wait_for_selector("body[data-ready='1']")
    # The analysis is in once the root cause carries a verdict.
    page.wait_for_selector("#rootcause[data-verdict]")


def assert_no_all_clear(page: Any) -> None:
    # innerText applies the title's text-transform: the page shows it in capitals.
    shown = page.inner_text("body").lower()
    assert ALL_CLEAR not in shown, shown[:2000]
    assert ALL_CLEAR not in (page.text_content("body") or "").lower()
    assert "ok" not in (page.get_attribute("#rootcause", "class") or "").split()
    assert "ok" not in (page.get_attribute("#alert-total", "class") or "").split()


def assert_damage_panel(page: Any, logdir: Path, run: str) -> None:
    assert page.get_attribute("#rootcause", "data-verdict") == "incomplete"
    title = page.text_content("#rootcause .rc-title") or ""
    assert title.startswith("Incomplete dump: no verdict")
    items = page.locator("#rootcause .damage .dmg-item")
    assert items.count() >= 1
    files = [items.nth(i).get_attribute("data-file") for i in range(items.count())]
    offsets = [items.nth(i).get_attribute("data-offset") for i in range(items.count())]
    (execution,) = (logdir / run).glob("*.execution")
    # The cut file is named, with the byte offset where reading stopped.
    named = [o for f, o in zip(files, offsets, strict=True) if f == str(execution.resolve())]
    assert named and named[0] and named[0].isdigit(), (files, offsets)
    assert f"byte offset {named[0]}" in (page.text_content("#rootcause .damage") or "")
    # The damage panel comes first: right after the title and headline, before any note.
    classes = page.eval_on_selector("#rootcause", "el => [...el.children].map(c => c.className)")
    notes = [i for i, c in enumerate(classes) if c == "rc-note"]
    assert classes.index("damage") < min(notes, default=len(classes)), classes
    assert page.text_content("#alert-total") == "none read"
    option = page.locator(f"#run-select option[value='{run}']")
    assert option.get_attribute("data-incomplete") == "1"
    assert "incomplete" in (option.text_content() or "")


@pytest.mark.parametrize("run", ["cut", "garbage"])
def test_damaged_dump_shows_the_damage_panel_not_the_all_clear(
    page: Any, server: Any, logdir: Path, run: str
) -> None:
    open_run(page, server, run)
    assert_damage_panel(page, logdir, run)
    assert_no_all_clear(page)


def test_whole_dump_still_shows_the_all_clear(page: Any, server: Any) -> None:
    """The control: the check above is of the damage, not of a page that never says clean."""
    open_run(page, server, "whole")
    assert page.get_attribute("#rootcause", "data-verdict") == "clean"
    assert ALL_CLEAR in page.inner_text("#rootcause").lower()
    assert "ok" in (page.get_attribute("#rootcause", "class") or "").split()
    assert page.locator("#rootcause .damage").count() == 0


def test_dump_damaged_while_shown_loses_its_all_clear(page: Any, server: Any, logdir: Path) -> None:
    open_run(page, server, "later")
    assert page.get_attribute("#rootcause", "data-verdict") == "clean"
    (execution,) = (logdir / "later").glob("*.execution")
    cut(execution)
    os.utime(execution, (time.time() + 5, time.time() + 5))  # seen as changed at once
    # The page polls /api/runs every 2 s, sees the damage, and asks for the verdict again.
    page.wait_for_selector("#rootcause[data-verdict='incomplete']", timeout=20_000)
    assert_damage_panel(page, logdir, "later")
    assert_no_all_clear(page)
