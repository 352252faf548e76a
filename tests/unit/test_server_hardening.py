"""The server against what a dump or a client can make it do: strings from a dump are data,
damage is never clean.

A crafted source file must not stall the server (highlighting is bounded and runs outside
the run's lock), a client asking for ever new filters must not grow its memory, odd static
names are 404, every loopback address the server binds answers, and a damaged dump carries
``verdict: incomplete`` with what is missing, never an all-clear.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client

from nanscope.format import files
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import frame, scan
from nanscope.server.app import App
from nanscope.server.runs import MAX_BOUNDED, RunSet
from nanscope.server.source import HIGHLIGHT_SECONDS, Highlighter
from tests import crafted
from tests.helpers import call, full_health, write_small_dump

# A PHP string full of "${a": pygments' PhpLexer rescans the rest of the text at each one
# (quadratic): 120 KB took 38 s on a 2-core CI box before highlighting was bounded.
HOSTILE_PHP = '<?php "' + "${a" * 40_000
# The same trouble in Python's lexer: "'\N{" rescans to the end at each one (160 KB: 19 s).
HOSTILE_PY = "'\\N{" * 100_000
# Generous: the budget is 2 s; a loaded 2-core machine may take a few more.
BOUND_S = 10.0


def write_source_dump(logdir: Path, path: str, lines: list[str]) -> Path:
    """A crafted one-event dump whose ``.source_files`` records ``path`` with ``lines``."""
    execution = crafted.write_dump(
        logdir, TensorDebugMode.FULL_HEALTH, [crafted.summary(full_health())]
    )
    event = pb.DebugEvent(wall_time=1.0)
    event.source_file.file_path = path
    event.source_file.host_name = "box"
    event.source_file.lines.extend(lines)
    source_files = Path(str(execution)[: -len(files.EXECUTION)] + files.SOURCE_FILES)
    source_files.write_bytes(frame(event.SerializeToString()))
    return execution


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``fn()`` started in a daemon thread; the dict gets ``result`` or ``error`` and ``s``."""
    out: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        try:
            out["result"] = fn()
        except Exception as exc:  # reported by the test
            out["error"] = exc
        out["s"] = time.monotonic() - start

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# -- 1. a crafted source file ------------------------------------------------------------------


def test_hostile_php_source_answers_soon_and_the_run_keeps_answering(tmp_path: Path) -> None:
    execution = write_source_dump(tmp_path, "/srv/app/evil.php", [HOSTILE_PHP])
    # refresh_interval=0: every request catches up with the files; a file changed lately
    # makes it take the run's lock exclusively, which waits for every reader of the run.
    runs = RunSet(tmp_path, refresh_interval=0)
    assert call(runs, "/api/runs")["runs"][0]["num_executions"] == 1
    source, got = in_thread(lambda: call(runs, "/api/source", file=0))
    time.sleep(0.3)  # the source request is under way
    os.utime(execution)  # the dump changed: the next request refreshes the run
    other, alerts = in_thread(lambda: call(runs, "/api/alerts"))
    other.join(BOUND_S)
    assert not other.is_alive(), "another route of the run waited for the highlighting"
    assert alerts["result"]["total"] == 0
    source.join(BOUND_S)
    assert not source.is_alive(), f"the source route took more than {BOUND_S} s"
    body = got["result"]
    # Not highlighted (no PHP lexer), but every character is there, as text.
    assert body["highlighted"] is False
    assert body["lines"] == [[["", HOSTILE_PHP]]]


def test_hostile_python_source_is_cut_off_at_the_time_budget(tmp_path: Path) -> None:
    write_source_dump(tmp_path, "/srv/app/evil.py", [HOSTILE_PY])
    runs = RunSet(tmp_path)
    start = time.monotonic()
    body = call(runs, "/api/source", file=0)
    took = time.monotonic() - start
    assert body["highlighted"] is False and body["lines"] == [[["", HOSTILE_PY]]]
    assert took < BOUND_S
    # Remembered as plain: asking again costs no second budget.
    start = time.monotonic()
    assert call(runs, "/api/source", file=0)["highlighted"] is False
    assert time.monotonic() - start < HIGHLIGHT_SECONDS / 2


def test_highlighting_keeps_python_and_bounds_what_it_remembers() -> None:
    h = Highlighter(cache_chars=1000)
    ok = h("/home/me/train.py", ["import torch\n", "x = 1  # one\n"])
    assert ok.highlighted
    assert ok.lines[0] == [["kn", "import"], ["w", " "], ["nn", "torch"]]
    assert h("<frozen os>", ["x = 1"]).highlighted is False
    assert h("/home/me/page.php", ["<?php echo 1;"]).lines == [[["", "<?php echo 1;"]]]
    assert h("/home/me/script", ["def f(): pass"]).highlighted  # no suffix: a Python script
    big = Highlighter(max_chars=100)("/home/me/big.py", ["x = 1\n"] * 50)
    assert big.highlighted is False and big.why and "longer than" in big.why
    for i in range(50):
        h(f"/home/me/m{i}.py", [f"x{i} = {'1' * 90}"])
    assert len(h) <= 11  # ~100 characters each, 1000 kept


# -- 2. the filter cache -----------------------------------------------------------------------


def test_filter_cache_stays_bounded_under_many_distinct_filters(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=30, bad=(4, 7))
    runs = RunSet(tmp_path)
    run = runs.get(None)
    assert call(runs, "/api/executions", op_type="op1")["total"] == 10
    for i in range(300):
        call(runs, "/api/executions", op_type=f"no-such-op-{i}", end=1)
        call(runs, "/api/timeline", op_type=f"other-{i}", nonfinite=i % 2)
        call(runs, "/api/ranks", window=i % 50)
    # The run's other caches (alerts, status, ...) are a handful of fixed keys.
    assert run.cache_size() <= MAX_BOUNDED + 8
    # A filter dropped from the cache is computed again, the same.
    assert call(runs, "/api/executions", op_type="op1")["total"] == 10
    assert call(runs, "/api/executions", nonfinite=1)["total"] == 2


# -- 3. static file names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["a" * 300, "é" * 300, "a%00b", "..%2Fapp.py", ".hidden", "x/" * 150 + "app.js", "app.js%20"],
)
def test_odd_or_long_static_names_are_404(tmp_path: Path, name: str) -> None:
    write_small_dump(tmp_path)
    client = Client(App(RunSet(tmp_path)))
    resp = client.get(f"/static/{name}", headers={"Host": "127.0.0.1"})
    assert resp.status_code == 404, resp.get_data()[:200]
    assert resp.json and "no such file" in resp.json["error"]
    assert len(resp.json["error"]) < 300
    assert client.get("/static/app.js", headers={"Host": "127.0.0.1"}).status_code == 200


# -- 4. loopback addresses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "status"),
    [("127.0.0.2:6007", 200), ("127.0.0.2", 200), ("127.255.0.9:1", 200), ("[::1]:6007", 200),
     ("localhost:6007", 200), ("evil.example:6007", 403), ("10.0.0.1:6007", 403),
     ("127.0.0.2.evil.example", 403)],
)  # fmt: skip
def test_every_loopback_address_passes_the_host_check(
    tmp_path: Path, host: str, status: int
) -> None:
    write_small_dump(tmp_path)
    client = Client(App(RunSet(tmp_path)))
    assert client.get("/api/runs", headers={"Host": host}).status_code == status


# -- 5. damage is never clean ------------------------------------------------------------------


def damaged_dump(logdir: Path, n: int = 10, bad: int = 8, cut_in: int = 5) -> Path:
    """A dump whose -inf comes at execution ``bad``, its ``.execution`` file cut in the middle
    of record ``cut_in`` (before it): the reader sees a torn tail. Returns the file."""
    write_small_dump(logdir, n=n, bad=(bad,))
    (execution,) = logdir.glob("*.execution")
    data = execution.read_bytes()
    records = scan(data, str(execution), resync_limit=0).records
    cut = records[cut_in].offset + 7
    execution.write_bytes(data[:cut])
    return execution


def test_damaged_dump_is_incomplete_with_file_and_offset(tmp_path: Path) -> None:
    execution = damaged_dump(tmp_path)
    runs = RunSet(tmp_path)
    (entry,) = call(runs, "/api/runs")["runs"]
    assert entry["incomplete"] is True and entry["num_incomplete"] >= 1
    a = call(runs, "/api/analysis")
    assert a["verdict"] == "incomplete"
    assert not a["found_harmful"]
    cut = [d for d in a["incomplete"] if d["file"] == str(execution)]
    assert cut and cut[0]["offset"] is not None
    assert {"message", "file", "offset", "severity"} <= set(cut[0])


def test_whole_dump_is_clean_or_harmful_and_not_incomplete(tmp_path: Path) -> None:
    write_small_dump(tmp_path / "clean", bad=())
    write_small_dump(tmp_path / "bad", bad=(3,))
    runs = RunSet(tmp_path)
    for entry in call(runs, "/api/runs")["runs"]:
        assert entry["incomplete"] is False and entry["num_incomplete"] == 0, entry
    clean = call(runs, "/api/analysis", run="clean")
    assert (clean["verdict"], clean["incomplete"]) == ("clean", [])
    assert call(runs, "/api/analysis", run="bad")["verdict"] in ("harmful", "absorbed")


def test_an_unreadable_run_is_incomplete(tmp_path: Path) -> None:
    write_small_dump(tmp_path / "a")
    runs = RunSet(tmp_path)
    for p in (tmp_path / "a").iterdir():
        p.unlink()
    (entry,) = call(runs, "/api/runs")["runs"]
    assert entry["error"] and entry["incomplete"] is True
