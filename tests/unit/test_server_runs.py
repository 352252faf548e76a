"""The server's runs: the incremental run index, and readers of one run sharing it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.server.api import ROUTES
from nanscope.server.query import Query
from nanscope.server.runs import RunSet, SharedLock
from tests.helpers import full_health, write_small_dump


def detail(runs: RunSet, index: int) -> dict[str, Any]:
    return ROUTES["/api/executions/<int:index>"](runs, Query({}), {"index": index})


def age(root: Path, seconds: float = 60) -> None:
    """Date every directory under ``root`` ``seconds`` back (past the index's racy window)."""
    when = time.time() - seconds
    for dirpath, _, _ in os.walk(root):
        os.utime(dirpath, (when, when))


@pytest.fixture()
def listed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The directories the run index lists (``os.scandir`` calls), as they happen."""
    calls: list[str] = []
    real = os.scandir

    def scandir(path: Any) -> Any:
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)  # the index lists through os.scandir
    yield calls


def test_index_finds_runs_deep_but_not_hidden_linked_or_too_deep(tmp_path: Path) -> None:
    runs = RunSet(tmp_path, refresh_interval=0)
    assert runs.names() == []
    write_small_dump(tmp_path / "exp" / "seed1" / "run")
    write_small_dump(tmp_path / ".hidden" / "run")
    write_small_dump(tmp_path / "a" / "b" / "c" / "d" / "too-deep")
    (tmp_path / "link").symlink_to(tmp_path / "exp", target_is_directory=True)
    assert runs.names() == ["exp/seed1/run"]
    write_small_dump(tmp_path / "a" / "b" / "c" / "d")  # depth 4: found
    assert runs.names() == ["exp/seed1/run", "a/b/c/d"]


def test_index_lists_again_only_directories_that_changed(tmp_path: Path, listed: list[str]) -> None:
    """A refresh of a quiet tree stats its directories but lists none of them."""
    for i in range(30):
        (tmp_path / f"e{i}" / "s0").mkdir(parents=True)
    write_small_dump(tmp_path / "e3" / "s0" / "run")
    age(tmp_path)
    listed.clear()
    runs = RunSet(tmp_path, refresh_interval=0)
    assert runs.names() == ["e3/s0/run"]
    assert len(listed) == 62  # the first walk lists all: the root, 30 x 2, the run
    listed.clear()
    assert runs.names() == ["e3/s0/run"]
    assert listed == []
    write_small_dump(tmp_path / "e7" / "s0" / "new")
    assert runs.names() == ["e3/s0/run", "e7/s0/new"]
    # The changed directory and the new one, and the new one again while it is recent.
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in listed) == [
        "e7/s0",
        "e7/s0/new",
    ]


def test_requests_do_not_wait_for_the_index(tmp_path: Path, monkeypatch: Any) -> None:
    """While a walk of the logdir is under way, requests answer from the last index."""
    write_small_dump(tmp_path / "a")
    runs = RunSet(tmp_path, refresh_interval=0.01)
    walking, release = threading.Event(), threading.Event()
    real_scan = runs._indexes[0].scan

    def slow_scan() -> list[str]:
        walking.set()
        release.wait(30)
        return real_scan()

    monkeypatch.setattr(runs._indexes[0], "scan", slow_scan)
    walker = threading.Thread(target=runs.refresh)
    walker.start()
    try:
        assert walking.wait(10)
        answered: list[Any] = []
        client = threading.Thread(
            target=lambda: answered.append(ROUTES["/api/runs"](runs, Query({}), {}))
        )
        client.start()
        client.join(10)
        assert answered and [r["run"] for r in answered[0]["runs"]] == ["a"]
    finally:
        release.set()
        walker.join(10)


def test_watcher_finds_new_runs_and_stops(tmp_path: Path) -> None:
    runs = RunSet(tmp_path, refresh_interval=0.05)
    runs.watch()
    write_small_dump(tmp_path / "late")
    deadline = time.monotonic() + 10
    while runs.names() != ["late"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs.names() == ["late"]
    runs.close()
    assert not any(t.name == "nanscope-runs" for t in threading.enumerate())


def test_readers_of_one_run_do_not_wait_for_each_other(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=20)
    runs = RunSet(tmp_path)
    run = runs.get(None)
    with run.reading() as reader:
        assert reader.num_executions() == 20
        # Another request decodes while this one still reads.
        answered: list[dict[str, Any]] = []
        client = threading.Thread(target=lambda: answered.append(detail(runs, 6)))
        client.start()
        client.join(10)
        assert answered and answered[0]["index"] == 6 and answered[0]["op_type"] == "op0"


def test_readers_while_the_dump_grows(tmp_path: Path) -> None:
    """Readers in many threads, catching up on every request while a writer appends:
    every answer is whole, and the last one sees every event."""
    writer = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1, flush_interval=0.01)
    writer.write_execution(ExecutionEvent("op", [1], [0], summaries=[full_health()]))
    writer.flush()
    runs = RunSet(tmp_path, refresh_interval=0)
    errors: list[BaseException] = []
    stop = threading.Event()

    def client(k: int) -> None:
        while not stop.is_set():
            try:
                n = ROUTES["/api/runs"](runs, Query({}), {})["runs"][0]["num_executions"]
                detail(runs, (n * k) // 8)
                ROUTES["/api/executions"](runs, Query({"begin": "0", "end": "50"}), {})
                ROUTES["/api/alerts"](runs, Query({}), {})
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for i in range(3000):
        writer.write_execution(
            ExecutionEvent("op", [i + 2], [i + 1], summaries=[full_health()], step=i)
        )
    writer.close()
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert ROUTES["/api/runs"](runs, Query({}), {})["runs"][0]["num_executions"] == 3001


def test_shared_lock_lets_a_waiting_writer_go_first() -> None:
    """A refresh waiting for readers is not starved by readers arriving after it."""
    lock = SharedLock()
    order: list[str] = []

    def write() -> None:
        with lock.exclusive():
            order.append("w")

    def read() -> None:
        with lock.shared():
            order.append("r")

    writer, reader = threading.Thread(target=write), threading.Thread(target=read)
    with lock.shared():
        writer.start()
        time.sleep(0.1)  # the writer waits for this reader
        reader.start()
        time.sleep(0.1)
        assert order == []  # the late reader waits behind the writer
    writer.join(10)
    reader.join(10)
    assert order == ["w", "r"]
