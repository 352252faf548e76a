"""The circular buffers' anchors (windows kept around births) and the reader's eviction counts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, TraceEvent
from nanscope.events._streams import MAX_ANCHORS
from nanscope.reader import EXECUTIONS, TRACES, DumpReader

from ..helpers import extract_tf_dumps


def health(neg_inf: int = 0, pos_inf: int = 0, nan: int = 0, size: int = 10) -> np.ndarray:
    """A FULL_HEALTH summary with these counts (the rest positive)."""
    pos = size - neg_inf - pos_inf - nan
    return np.array([-1, -1, 1, 1, size, neg_inf, pos_inf, nan, 0, 0, pos], dtype=np.float64)


@dataclass(frozen=True)
class Ev:
    """One synthetic event: its op (type for executions, graph op name for traces) and counts."""

    op: str
    neg_inf: int = 0
    pos_inf: int = 0
    nan: int = 0

    @property
    def nonfinite(self) -> bool:
        return self.neg_inf + self.pos_inf + self.nan > 0


def training_story(steps: int = 500) -> list[Ev]:
    """Ten ops a step: a benign -inf mask every step; from step 300 an overflow (+inf, a new
    op type); from step 400 NaN in it and in softmax, and from step 401 everywhere."""
    events = []
    for step in range(steps):
        for k in range(10):
            if k == 3:
                events.append(Ev("aten.masked_fill.Scalar", neg_inf=4))
            elif k == 5 and step >= 300:
                events.append(Ev("aten.mm.default", pos_inf=2, nan=2 * (step >= 400)))
            elif k == 6 and step >= 400:
                events.append(Ev("aten._softmax.default", nan=10))
            elif k > 6 and step > 400:
                events.append(Ev("aten.add.Tensor", nan=10))
            else:
                events.append(Ev("aten.add.Tensor"))
    return events


def expected_kept(
    story: list[Ev], capacity: int, window: int, op_of: dict[str, str] | None = None
) -> list[int]:
    """The 1-based sequences the documented rule keeps, computed from the rule itself:
    windows around anchors, plus the ``capacity`` most recent events outside them (exact
    when each anchor has ``window`` unprotected events, or a window, right before it)."""
    anchors: list[int] = []
    seen: set[tuple[str | None, bool]] = set()
    nan_seen = False
    for i, ev in enumerate(story):
        if not ev.nonfinite:
            continue
        # Traces: by the op type of their graph op (None where the writer never saw it).
        key = (op_of.get(ev.op) if op_of is not None else ev.op, ev.nan > 0)
        if key in seen or (len(seen) >= MAX_ANCHORS and (nan_seen or not ev.nan)):
            continue
        seen.add(key)
        nan_seen |= ev.nan > 0
        anchors.append(i)
    protected = {j for a in anchors for j in range(a - window, a + window + 1)}
    protected &= set(range(len(story)))
    rest = [i for i in range(len(story)) if i not in protected][-capacity:]
    return sorted(i + 1 for i in protected | set(rest))


def write_executions(w: DumpWriter, story: list[Ev]) -> None:
    for i, ev in enumerate(story):
        h = health(ev.neg_inf, ev.pos_inf, ev.nan)
        w.write_execution(ExecutionEvent(ev.op, [i + 1], summaries=[h], step=i // 10))


def record_story(
    logdir: Path, story: list[Ev], capacity: int, window: int
) -> tuple[DumpWriter, DumpReader, list[int]]:
    """``story`` as executions into a circular buffer; the writer, the dump and the
    sequences kept, checked against :func:`expected_kept`."""
    with DumpWriter(logdir, "FULL_HEALTH", capacity, origin_window=window) as w:
        write_executions(w, story)
    r = nanscope.open_dump(logdir)
    kept = sequences(r, EXECUTIONS)
    assert kept == expected_kept(story, capacity, window)
    return w, r, kept


def sequences(r: DumpReader, kind: str) -> list[int]:
    return [int(s) for s in r.index(kind)["sequence"]]


def first_seq(story: list[Ev], op: str, **counts: int) -> int:
    """The sequence of the first event of ``op`` whose counts include ``counts``."""
    return next(
        i + 1
        for i, ev in enumerate(story)
        if ev.op == op and all(getattr(ev, k) > 0 for k in counts)
    )


def check_gaps(r: DumpReader, kind: str, total: int) -> None:
    """``gaps`` and ``evicted`` agree with the sequences the dump holds."""
    kept = sequences(r, kind)
    expected = []
    prev = 0
    for index, seq in enumerate(kept):
        if seq != prev + 1:
            expected.append((0, index - 1, seq - prev - 1))
        prev = seq
    assert r.gaps(kind) == expected
    assert r.evicted(kind) == total - len(kept) == sum(m for _, _, m in expected)


def test_each_birth_keeps_its_window_in_a_small_buffer(tmp_path: Path) -> None:
    story = training_story()
    capacity, window = 20, 3
    w, r, kept = record_story(tmp_path, story, capacity, window)
    # The three births, each with the events around it: the first -inf (a benign mask,
    # anchored once however often it repeats), the first +inf of a new op type, the first NaN.
    births = [
        first_seq(story, "aten.masked_fill.Scalar", neg_inf=1),
        first_seq(story, "aten.mm.default", pos_inf=1),
        first_seq(story, "aten._softmax.default", nan=1),
    ]
    assert births == [4, 3006, 4007]
    for seq in births:
        assert set(range(max(1, seq - window), seq + window + 1)) <= set(kept)
    _, first_nan = r.first_where("nan", EXECUTIONS)
    assert first_nan is not None and r.execution(first_nan.index).op_type == "aten.mm.default"
    assert r.execution(first_nan.index).sequence == 4006  # mm's own first NaN: its window
    # Evicted: what really went missing, said the same way by the writer and the reader.
    assert w.stats.executions_evicted == len(story) - len(kept) == r.evicted(EXECUTIONS)
    assert w.stats.executions_kept == len(kept)
    check_gaps(r, EXECUTIONS, len(story))
    # The dump is cut between the windows, never inside one.
    seqs = r.index(EXECUTIONS)["sequence"]
    for _, after, missing in r.gaps(EXECUTIONS):
        cut = set(range(int(seqs[after + 1]) - missing, int(seqs[after + 1])))
        assert not any(cut & set(range(b - window, b + window + 1)) for b in births)


def test_memory_stays_bounded_past_max_anchors(tmp_path: Path) -> None:
    # More op types making Inf than anchors; the first NaN still gets its window.
    story: list[Ev] = []
    for k in range(MAX_ANCHORS + 8):
        story += [Ev("add")] * 50 + [Ev(f"op{k}", pos_inf=1)]
    story += [Ev("add")] * 50 + [Ev("div", nan=1)] + [Ev("add")] * 50
    capacity, window = 10, 2
    _, r, kept = record_story(tmp_path, story, capacity, window)
    ops = {r.execution(i).op_type for i in range(len(kept))}
    assert {f"op{k}" for k in range(MAX_ANCHORS)} | {"div"} <= ops
    assert not ops & {f"op{k}" for k in range(MAX_ANCHORS, MAX_ANCHORS + 8)}
    assert len(kept) <= capacity + (MAX_ANCHORS + 1) * (2 * window + 1)
    check_gaps(r, EXECUTIONS, len(story))


def test_windows_that_overlap_merge(tmp_path: Path) -> None:
    story = [Ev("add")] * 100 + [Ev("log", neg_inf=1), Ev("add"), Ev("exp", pos_inf=1)]
    story += [Ev("add")] * 100 + [Ev("mul", nan=1)] + [Ev("add")] * 2 + [Ev("sub", nan=1)]
    story += [Ev("add")] * 100
    _, _, kept = record_story(tmp_path, story, 5, 3)
    # 98..106 around #101 and #103; 201..210 around #204 and #207; the last five.
    assert kept == [*range(98, 107), *range(201, 211), *range(303, 308)]


def test_a_window_reaching_into_the_previous_one_keeps_them_whole(tmp_path: Path) -> None:
    # The second birth comes 2 events after the first one's window closed.
    story = [Ev("add")] * 20 + [Ev("log", neg_inf=1)] + [Ev("add")] * 5 + [Ev("exp", pos_inf=1)]
    story += [Ev("add")] * 30
    _, r, kept = record_story(tmp_path, story, 4, 3)
    assert kept == [*range(18, 31), *range(54, 58)]
    check_gaps(r, EXECUTIONS, len(story))


def test_unbounded_and_finite_runs_are_unchanged(tmp_path: Path) -> None:
    story = training_story(50)
    with DumpWriter(tmp_path / "all", "FULL_HEALTH", -1) as w:
        write_executions(w, story)
    r = nanscope.open_dump(tmp_path / "all")
    assert sequences(r, EXECUTIONS) == list(range(1, len(story) + 1))
    assert r.gaps(EXECUTIONS) == [] and r.evicted(EXECUTIONS) == 0 and r.evicted(TRACES) == 0
    with DumpWriter(tmp_path / "ring", "FULL_HEALTH", 7) as w:
        write_executions(w, [Ev("add")] * 100)
    r = nanscope.open_dump(tmp_path / "ring")
    assert sequences(r, EXECUTIONS) == list(range(94, 101))
    assert r.gaps(EXECUTIONS) == [(0, -1, 93)] and r.evicted(EXECUTIONS) == 93


# -- traces: anchored by the op type of their graph op ----------------------------------------

GRAPH_OPS = {
    "mask": "aten.masked_fill.Scalar",
    "mask_1": "aten.masked_fill.Scalar",  # a second mask in the graph: the same op type
    "mm": "aten.mm.default",
    "softmax": "aten._softmax.default",
    "add": "aten.add.Tensor",
}


def graph_call(step: int) -> list[Ev]:
    """One call of a compiled graph: a mask makes -inf every call, a second one (of the same
    op type) from call 100; mm overflows from call 300; softmax makes NaN from call 400."""
    return [
        Ev("add"),
        Ev("mask", neg_inf=4),
        Ev("add"),
        Ev("mask_1", neg_inf=4 * (step >= 100)),
        Ev("mm", pos_inf=2 * (step >= 300)),
        Ev("softmax", nan=10 * (step >= 400)),
        Ev("add"),
    ]


@pytest.mark.parametrize("batched", [True, False])
def test_traces_get_the_same_windows(tmp_path: Path, batched: bool) -> None:
    capacity, window = 20, 3
    story: list[Ev] = []
    with DumpWriter(tmp_path, "FULL_HEALTH", capacity, origin_window=window) as w:
        w.write_graph(Graph("g", "f"))
        for name, op_type in GRAPH_OPS.items():
            w.write_graph_op(GraphOp("g", op_type, name, "f"))
        for step in range(500):
            call = graph_call(step)
            story += call
            matrix = np.stack([health(e.neg_inf, e.pos_inf, e.nan) for e in call])
            names = [e.op for e in call]
            if batched:
                w.write_traces("g", names, [0] * len(call), matrix, step=step)
            else:
                for name, row in zip(names, matrix, strict=True):
                    w.write_trace(TraceEvent("g", name, 0, row, step=step))
    r = nanscope.open_dump(tmp_path)
    kept = sequences(r, TRACES)
    assert kept == expected_kept(story, capacity, window, op_of=GRAPH_OPS)
    births = [first_seq(story, "mask", neg_inf=1), first_seq(story, "mm", pos_inf=1),
              first_seq(story, "softmax", nan=1)]  # fmt: skip
    assert births == [2, 2105, 2806]
    for seq in births:
        assert set(range(max(1, seq - window), seq + window + 1)) <= set(kept)
    # The second mask is no new birth: no window of its own (as it would by op name).
    assert first_seq(story, "mask_1", neg_inf=1) == 704 and 704 not in kept
    assert w.stats.traces_evicted == len(story) - len(kept) == r.evicted(TRACES)
    check_gaps(r, TRACES, len(story))


# -- the reader ------------------------------------------------------------------------------


def test_gaps_are_per_process(tmp_path: Path) -> None:
    for rank, n in ((0, 30), (1, 12)):
        with DumpWriter(tmp_path, "FULL_HEALTH", 5, rank=rank, origin_window=1) as w:
            write_executions(w, [Ev("add")] * 10 + [Ev("log", neg_inf=1)] + [Ev("add")] * n)
    r = nanscope.open_dump(tmp_path)
    procs = r.processes_of(EXECUTIONS).tolist()
    assert procs == [0] * 8 + [1] * 8
    # Each process: #11 with its window (#10, #12), then the last five.
    assert sequences(r, EXECUTIONS) == [10, 11, 12, *range(37, 42), 10, 11, 12, *range(19, 24)]
    assert r.gaps(EXECUTIONS) == [(0, -1, 9), (0, 2, 24), (1, -1, 9), (1, 10, 6)]
    assert r.evicted(EXECUTIONS) == 9 + 24 + 9 + 6


@pytest.fixture(scope="module")
def tf_circular(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DumpReader]:
    root = extract_tf_dumps(tmp_path_factory.mktemp("tf_dumps"))
    with nanscope.open_dump(root / "FULL_HEALTH_circular") as r:
        yield r


def test_dumps_without_sequence_numbers_have_no_gaps(tf_circular: DumpReader) -> None:
    # TensorFlow numbers nothing: what its circular buffer evicted cannot be told.
    assert tf_circular.num(EXECUTIONS) and tf_circular.num(TRACES)
    for kind in (EXECUTIONS, TRACES):
        assert tf_circular.gaps(kind) == [] and tf_circular.evicted(kind) == 0
