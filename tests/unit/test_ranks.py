"""The cross-rank verdict (analysis/_ranks.py) on many-rank dumps written here, one scenario each.

Each rank's program is a list of ops written with nanscope's own writer, collectives tagged as
the recorders tag them. The oracle is the scenario itself: which rank's op made the Inf/NaN,
and which collective carried it (computed from the scenario, not typed in).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from nanscope import analysis, open_dump
from nanscope.analysis import _notes as notes
from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.events._model import CollectiveTag  # not public: the recorders make these
from nanscope.report import note_texts, rank_note_texts
from tests.helpers import full_health

ALLREDUCE = "c10d.allreduce_.default"


@dataclass
class Op:
    """One op of one rank: its output's -inf/NaN counts, and for a collective its group and
    number and what this rank put in (None: not recorded, as older dumps)."""

    op_type: str
    step: int
    neg_inf: int = 0
    nan: int = 0
    group: str | None = None
    sequence: int = 0
    sent_neg_inf: int | None = 0


def write(logdir: Path, programs: dict[int, list[Op]], skew: dict[int, float]) -> None:
    """One file set per rank; each op 10 ms after the previous one on a common timeline,
    stamped with the rank's clock (``skew``: seconds ahead)."""
    world = len(programs)
    for rank, ops in programs.items():
        w = DumpWriter(logdir, "FULL_HEALTH", circular_buffer_size=-1, run_id="s", rank=rank,
                       world_size=world)  # fmt: skip
        for i, op in enumerate(ops):
            tag = None
            inputs: tuple[np.ndarray, ...] = ()
            if op.group is not None:
                size = world if op.group == "dp" else 2
                tag = CollectiveTag(op.group, "collective", op.sequence, "", size)
                if op.sent_neg_inf is not None:
                    inputs = (full_health(neg_inf=op.sent_neg_inf),)
            w.write_execution(
                ExecutionEvent(op.op_type, [i + 1], [i], summaries=[full_health(op.neg_inf, op.nan)],
                               input_summaries=inputs, step=op.step, collective=tag,
                               wall_time=1000.0 + 0.01 * i + skew.get(rank, 0.0))
            )  # fmt: skip
        w.close()


def tensor_parallel(
    bad_rank: int, bad_step: int, steps: int, inputs: bool = True
) -> dict[int, list[Op]]:
    """4 ranks: tensor-parallel pairs (groups tp0 = 0,1 and tp1 = 2,3) inside data-parallel
    group dp. Each step: mm, the pair's allreduce, log, dp's allreduce, add_. ``bad_rank``'s
    log makes -inf at ``bad_step``; from that step's dp allreduce on, every rank holds NaN."""
    programs: dict[int, list[Op]] = {}
    for rank in range(4):
        ops: list[Op] = []
        pair = f"tp{rank // 2}"
        bad = False  # this rank holds Inf/NaN
        for step in range(steps):
            ops.append(Op("aten.mm.default", step, nan=int(bad)))
            ops.append(Op(ALLREDUCE, step, nan=int(bad), group=pair, sequence=step + 1,
                          sent_neg_inf=(int(bad) if inputs else None)))  # fmt: skip
            born = rank == bad_rank and step == bad_step
            ops.append(Op("aten.log.default", step, neg_inf=int(born), nan=int(bad)))
            sent = bad or born
            spread = step >= bad_step
            ops.append(Op(ALLREDUCE, step, nan=int(spread), group="dp", sequence=step + 1,
                          sent_neg_inf=(int(sent) if inputs else None)))  # fmt: skip
            bad = bad or spread
            ops.append(Op("aten.add_.Tensor", step, nan=int(bad)))
        programs[rank] = ops
    return programs


def verdict(
    tmp_path: Path, programs: dict[int, list[Op]], skew: dict[int, float] | None = None
) -> tuple[analysis.RankVerdict, dict[int, int], analysis.Analysis]:
    write(tmp_path, programs, skew or {})
    with open_dump(tmp_path) as r:
        a = analysis.analyze(r)
        rank_of = {p.index: p.rank for p in r.processes}
    assert a.ranks is not None
    return a.ranks, rank_of, a  # type: ignore[return-value]


def origin_of(v: analysis.RankVerdict) -> int:
    """The origin's process index (every scenario here has one)."""
    assert v.origin_process is not None
    return v.origin_process


def births(programs: dict[int, list[Op]]) -> list[tuple[int, int]]:
    """The oracle: (rank, position) of every op that made -inf from finite inputs."""
    return [(rank, i) for rank, ops in programs.items() for i, op in enumerate(ops)
            if op.op_type == "aten.log.default" and op.neg_inf]  # fmt: skip


@pytest.mark.parametrize("inputs", [True, False], ids=["inputs recorded", "older dump"])
def test_interleaved_groups_name_the_rank_and_the_spreading_collective(
    tmp_path: Path, inputs: bool
) -> None:
    programs = tensor_parallel(bad_rank=3, bad_step=20, steps=30, inputs=inputs)
    ((bad_rank, _),) = births(programs)
    # The bad rank's clock runs 2 s late: every other rank's alert looks earlier.
    v, rank_of, a = verdict(tmp_path, programs, skew={bad_rank: 2.0})
    origin = v.states[origin_of(v)]
    assert (rank_of[origin.process], origin.role, v.decided_by) == (
        bad_rank,
        "origin",
        "collective",
    )
    assert a.origin is not None and (a.origin.op_type, a.origin.step) == ("aten.log.default", 20)
    spread = v.spread[0].collective
    assert (spread.group, spread.sequence) == ("dp", 21)  # the dp allreduce of step 20
    reached = sorted(rank_of[p] for p in v.reached)
    assert reached == [r for r in range(4) if r != bad_rank]
    for s in v.states:
        if s.process != origin_of(v):
            assert s.role == "received" and s.via is not None and s.via.collective.group == "dp"
            assert s.senders == [origin_of(v)]
            assert s.clock_offset == pytest.approx(2.0)  # aligned on the dp allreduce


def test_a_collective_that_made_inf_from_finite_inputs_is_named(tmp_path: Path) -> None:
    """Every rank put finite values in and got +inf out (the sum overflowed)."""
    programs = {
        rank: [Op("aten.mm.default", 0), Op(ALLREDUCE, 0, neg_inf=1, group="dp", sequence=1),
               Op("aten.add_.Tensor", 0, neg_inf=1)]
        for rank in range(3)
    }  # fmt: skip
    v, rank_of, _ = verdict(tmp_path, programs, skew={0: 1.0, 2: -1.0})
    assert v.decided_by == "collective" and rank_of[origin_of(v)] == 0
    assert [type(n) for n in v.notes] == [notes.CollectiveMadeIt]
    assert "the collective made it" in rank_note_texts(v)[0]


def test_births_no_collective_orders_are_told_by_aligned_clocks(tmp_path: Path) -> None:
    """Ranks 1 and 2 make -inf between the same collectives; rank 1's comes first on the
    common timeline, but rank 2's clock runs 3 s behind, so its raw time looks earlier."""
    programs = {
        rank: [Op("aten.mm.default", 0), Op(ALLREDUCE, 0, group="dp", sequence=1)]
        for rank in range(3)
    }
    # Rank 1's log is at position 2, rank 2's at 3; both ranks' allreduce at 4, as a
    # collective ends at one moment on every member.
    for rank, logs_at in ((1, 2), (2, 3)):
        tail = [Op("aten.mm.default", 1), Op("aten.mm.default", 1)]
        tail[logs_at - 2] = Op("aten.log.default", 1, neg_inf=1)
        programs[rank] += [*tail, Op(ALLREDUCE, 1, nan=1, group="dp", sequence=2, sent_neg_inf=1)]
    programs[0] += [Op("aten.mm.default", 1), Op("aten.mm.default", 1),
                    Op(ALLREDUCE, 1, nan=1, group="dp", sequence=2, sent_neg_inf=0)]  # fmt: skip
    v, rank_of, _ = verdict(tmp_path, programs, skew={2: -3.0})
    assert v.decided_by == "clock" and rank_of[origin_of(v)] == 1
    ((clock,),) = [[n for n in v.notes if isinstance(n, notes.BornByClock)]]
    names = [s.label for s in sorted(v.states, key=lambda s: rank_of[s.process])]
    assert clock.names == (names[1], names[2]) and clock.aligned
    assert "no collective orders them" in rank_note_texts(v)[-1]
    (zero,) = [s for s in v.states if rank_of[s.process] == 0]
    assert zero.role == "received" and sorted(rank_of[p] for p in zero.senders) == [1, 2]


def test_one_rank_alone_is_single(tmp_path: Path) -> None:
    programs = {rank: [Op("aten.mm.default", 0), Op("aten.log.default", 0, neg_inf=int(rank == 1))]
                for rank in range(2)}  # fmt: skip
    v, rank_of, _ = verdict(tmp_path, programs)
    assert (v.decided_by, rank_of[origin_of(v)]) == ("single", 1)


def test_benign_masks_on_every_rank_leave_the_report_quiet(tmp_path: Path) -> None:
    """Every rank's mask makes -inf that its softmax absorbs: nothing harmful, no ranks note."""
    programs: dict[int, list[Op]] = {}
    for rank in range(3):
        ops = []
        for step in range(3):
            ops += [Op("aten.masked_fill.Scalar", step, neg_inf=1), Op("aten._softmax.default", step),
                    Op(ALLREDUCE, step, group="dp", sequence=step + 1)]  # fmt: skip
        programs[rank] = ops
    write(tmp_path, programs, {})
    with open_dump(tmp_path) as r:
        a = analysis.analyze(r)
    assert a.found and not a.found_harmful
    said = note_texts(a)
    assert not any("collective" in n or "clock" in n for n in said), said
