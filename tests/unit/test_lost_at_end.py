"""Events a closed writer numbered but never wrote after its last held one are counted as
missing: no gap between two held events shows them (a writer that shed its newest events
while catching up with a full disk, or let go of them at close)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.format import files
from nanscope.reader._dump import EXECUTIONS, TRACES


def _written(logdir: Path, n: int) -> Path:
    with DumpWriter(logdir, "NO_TENSOR", -1) as w:
        for i in range(n):
            w.write_execution(ExecutionEvent("op", [i]))
    (fs,) = files.discover(logdir)
    return fs.path(files.DROPS)


def _report(path: Path, **fields: object) -> None:
    report = json.loads(path.read_text())
    report.update(fields)
    path.write_text(json.dumps(report))


def test_the_writers_final_report_says_how_many_it_numbered(tmp_path: Path) -> None:
    report = json.loads(_written(tmp_path, 7).read_text())
    assert report["closed"] is True
    assert report["issued"] == {"executions": 7, "traces": 0}


@pytest.mark.parametrize("closed", [True, False])
def test_events_lost_after_the_last_held_one_are_missing(tmp_path: Path, closed: bool) -> None:
    drops = _written(tmp_path, 10)
    # As a writer that shed its last five executions would leave it.
    _report(drops, dropped=5, executions=5, closed=closed, issued={"executions": 15, "traces": 0})
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 10
        assert r.gaps(EXECUTIONS) == []  # nothing missing between held events
        # A writer still running may have numbered events still on their way to the disk.
        assert r.evicted(EXECUTIONS) == (5 if closed else 0)
        assert r.evicted(TRACES) == 0


def test_a_report_without_the_count_reads_as_before(tmp_path: Path) -> None:
    drops = _written(tmp_path, 4)
    report = json.loads(drops.read_text())
    del report["issued"]
    drops.write_text(json.dumps({**report, "dropped": 1, "executions": 1}))
    with nanscope.open_dump(tmp_path) as r:
        assert r.evicted(EXECUTIONS) == 0
