"""What the writer sheds, holds and writes, counted in bytes as well as events.

The promises of docs/RELIABILITY.md (sections 2 and 7) that FULL_TENSOR events, which
hold whole tensors, put to the test: shedding never costs the first Inf/NaN or its
windows, whichever path a producer hands events over by; the queue and the hold are
bounded in bytes; a value past ``max_value_bytes`` leaves its record with its shape and
health only; a slow disk is waited for at close, a hung one is not, and the drop report
says which events were lost and whether the writer closed.

No test here measures time: a writer thread held on a gate, and a disk whose every
write waits, make the overload; the checks are counts and bytes.
"""

from __future__ import annotations

import errno
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent, TraceEvent, _io
from nanscope.events._queue import ExecutionBatch
from nanscope.format import files, sidecar
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import MAX_RECORD_SIZE, frame
from nanscope.reader import EXECUTIONS, TRACES
from tests.helpers import full_health, iter_payloads

WINDOW = 5


class Gate:
    """Summaries whose fetch waits for ``open``: the writer's thread stuck on one event,
    while the producer goes on (as behind a huge FULL_TENSOR record)."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def resolve(self) -> list[np.ndarray]:
        self.open.wait(60)
        return [full_health()]


def held_writer(tmp_path: Path, **options: Any) -> tuple[DumpWriter, Gate]:
    """A writer whose thread is stuck (until the gate opens) and whose producers shed at
    once: ``max_queue`` 10, no waiting."""
    options = {"max_queue": 10, "backpressure_timeout": 0.0, "origin_window": WINDOW,
               "circular_buffer_size": -1, "flush_interval": 0.05, **options}  # fmt: skip
    w = DumpWriter(tmp_path, options.pop("mode", "FULL_HEALTH"), **options)
    gate = Gate()
    w.write_execution(ExecutionEvent("gate", [1], [0], summaries=gate))
    return w, gate


def drops_report(logdir: Path) -> dict[str, Any]:
    (fs,) = files.discover(logdir)
    raw = Path(fs.path(files.DROPS)).read_bytes()
    assert len(raw) == 4096
    report: dict[str, Any] = json.loads(raw)
    return report


# -- the events: 300 of them, a benign -inf every third, a NaN born at 200 ------------------

N, BORN = 300, 200


def health_of(i: int) -> np.ndarray:
    """Event ``i``'s FULL_HEALTH summary: -inf every third event (a mask), NaN at BORN."""
    return full_health(neg_inf=1 if i % 3 == 0 else 0, nan=1 if i == BORN else 0)


def op_of(i: int) -> str:
    return "log" if i == BORN else ("mask" if i % 3 == 0 else "add")


def encoded(w: DumpWriter, first: int, indices: range) -> list[tuple[Any, ...]]:
    """EncodedExecution tuples, as a backend that encodes its own records hands them over."""
    out: list[tuple[Any, ...]] = []
    for seq, i in zip(range(first, first + len(indices)), indices, strict=True):
        h = health_of(i)
        ev = ExecutionEvent(op_of(i), [seq], [seq], summaries=[h], step=i)
        payload, row, _ = w.encoder.execution(ev, seq, 1.0, [h])
        out.append((payload, op_of(i), "", 1, 1.0, i, seq, row.size, row.neg_inf, row.pos_inf,
                    row.nan, row.nonfinite, 0, 0, "", float("nan"), float("nan"), 0))  # fmt: skip
    return out


def batch(w: DumpWriter, first: int, indices: range) -> ExecutionBatch:
    """An ExecutionBatch, framed records and sidecar rows, as the native recorder makes it."""
    records = encoded(w, first, indices)
    framed = [frame(r[0]) for r in records]
    rows = np.zeros(len(records), dtype=sidecar.ROW_DTYPE)
    names = ["add", "mask", "log"]
    lengths = np.array([len(f) for f in framed], dtype=np.int64)
    rows["offset"] = np.cumsum(lengths) - lengths
    rows["length"] = lengths
    rows["name"] = [names.index(r[1]) for r in records]
    rows["step"] = [r[5] for r in records]
    rows["sequence"] = [r[6] for r in records]
    for col, k in (("size", 7), ("neg_inf", 8), ("pos_inf", 9), ("nan", 10), ("nonfinite", 11)):
        rows[col] = [r[k] for r in records]
    return ExecutionBatch(len(records), b"".join(framed), rows.tobytes(), names, ())


def produce(w: DumpWriter, path: str) -> None:
    """Hand the N events to ``w`` by one producer path."""
    if path == "queued":
        for i in range(N):
            w.write_execution(ExecutionEvent(op_of(i), [i + 2], [i], summaries=[health_of(i)],
                                             step=i))  # fmt: skip
    elif path == "encoded":
        for lo in range(0, N, 20):
            w.write_encoded_executions(functools.partial(encoded, w, indices=range(lo, lo + 20)))  # type: ignore[arg-type]
    elif path == "batch":
        for lo in range(0, N, 20):
            w.write_execution_batch(functools.partial(batch, w, indices=range(lo, lo + 20)))
    elif path == "trace":
        for i in range(N):
            w.write_trace(TraceEvent("g", op_of(i), summary=health_of(i), step=i))
    else:  # "traces": graph calls of 20
        for lo in range(0, N, 20):
            idx = range(lo, lo + 20)
            matrix = np.stack([health_of(i) for i in idx])
            w.write_traces("g", [op_of(i) for i in idx], [0] * 20, matrix, step=lo)


@pytest.mark.parametrize("path", ["queued", "encoded", "batch", "trace", "traces"])
def test_shedding_keeps_the_first_nan_and_its_windows(tmp_path: Path, path: str) -> None:
    """A writer thread stuck behind one event (a huge record, say) while 300 events come,
    by each path producers use: they shed, but the first NaN stays with ``origin_window``
    events on each side, and so does the first -inf of the mask; every event let go of is
    counted, those holding Inf/NaN apart."""
    w, gate = held_writer(tmp_path)
    produce(w, path)
    gate.open.set()
    w.close()
    st = w.stats
    kind = TRACES if path.startswith("trace") else EXECUTIONS
    with nanscope.open_dump(tmp_path) as r:
        rows = r.index(kind)
        steps = rows["step"].tolist()
        if kind == EXECUTIONS:
            steps = steps[1:]  # the gate's event
        # The events a graph call sheds or keeps go whole: a superset of the windows.
        for i in [BORN, *range(BORN - WINDOW, BORN + WINDOW + 1), *range(0, WINDOW + 1)]:
            assert i in steps or (path == "traces" and (i // 20) * 20 in steps), (i, steps)
        assert int((rows["nan"] > 0).sum()) == 1
        assert r.evicted(kind) == st.dropped > 0  # each one let go of is a gap
        # Exactly the non-finite events missing from the dump are counted as such.
        missing = sum(1 for i in range(N) if health_of(i)[5:8].sum() > 0) - int(
            (rows["nonfinite"] == 1).sum()
        )
        assert st.nonfinite_dropped == missing
    shed = st.traces_shed if kind == TRACES else st.executions_shed
    assert st.dropped == shed  # the producers shed, the disk lost nothing
    report = drops_report(tmp_path)
    assert report["closed"] is True
    assert report["nonfinite_dropped"] == st.nonfinite_dropped
    assert report["shed"] == {"executions": st.executions_shed, "traces": st.traces_shed}


def test_shedding_lets_go_of_device_summaries_only_past_the_room(tmp_path: Path) -> None:
    """Summaries still on a device are not fetched by the producer (that could wait for
    the producer itself): such events are kept while the backlog leaves room (twice the
    bound), and past it let go of as events that may have held Inf/NaN."""
    w, gate = held_writer(tmp_path)
    others = [Gate() for _ in range(100)]
    for g in others:
        g.open.set()
        w.write_execution(ExecutionEvent("op", [2], [1], summaries=g))
    gate.open.set()
    w.close()
    st = w.stats
    assert 0 < st.executions_shed < 100
    assert st.nonfinite_dropped == st.executions_shed  # unknown: counted as possibly non-finite
    with nanscope.open_dump(tmp_path) as r:
        assert r.num(EXECUTIONS) == 101 - st.executions_shed


# -- bytes ------------------------------------------------------------------------------------

MiB = 1 << 20


def value(i: int, nan: bool = False) -> np.ndarray:
    """A 1 MiB float32 value (``nan``: one NaN in it)."""
    v = np.full(MiB // 4, float(i), dtype=np.float32)
    if nan:
        v[7] = np.nan
    return v


def test_the_queue_is_bounded_in_bytes(tmp_path: Path) -> None:
    """FULL_TENSOR events of 1 MiB each, far fewer than ``max_queue``: the bytes waiting
    for a stuck writer stay within ``max_queue_bytes`` (one event past it), the others
    are shed, and the NaN among them is kept."""
    w, gate = held_writer(tmp_path, mode="FULL_TENSOR", max_queue=200_000,
                          max_queue_bytes=8 * MiB)  # fmt: skip
    for i in range(60):
        w.write_execution(ExecutionEvent("op", [i + 2], [i], summaries=[value(i, nan=i == 40)]))
    waiting = w._backlog_bytes
    gate.open.set()
    w.close()
    # The bound and the event past it, and the NaN's windows (all 60 MiB before the bound).
    assert waiting <= 8 * MiB + (2 * WINDOW + 2) * (MiB + 4096), waiting
    with nanscope.open_dump(tmp_path) as r:
        rows = r.index(EXECUTIONS)
        assert int((rows["nan"] > 0).sum()) == 1
        assert len(rows) == 61 - w.stats.executions_shed
    assert w.stats.executions_shed > 0 and w.stats.nonfinite_dropped == 0


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every write of the dump fails with ENOSPC while the event returned is set."""
    full = threading.Event()
    real = _io.write

    def write(fd: int, data: memoryview) -> int:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(_io, "write", write)
    yield full
    full.clear()


def wait_for(condition: Callable[[], bool]) -> None:
    for _ in range(3000):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the writer never got there")


def test_the_hold_is_bounded_in_bytes(tmp_path: Path, full_disk: threading.Event) -> None:
    """While the disk takes nothing, an unbounded dump holds at most ``hold_limit_bytes``
    of its newest events (and the NaN's windows), however many ``hold_limit`` allows;
    when the disk frees up, they are written and the rest are gaps, counted."""
    w = DumpWriter(tmp_path, "FULL_TENSOR", circular_buffer_size=-1, flush_interval=0.05,
                   origin_window=WINDOW, hold_limit=20_000, hold_limit_bytes=8 * MiB)  # fmt: skip
    full_disk.set()
    w.write_execution(ExecutionEvent("first", [1], [0], summaries=[value(0)]))
    wait_for(lambda: w.failing)
    for i in range(60):
        w.write_execution(ExecutionEvent("op", [i + 2], [i], summaries=[value(i, nan=i == 30)]))
        if i % 10 == 9:  # the writer thread takes them in (a few at a time, like a program)
            wait_for(lambda: w._backlog == 0)
    wait_for(lambda: w._backlog == 0)
    held = w._executions._held()
    held_bytes = int(w._executions._gather(0, w._executions._n)[1].sum())
    full_disk.clear()
    w.close()
    # 8 MiB of the newest (1 MiB and a few bytes each) and the NaN with its windows.
    assert held <= 7 + 2 * WINDOW + 1 + 1, held
    assert held_bytes <= 8 * MiB + (2 * WINDOW + 2) * (MiB + 4096), held_bytes
    st = w.stats
    assert st.executions_dropped > 0 and st.nonfinite_dropped == 0 and st.executions_shed == 0
    with nanscope.open_dump(tmp_path) as r:
        rows = r.index(EXECUTIONS)
        assert int((rows["nan"] > 0).sum()) == 1
        assert len(rows) == 61 - st.executions_dropped
        assert r.evicted(EXECUTIONS) == st.executions_dropped


# -- a value past the record's bound ---------------------------------------------------------


def test_a_value_past_the_bound_keeps_its_shape_and_health(tmp_path: Path) -> None:
    """FULL_TENSOR with ``max_value_bytes`` 1 MiB: of an execution's outputs, those that fit
    keep their values; one past the bound (2 MiB, with NaN) is written as a view entry
    naming no record (sequence 0) with its shape and counts; so is a trace's value left
    out (its health then in the index only). The records stay small."""
    big = np.zeros((512, 1024), dtype=np.float32)
    big[3, :5] = np.nan
    big[4, :2] = -np.inf
    big[5, :7] = -1
    small = np.arange(6, dtype=np.float64)
    with DumpWriter(tmp_path, "FULL_TENSOR", circular_buffer_size=-1,
                    max_value_bytes=MiB) as w:  # fmt: skip
        w.write_execution(ExecutionEvent("op", [1, 2], [0], summaries=[small, big],
                                         input_summaries=[big, small]))  # fmt: skip
        w.write_trace(TraceEvent("g", "op", summary=big))
    assert w.stats.values_omitted == 3  # the big output, the big input, the trace's value
    (fs,) = files.discover(tmp_path)
    path = Path(fs.path(files.EXECUTION))
    assert path.stat().st_size < MiB
    (event,) = [pb.DebugEvent.FromString(p) for p in iter_payloads(path.read_bytes(), str(path))]
    ex = event.execution
    assert ex.tensor_protos[0].tensor_content == small.tobytes()
    assert ex.tensor_protos[1].ByteSize() == 0
    (view,) = ex.output_views
    assert (view.output_slot, view.sequence, tuple(view.shape), tuple(view.strides)) == (
        1, 0, (512, 1024), (1024, 1)
    )  # fmt: skip
    n = big.size
    assert tuple(view.counts) == (n, 2, 0, 5, 7, n - 14, 0)
    # The inputs: the big one left out (no view entries for inputs), the small one kept.
    assert ex.input_tensor_protos[0].ByteSize() == 0
    assert ex.input_tensor_protos[1].tensor_content == small.tobytes()
    with nanscope.open_dump(tmp_path) as r:
        e = r.execution(0)
        assert e.tensor_values is not None and e.tensor_values[1] is None
        np.testing.assert_array_equal(e.tensor_values[0], small)
        h = e.output_health[1]
        assert h is not None and (h.size, h.nan, h.neg_inf, h.neg) == (n, 5, 2, 7)
        assert int(r.index(EXECUTIONS)["nan"][0]) == 5
        assert int(r.index(TRACES)["nan"][0]) == 5
    assert Path(fs.path(files.GRAPH_EXECUTION_TRACES)).stat().st_size < 1024


def test_the_default_bound_keeps_every_record_readable() -> None:
    """The default bound on values leaves room below the reader's record limit for the
    rest of a record (its other fields are small: ids, a stack's frame ids, summaries)."""
    from nanscope.events._encode import MAX_VALUE_BYTES

    assert MAX_VALUE_BYTES + (64 << 20) < MAX_RECORD_SIZE


# -- the disk at close, and the drop report ----------------------------------------------------


def test_the_drop_report_says_whether_the_writer_closed(tmp_path: Path) -> None:
    """Reserved at start with ``closed`` false, rewritten at every clean close (whether or
    not anything was lost) with ``closed`` true; the old keys stay."""
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1)
    w.write_execution(ExecutionEvent("op", [1], [0], summaries=[full_health()]))
    start = drops_report(tmp_path)
    assert start["closed"] is False
    w.close()
    end = drops_report(tmp_path)
    assert end == {
        "dropped": 0, "executions": 0, "traces": 0, "records": 0, "io_errors": 0,
        "last_write": end["last_write"], "nonfinite_dropped": 0,
        "shed": {"executions": 0, "traces": 0}, "closed": True,
        "issued": {"executions": 1, "traces": 0}, "faults": [],
    }  # fmt: skip


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A disk that takes 64 KiB per write, each after 20 ms: an 8 MiB record takes over
    2.5 s, far more than the 0.5 s ``io_timeout`` the test gives, but it never stops."""
    real = _io.write
    monkeypatch.setattr(_io, "CHUNK", 64 << 10, raising=False)

    def write(fd: int, data: memoryview) -> int:
        time.sleep(0.02)
        return real(fd, data[: 64 << 10])

    monkeypatch.setattr(_io, "write", write)
    yield


def test_a_slow_disk_is_waited_for_at_close(tmp_path: Path, slow_disk: None) -> None:
    """A FULL_TENSOR record that takes the disk longer than ``io_timeout`` makes the writer
    hold events (a slow disk is reported as such); the NaN born meanwhile is in the dump
    after close, which waits for a disk that still writes."""
    w = DumpWriter(tmp_path, "FULL_TENSOR", circular_buffer_size=-1, flush_interval=0.05,
                   io_timeout=0.5)  # fmt: skip
    big = np.zeros(2 * MiB, np.float32)  # 8 MiB: over 2.5 s on this disk
    w.write_execution(ExecutionEvent("big", [1], [0], summaries=[big]))
    wait_for(lambda: w.failing)
    w.write_execution(ExecutionEvent("log", [2], [1], summaries=[np.array([np.nan])]))
    w.close()
    with nanscope.open_dump(tmp_path) as r:
        assert r.index(EXECUTIONS)["nan"].tolist() == [0, 1]
    assert w.stats.dropped == 0 and w.stats.nonfinite_dropped == 0
    report = drops_report(tmp_path)
    assert report["closed"] is True and report["faults"][0]["reason"] == "disk too slow"


def test_a_hung_disk_is_not_waited_for_and_the_report_says_what_it_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk whose writes never return: close does not wait, and the report (written by
    another path to its reserved blocks) says that the NaN held in memory was lost."""
    never = threading.Event()
    real = _io.write

    def write(fd: int, data: memoryview) -> int:
        never.wait()
        return real(fd, data)

    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1, flush_interval=0.05,
                   io_timeout=0.2)  # fmt: skip
    monkeypatch.setattr(_io, "write", write)
    w.write_execution(ExecutionEvent("op", [1], [0], summaries=[full_health()]))
    wait_for(lambda: w.failing)
    w.write_execution(ExecutionEvent("log", [2], [1], summaries=[full_health(nan=1)]))
    w.close(timeout=5)
    never.set()
    assert w.stats.nonfinite_dropped == 1
    report = drops_report(tmp_path)
    assert report["closed"] is True and report["nonfinite_dropped"] == 1
    assert report["faults"][0]["reason"] == "disk not responding"
