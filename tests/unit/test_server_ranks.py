"""``/api/ranks``: the cross-rank verdict and each rank's rows around the collective that
spread the Inf/NaN, checked against a many-rank dump written here with nanscope's writer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.events._model import CollectiveTag  # not public: the recorders make these
from nanscope.server.runs import RunSet
from tests.helpers import call, full_health, write_small_dump
from tests.unit.test_server_api import documented_routes, keys_of, refused

WORLD, BAD_RANK, BAD_STEP, STEPS = 3, 1, 1, 3
ALLREDUCE = "c10d.allreduce_.default"
STEP_OPS = ("aten.mm.default", "aten.log.default", ALLREDUCE, "aten.add_.Tensor")
SKEW = {0: 5.0, 1: 0.0, 2: -2.0}  # seconds each rank's clock is ahead of rank 1's


class Written(NamedTuple):
    """One execution as the test wrote it: what the route's rows must say."""

    op_type: str
    step: int
    wall_time: float
    bad: bool
    sequence: int | None  # the allreduce's place in group 0


def write_rank(logdir: Path, rank: int) -> list[Written]:
    """One rank's steps: mm, log, the gradient allreduce (collective #step of group 0), add_.

    Rank ``BAD_RANK``'s log makes -inf at ``BAD_STEP`` and it sends it into that step's
    allreduce (its input summary holds -inf, the others' are finite); every rank's
    allreduce output and the add_ after it hold -inf.
    """
    w = DumpWriter(logdir, "FULL_HEALTH", circular_buffer_size=-1, run_id="ranks", rank=rank,
                   world_size=WORLD)  # fmt: skip
    written: list[Written] = []
    tid = 0
    for step in range(STEPS):
        for j, op in enumerate(STEP_OPS):
            tid += 1
            wall = 1000.0 + step + 0.01 * j + SKEW[rank]
            born = op == "aten.log.default" and rank == BAD_RANK and step == BAD_STEP
            carried = op in (ALLREDUCE, "aten.add_.Tensor") and step == BAD_STEP
            bad = born or carried
            tag: CollectiveTag | None = None
            inputs: tuple[np.ndarray, ...] = ()
            if op == ALLREDUCE:
                tag = CollectiveTag("0", "collective", step, "default_pg", WORLD)
                sent = rank == BAD_RANK and step == BAD_STEP
                inputs = (full_health(neg_inf=1 if sent else 0),)
            event = ExecutionEvent(op, [tid], [tid - 1], summaries=[full_health(neg_inf=bad)],
                                   input_summaries=inputs, step=step, wall_time=wall,
                                   collective=tag)  # fmt: skip
            w.write_execution(event)
            written.append(Written(op, step, wall, bad, tag.sequence if tag else None))
    w.close()
    return written


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSet, dict[int, list[Written]]]:
    logdir = tmp_path_factory.mktemp("ranks")
    written = {rank: write_rank(logdir, rank) for rank in range(WORLD)}
    return RunSet(logdir), written


def rank_of(runs: RunSet) -> dict[int, int]:
    """Process index -> rank, as /api/runs lists them."""
    (run,) = call(runs, "/api/runs")["runs"]
    return {p["index"]: p["rank"] for p in run["processes"]}


def as_written(row: dict[str, Any]) -> Written:
    c = row["collective"]
    return Written(row["op_type"], row["step"], row["wall_time"], row["nonfinite"],
                   c["sequence"] if c else None)  # fmt: skip


def test_ranks_name_the_origin_and_who_received_it(dump: Any) -> None:
    runs, written = dump
    ranks = call(runs, "/api/ranks")["ranks"]
    assert ranks == {**call(runs, "/api/analysis")["ranks"], "processes": ranks["processes"]}
    rank = rank_of(runs)
    process = {r: p for p, r in rank.items()}
    assert ranks["origin_process"] == process[BAD_RANK]
    assert ranks["decided_by"] == "collective"
    spread = ranks["spread"]
    assert spread["collective"]["sequence"] == BAD_STEP and spread["op_type"] == ALLREDUCE
    assert spread["collective"]["label"] == f"collective #{BAD_STEP} of group 0 (default_pg)"
    assert spread["from"] == [process[BAD_RANK]]
    assert sorted(spread["reached"]) == sorted(process[r] for r in range(WORLD) if r != BAD_RANK)
    assert sorted(c["process"] for c in spread["copies"]) == sorted(process.values())
    for p in ranks["processes"]:
        r = p["rank"]
        first = p["first_event"]
        if r == BAD_RANK:
            assert p["role"] == "origin" and p["via"] is None
            assert (first["op_type"], first["step"]) == ("aten.log.default", BAD_STEP)
        else:
            assert p["role"] == "received" and p["senders"] == [process[BAD_RANK]]
            assert p["via"]["collective"]["sequence"] == BAD_STEP
            assert (first["op_type"], first["step"]) == (ALLREDUCE, BAD_STEP)
            # Clocks aligned on the allreduce: each rank's skew, taken back.
            assert p["clock_offset"] == pytest.approx(SKEW[BAD_RANK] - SKEW[r], abs=1e-6)
        assert first["process"] == p["process"] and first["index"] == p["first"]["index"]
        assert as_written(first) in [w for w in written[r] if w.bad][:1]


@pytest.mark.parametrize("window", [0, 2, 8, 50])
def test_rows_around_each_ranks_copy_are_that_ranks_own(dump: Any, window: int) -> None:
    runs, written = dump
    rank = rank_of(runs)
    answer = call(runs, "/api/ranks", window=window)
    around = answer["around"]
    copies = answer["ranks"]["spread"]["copies"]
    assert [(a["process"], a["index"]) for a in around] == [
        (c["process"], c["index"]) for c in copies
    ]
    for a in around:
        mine = written[rank[a["process"]]]
        at = next(j for j, w in enumerate(mine) if w.sequence == BAD_STEP)
        expected = mine[max(0, at - window) : at + window + 1]
        assert [as_written(row) for row in a["rows"]] == expected
        assert {row["process"] for row in a["rows"]} == {a["process"]}
        assert a["rows"][a["at"]]["index"] == a["index"]
        assert a["rows"][a["at"]]["collective"]["sequence"] == BAD_STEP
        indices = [row["index"] for row in a["rows"]]
        assert indices == sorted(indices)


def test_ranks_route_refuses_a_window_out_of_bounds(dump: Any) -> None:
    runs, _ = dump
    assert refused(runs, "/api/ranks", window=51).status == 400
    assert refused(runs, "/api/ranks", window=-1).status == 400


def test_one_process_has_no_ranks(tmp_path: Path) -> None:
    write_small_dump(tmp_path)
    assert call(RunSet(tmp_path), "/api/ranks") == {"ranks": None}


def test_the_documented_example_names_the_fields_the_route_returns(dump: Any) -> None:
    runs, _ = dump
    documented = set(re.findall(r'"(\w+)":', documented_routes()["/api/ranks"]))
    assert documented and documented <= keys_of(call(runs, "/api/ranks"))
    assert np.isfinite(call(runs, "/api/ranks")["ranks"]["processes"][0]["clock_offset"])
