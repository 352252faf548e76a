"""Memory bounds promised in docs/RELIABILITY.md that no other test module covers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.reader import EXECUTIONS, INDEX_DTYPE, TRACES
from tests.helpers import full_health


class SlowSummaries:
    """Summaries that take a while to fetch (as from a busy GPU): a slow writer thread."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def resolve(self) -> np.ndarray:
        time.sleep(0.002)
        return np.tile(full_health(), (self.rows, 1))


@pytest.mark.parametrize("batched", [False, True])
def test_backpressure_bounds_the_queue(tmp_path: Path, batched: bool) -> None:
    """A producer faster than the writer waits: at most max_queue (+ one batch) events wait."""
    limit, batch = 500, 50
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1, max_queue=limit)
    for i in range(4000 // (batch if batched else 1)):
        if batched:
            # write_traces takes any object with resolve() (its docstring); its annotation says ndarray.
            w.write_traces("g", ["op"] * batch, [0] * batch, SlowSummaries(batch), step=i)  # type: ignore[arg-type]
        else:
            # resolve() gives a 2-D array, a sequence of rows; Pending asks for a Sequence.
            w.write_execution(ExecutionEvent("op", [i + 1], [i], summaries=SlowSummaries(1)))  # type: ignore[arg-type]
    w.close()
    assert w.stats.waits > 0  # the producer did wait
    assert 0 < w.stats.max_backlog <= limit + (batch if batched else 1)
    with nanscope.open_dump(tmp_path) as r:  # and nothing was dropped
        assert r.num(TRACES if batched else EXECUTIONS) == 4000


def test_reader_holds_an_index_not_the_events(tmp_path: Path) -> None:
    """The reader's memory per event is one index row, whatever the events' size."""
    big = np.zeros(11)
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1, source_snapshots="none")
    stack = w.capture_stack()
    for i in range(3000):
        # Long op names and stacks make the records large; the index stays the same.
        w.write_execution(
            ExecutionEvent(f"aten.op_{i % 7}" + "x" * 200, [i + 1], [i], summaries=[big],
                           stack=stack)
        )  # fmt: skip
    w.close()
    records = sum(p.stat().st_size for p in tmp_path.glob("*.execution"))
    with nanscope.open_dump(tmp_path) as r:
        index = r.index(EXECUTIONS)
        assert len(index) == 3000 and index.dtype == INDEX_DTYPE
        assert r.decoded_for_index() == 0  # the sidecar served it: no record was decoded
        assert index.nbytes == 3000 * INDEX_DTYPE.itemsize < records
        assert INDEX_DTYPE.itemsize == 64


def test_backpressure_waits_a_bounded_time_then_drops_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer that cannot keep up does not hold the producer: events are dropped, counted,
    told once, and show as gaps in the dump."""
    w = DumpWriter(
        tmp_path, "FULL_HEALTH", circular_buffer_size=-1, max_queue=20, backpressure_timeout=0.01
    )
    n = 400
    for i in range(n):
        # resolve() gives a 2-D array, a sequence of rows; Pending asks for a Sequence.
        w.write_execution(ExecutionEvent("op", [i + 1], [i], summaries=SlowSummaries(1)))  # type: ignore[arg-type]
    w.close()
    dropped = w.stats.executions_dropped
    assert 0 < dropped < n
    err = capsys.readouterr().err
    assert err.count("dropping events") == 1 and f"{dropped} events dropped" in err
    with nanscope.open_dump(tmp_path) as r:
        assert r.num(EXECUTIONS) == n - dropped
        assert r.evicted(EXECUTIONS) == dropped - (n - int(r.index(EXECUTIONS)["sequence"].max()))


def test_shedding_keeps_the_non_finite_events_of_encoded_batches(tmp_path: Path) -> None:
    """The path of the native recorder: while events are dropped, non-finite ones stay."""
    w = DumpWriter(
        tmp_path, "FULL_HEALTH", circular_buffer_size=-1, max_queue=50, backpressure_timeout=0.0
    )
    enc = w.encoder
    blocker = threading.Event()
    # A slow first event keeps the writer thread busy while the batches come.
    w.write_execution(ExecutionEvent("slow", [1], [0], summaries=BlockingSummaries(blocker)))  # type: ignore[arg-type]

    def batch(first: int, bad: int) -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        for seq in range(first, first + 30):
            h = full_health(neg_inf=1 if seq == bad else 0)
            ev = ExecutionEvent("op", [seq], [seq], summaries=[h])
            payload, row, _ = enc.execution(ev, seq, 1.0, [h])
            out.append((payload, "op", "", 1, 1.0, 0, seq, row.size, row.neg_inf, row.pos_inf,
                        row.nan, row.nonfinite, 0, 0, "", float("nan"), float("nan"), 0))  # fmt: skip
        return out

    for _ in range(10):
        w.write_encoded_executions(lambda first: batch(first, bad=first + 7))  # type: ignore[arg-type, return-value]
    blocker.set()
    w.close()
    assert w.stats.executions_dropped > 0
    with nanscope.open_dump(tmp_path) as r:
        rows = r.index(EXECUTIONS)
        # Every batch's one non-finite event is in the dump, dropped or not its neighbours.
        assert int((rows["neg_inf"] > 0).sum()) == 10
        assert len(rows) == 1 + 30 * 10 - w.stats.executions_dropped


class BlockingSummaries:
    """Summaries whose fetch waits for ``gate`` (a writer thread stuck on one event)."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def resolve(self) -> np.ndarray:
        self.gate.wait(30)
        return np.tile(full_health(), (1, 1))
