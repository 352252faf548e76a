"""Many processes: PyTorch DDP (gloo) under torchrun, and TensorFlow's MirroredStrategy.

The programs are in ``tests/programs/``. Each launch runs once per module
(module-scoped fixtures) and every test reads its dump:

- ``ddp_train.py`` under ``torchrun`` with 2 processes (``--standalone``) and
  with 4 (torchrun's static rendezvous, ``--master-addr``/``--master-port``,
  as multi-node jobs launch it): one rank makes -inf at a known step, and DDP's
  gradient allreduce carries it to every other rank in the same step;
- ``tf_mirrored.py``: a MirroredStrategy step over two logical CPUs, dumped by
  TensorFlow's own ``enable_dump_debug_info``; the Log on both replicas makes
  -inf, and the loss NaN.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope import analysis, open_dump
from nanscope.cli import main
from nanscope.events import _writer as writer
from nanscope.reader import EXECUTIONS, TRACES, DumpReader
from nanscope.report import note_texts
from nanscope.server.runs import RunSet

from ..helpers import call, marked_line, shift_clock

PROGRAMS = Path(__file__).parents[1] / "programs"
DDP_PROGRAM = PROGRAMS / "ddp_train.py"
PIPELINE_PROGRAM = PROGRAMS / "pipeline_train.py"
TF_PROGRAM = PROGRAMS / "tf_mirrored.py"
LAUNCH_TIMEOUT_S = 240
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TF = importlib.util.find_spec("tensorflow") is not None
# Variables of an enclosing launcher (a CI job under torchrun, say) must not leak in.
LAUNCHER_VARS = (
    "NANSCOPE_RUN_ID", "NANSCOPE_RANK", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    return {**env, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def report_json(logdir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["report", str(logdir), "--json"]) == 1  # 1: Inf/NaN found
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


# -- the default run id and world size (no launch) ---------------------------------------------


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_run_id_prefers_nanscope_then_torchelastic(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("MASTER_ADDR", "10.0.0.1")
    no_launcher.setenv("MASTER_PORT", "29500")
    no_launcher.setenv("TORCHELASTIC_RUN_ID", "4f5f805b-27fc-4379-ae17-37224a98b6c7")
    assert writer.default_run_id() == "4f5f805b-27fc-4379-ae17-37224a98b6c7"
    no_launcher.setenv("NANSCOPE_RUN_ID", "mine")
    assert writer.default_run_id() == "mine"


def test_static_rendezvous_ranks_share_a_run_id(no_launcher: pytest.MonkeyPatch) -> None:
    """torchrun's static rendezvous sets TORCHELASTIC_RUN_ID=none: the master address decides."""
    no_launcher.setenv("TORCHELASTIC_RUN_ID", "none")
    no_launcher.setenv("MASTER_ADDR", "10.0.0.1")
    no_launcher.setenv("MASTER_PORT", "29500")
    first = writer.default_run_id()
    assert re.fullmatch(r"[0-9a-f]{8}", first) and writer.default_run_id() == first
    no_launcher.setenv("MASTER_PORT", "29501")  # another job
    assert writer.default_run_id() != first


def test_run_id_without_launcher_is_fresh(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("TORCHELASTIC_RUN_ID", "none")
    ids = {writer.default_run_id() for _ in range(5)}
    assert len(ids) == 5 and all(re.fullmatch(r"[0-9a-f]{8}", i) for i in ids)


def test_world_size_comes_from_the_launcher(
    no_launcher: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert writer.default_world_size() == 0
    no_launcher.setenv("WORLD_SIZE", "4")
    no_launcher.setenv("RANK", "3")
    with writer.DumpWriter(tmp_path, "FULL_HEALTH"):
        pass
    with open_dump(tmp_path) as r:
        (p,) = r.processes
    assert (p.rank, p.world_size, p.label) == (3, 4, "rank 3")


# -- PyTorch DDP under torchrun ------------------------------------------------------------------


@dataclass(frozen=True)
class DdpRun:
    logdir: Path
    world: int
    bad_rank: int
    bad_step: int
    steps: int
    static: bool  # torchrun's static rendezvous (TORCHELASTIC_RUN_ID=none)
    printed: list[dict[str, Any]]  # what each rank printed, by rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_ddp(
    logdir: Path, world: int, bad_rank: int, bad_step: int, steps: int, static: bool
) -> DdpRun:
    if static:
        rdzv = ["--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    else:
        rdzv = ["--standalone"]
    cmd = [sys.executable, "-m", "torch.distributed.run", *rdzv, "--nproc-per-node", str(world),
           str(DDP_PROGRAM), str(logdir), str(bad_rank), str(bad_step), str(steps)]  # fmt: skip
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=clean_env(), timeout=LAUNCH_TIMEOUT_S
    )
    assert out.returncode == 0, out.stderr[-4000:]
    printed = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    printed.sort(key=lambda p: p["rank"])
    assert [p["rank"] for p in printed] == list(range(world)), out.stdout
    return DdpRun(logdir, world, bad_rank, bad_step, steps, static, printed)


DDP_RUNS: dict[str, dict[str, Any]] = {
    "standalone-2": {"world": 2, "bad_rank": 1, "bad_step": 2, "steps": 4, "static": False},
    "static-4": {"world": 4, "bad_rank": 2, "bad_step": 1, "steps": 3, "static": True},
}


@pytest.fixture(scope="module", params=list(DDP_RUNS))
def ddp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> DdpRun:
    if not HAS_TORCH:
        pytest.skip("needs PyTorch")
    logdir = tmp_path_factory.mktemp(request.param) / "dump"
    return launch_ddp(logdir, **DDP_RUNS[request.param])


@pytest.fixture
def reader(ddp: DdpRun) -> Iterator[DumpReader]:
    with open_dump(ddp.logdir) as r:
        yield r


def process_of_rank(r: DumpReader, rank: int) -> int:
    (index,) = [p.index for p in r.processes if p.rank == rank]
    return index


def allreduce_summaries(r: DumpReader) -> dict[tuple[int | None, int], tuple[int | None, ...]]:
    """(rank, step) -> the counts of the gradient allreduce's output in that step."""
    out: dict[tuple[int | None, int], tuple[int | None, ...]] = {}
    for i in range(r.num_executions()):
        e = r.execution(i)
        if e.op_type == "c10d.allreduce_.default" and e.phase == 2:  # backward: DDP's gradients
            h = e.health
            key = (r.processes[e.process].rank, e.step)
            assert key not in out, key  # one bucket: one allreduce per step
            out[key] = (h.size, h.neg_inf, h.pos_inf, h.nan, h.neg, h.zero, h.pos)
    return out


@pytest.mark.torch
@pytest.mark.slow
def test_every_rank_writes_its_own_file_set_with_one_run_id(
    ddp: DdpRun, reader: DumpReader
) -> None:
    names = [p.name for p in ddp.logdir.glob("*.metadata")]
    ranks = [int(r) for r in re.findall(r"-rank(\d+)-pid\d+-[0-9a-f]+\.metadata", " ".join(names))]
    assert len(names) == ddp.world and sorted(ranks) == list(range(ddp.world))
    assert reader.problems == []  # no "file sets from different runs" warning among them
    procs = reader.processes
    assert [p.index for p in procs] == list(range(ddp.world))  # the GUI filters by these
    assert sorted(p.rank for p in procs) == list(range(ddp.world))  # type: ignore[type-var]
    assert {p.world_size for p in procs} == {ddp.world}
    assert {p.pid: p.rank for p in procs} == {p["pid"]: p["rank"] for p in ddp.printed}
    assert {p.framework.split()[0] for p in procs} == {"torch"}
    # One run id, the one every writer chose.
    ids = {p.run_id for p in procs} | {p["run_id"] for p in ddp.printed}
    assert ids == {reader.run_id}
    launcher_ids = {p["env"]["TORCHELASTIC_RUN_ID"] for p in ddp.printed}
    if ddp.static:  # torchrun gives no id: the one derived from the master address is shared
        assert launcher_ids == {"none"}
        assert re.fullmatch(r"[0-9a-f]{8}", reader.run_id)
    else:
        assert launcher_ids == {reader.run_id}  # --standalone: torchrun's own uuid
        assert len(reader.run_id) == 36
    # Each rank recorded the whole run: every step, forward, backward and optimizer.
    rows, procs_of = reader.index(EXECUTIONS), reader.processes_of(EXECUTIONS)
    for p in procs:
        mine = rows[procs_of == p.index]
        assert sorted(set(mine["step"].tolist())) == list(range(ddp.steps)), p.label
        assert {1, 2, 3} <= set(mine["phase"].tolist()), p.label


@pytest.mark.torch
@pytest.mark.slow
def test_origin_is_the_rank_and_step_where_it_was_born(ddp: DdpRun, reader: DumpReader) -> None:
    a = analysis.analyze(reader)
    o = a.origin
    assert o is not None and a.origin_kind == "born"
    born = (EXECUTIONS, "aten.log.default", ddp.bad_rank, ddp.bad_step)
    assert (o.kind, o.op_type, o.rank, o.step) == born
    assert (o.phase, o.module_path) == ("forward", "module (LogFeatures)")
    assert (o.counts.neg_inf, o.counts.pos_inf, o.counts.nan) == (1, 0, 0)
    assert "log of zero" in o.explanation
    assert o.source is not None and o.source.file == str(DDP_PROGRAM)
    assert o.source.line == marked_line(str(DDP_PROGRAM), "# <- origin")
    assert o.process == process_of_rank(reader, ddp.bad_rank)
    # The allreduce brought it to every other rank in the same step, later in time:
    # each of them has Inf/NaN too, first in its gradient allreduce.
    rows, procs_of = reader.index(EXECUTIONS), reader.processes_of(EXECUTIONS)
    bad = np.flatnonzero(rows["nonfinite"] == 1)
    for p in reader.processes:
        if p.rank == ddp.bad_rank:
            continue
        first = int(bad[procs_of[bad] == p.index][0])
        e = reader.execution(first)
        assert (e.op_type, e.step, e.phase) == ("c10d.allreduce_.default", ddp.bad_step, 2)
        assert e.wall_time > o.wall_time, p.label
    assert a.steps == [0, ddp.steps - 1]
    assert {s["step"] for s in a.alerts.by_step} == set(range(ddp.bad_step, ddp.steps))


@pytest.mark.torch
@pytest.mark.slow
def test_collective_outputs_are_the_reduced_values_on_every_rank(
    ddp: DdpRun, reader: DumpReader
) -> None:
    """Regression: gloo's allreduce returns before the sum is in; it used to be summarised then.

    Each rank recorded its own gradients as the allreduce's output (finite on
    the ranks that were about to receive the -inf), or a mix while gloo wrote.
    """
    got = allreduce_summaries(reader)
    assert set(got) == {(r, s) for r in range(ddp.world) for s in range(ddp.steps)}
    for step in range(ddp.steps):
        per_rank = {got[(r, step)] for r in range(ddp.world)}
        assert len(per_rank) == 1, (step, per_rank)  # the same sum everywhere
        (size, neg_inf, pos_inf, nan, *_) = per_rank.pop()
        assert size == 5  # fc.weight (4) and fc.bias (1) in one bucket
        assert neg_inf is not None and pos_inf is not None and nan is not None
        assert (neg_inf + pos_inf + nan > 0) == (step >= ddp.bad_step), step


@pytest.mark.torch
@pytest.mark.slow
def test_report_names_the_rank(
    ddp: DdpRun, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = report_json(ddp.logdir, capsys)
    assert data["run_id"] and data["found_nonfinite"] is True and data["problems"] == []
    assert sorted(p["label"] for p in data["processes"]) == [f"rank {r}" for r in range(ddp.world)]
    origin = data["origin"]
    born = ("aten.log.default", ddp.bad_rank, ddp.bad_step)
    assert (origin["op_type"], origin["rank"], origin["step"]) == born
    assert data["processes"][origin["process"]]["rank"] == ddp.bad_rank
    monkeypatch.setenv("COLUMNS", "200")  # one line per event header
    assert main(["report", str(ddp.logdir)]) == 1
    text = capsys.readouterr().out
    assert f"{ddp.world} processes" in text
    (header,) = [line for line in text.splitlines() if "aten.log.default  (" in line]
    assert f"step {ddp.bad_step}," in header and f"rank {ddp.bad_rank})" in header


@pytest.mark.torch
@pytest.mark.slow
def test_gui_api_lists_the_ranks_and_filters_by_process(ddp: DdpRun, reader: DumpReader) -> None:
    runs = RunSet(ddp.logdir)
    try:
        (run,) = call(runs, "/api/runs")["runs"]
        assert run["error"] is None and run["problems"] == []
        assert run["run_id"] == reader.run_id
        labels = {p["index"]: p["label"] for p in run["processes"]}
        assert sorted(labels.values()) == [f"rank {r}" for r in range(ddp.world)]
        bad_process = process_of_rank(reader, ddp.bad_rank)
        assert labels[bad_process] == f"rank {ddp.bad_rank}"

        first = call(runs, "/api/alerts")["first"]
        assert first["kind"] == EXECUTIONS
        event = call(runs, f"/api/executions/{first['index']}")
        born = (bad_process, ddp.bad_rank, "aten.log.default", ddp.bad_step)
        assert (event["process"], event["rank"], event["op_type"], event["step"]) == born

        procs_of = reader.processes_of(EXECUTIONS)
        for p in range(ddp.world):
            page = call(runs, "/api/executions", process=p, end=500)
            assert page["total"] == int(np.count_nonzero(procs_of == p)) == len(page["rows"])
            assert {row["process"] for row in page["rows"]} == {p}
        # The bad rank's first Inf/NaN is the origin; another rank's is its allreduce.
        bad = call(runs, "/api/executions", process=bad_process, nonfinite=1, end=1)["rows"]
        assert bad[0]["index"] == first["index"]
        other = (bad_process + 1) % ddp.world
        row = call(runs, "/api/executions", process=other, nonfinite=1, end=1)["rows"][0]
        received = ("c10d.allreduce_.default", ddp.bad_step, "backward")
        assert (row["op_type"], row["step"], row["phase"]) == received
    finally:
        runs.close()


def ddp_allreduces(r: DumpReader) -> dict[int | None, list[tuple[int, int, bool | None, bool]]]:
    """rank -> its gradient allreduces, in order: (step, sequence, went in with Inf/NaN,
    came out with Inf/NaN), read from the raw records (no analysis)."""
    out: dict[int | None, list[tuple[int, int, bool | None, bool]]] = {}
    for i in range(r.num_executions()):
        e = r.execution(i)
        if e.op_type == "c10d.allreduce_.default" and e.phase == 2:
            assert e.collective is not None and e.collective.group == "0"
            (h,) = e.input_health
            sent = None if h is None else bool(h.any_nonfinite)
            entry = (e.step, e.collective.sequence, sent, bool(e.health.any_nonfinite))
            out.setdefault(r.processes[e.process].rank, []).append(entry)
    return out


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("skew", [5.0, -5.0])
def test_cross_rank_origin_is_told_by_collectives_not_clocks(
    ddp: DdpRun,
    skew: float,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0's clock runs 5 s ahead (or behind): the collectives still name the rank."""
    logdir = tmp_path / "dump"
    shutil.copytree(ddp.logdir, logdir)
    shift_clock(logdir, 0, skew)
    with open_dump(logdir) as r:
        assert r.problems == []
        # The oracle, from the raw records and the program's own injection: one numbering
        # of the allreduces on every rank; at the bad step only the bad rank put Inf/NaN
        # in, and every rank got Inf/NaN out.
        ops = ddp_allreduces(r)
        assert sorted(ops, key=str) == list(range(ddp.world))
        numbering = {tuple((step, seq) for step, seq, _, _ in v) for v in ops.values()}
        assert len(numbering) == 1
        (at_bad_step,) = [seq for step, seq, _, _ in ops[0] if step == ddp.bad_step]
        for rank, v in ops.items():
            (copy,) = [c for c in v if c[0] == ddp.bad_step]
            assert copy[2] is (rank == ddp.bad_rank) and copy[3] is True, (rank, copy)
        by_clock = r.first_nonfinite()
        assert by_clock is not None
        if skew < 0:  # what a clock-based answer would say: rank 0, which only received it
            assert r.processes[by_clock.process].rank == 0
        a = analysis.analyze(r)
        bad = process_of_rank(r, ddp.bad_rank)
    o = a.origin
    assert o is not None and a.ranks is not None
    assert (o.op_type, o.rank, o.step, o.process) == (
        "aten.log.default",
        ddp.bad_rank,
        ddp.bad_step,
        bad,
    )
    assert a.cause is not None and (a.cause.op_type, a.cause.rank) == (
        "aten.log.default",
        ddp.bad_rank,
    )
    verdict = a.ranks.to_json()
    assert (verdict["origin_process"], verdict["decided_by"]) == (bad, "collective")
    spread = verdict["spread"]
    assert spread["collective"]["sequence"] == at_bad_step and spread["step"] == ddp.bad_step
    assert spread["op_type"] == "c10d.allreduce_.default"
    assert spread["from"] == [bad]
    assert sorted(spread["reached"]) == sorted(p.index for p in r.processes if p.index != bad)
    for p in verdict["processes"]:
        if p["process"] == bad:
            assert p["role"] == "origin" and p["clock_offset"] == 0.0
            continue
        assert p["role"] == "received" and p["senders"] == [bad], p
        assert p["via"]["collective"]["sequence"] == at_bad_step
        # Aligned on the collective they shared: rank 0's offset undoes the skew.
        expected = -skew if p["rank"] == 0 else 0.0
        assert p["clock_offset"] == pytest.approx(expected, abs=0.5), p
    assert not any("by clock" in n for n in note_texts(a))
    # The terminal report says the same, with the per-rank table.
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", str(logdir)]) == 1
    text = capsys.readouterr().out
    assert f"Ranks: born on rank {ddp.bad_rank} (told by the collectives" in text
    others = ", ".join(f"rank {r}" for r in range(ddp.world) if r != ddp.bad_rank)
    label = f"collective #{at_bad_step} of group 0 (default_pg)"
    assert (
        f"spread by c10d.allreduce_.default, {label}, at step {ddp.bad_step}: "
        f"from rank {ddp.bad_rank} to {others}"
    ) in text
    table = text[text.index("Ranks: born") :].splitlines()[3 : 3 + ddp.world]
    assert table[0].split()[:4] == ["rank", str(ddp.bad_rank), "origin", "#" + str(o.index)]
    for line in table[1:]:
        assert f"received: {label} from rank {ddp.bad_rank}" in line, line


# -- a two-stage pipeline: send and receive -----------------------------------------------------


@pytest.fixture(scope="module", params=["native", "python"])
def pipeline(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipeline, recorded by each PyTorch recorder (both tag sends and receives)."""
    if not HAS_TORCH:
        pytest.skip("needs PyTorch")
    logdir = tmp_path_factory.mktemp("pipeline") / "dump"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(PIPELINE_PROGRAM), str(logdir), str(PIPELINE_BAD_STEP), "4"]  # fmt: skip
    env = {**clean_env(), "NANSCOPE_TORCH_RECORDER": request.param}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=LAUNCH_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-4000:]
    return logdir


PIPELINE_BAD_STEP = 2


@pytest.mark.torch
@pytest.mark.slow
def test_pipeline_origin_is_the_stage_that_sent_it(pipeline: Path, tmp_path: Path) -> None:
    """Rank 1's clock runs 5 s behind: its first Inf/NaN looks earliest, but it received it."""
    logdir = tmp_path / "dump"
    shutil.copytree(pipeline, logdir)
    shift_clock(logdir, 1, -5.0)
    with open_dump(logdir) as r:
        assert r.problems == []
        # The oracle, from the raw records: rank 0's activations sent at the bad step went
        # out with Inf/NaN, and rank 1's receive of the same number took them in.
        sends: dict[tuple[int | None, int | None, int], tuple[int, Any]] = {}
        recvs: dict[tuple[int | None, int | None, int], tuple[int, Any]] = {}
        for i in range(r.num_executions()):
            e = r.execution(i)
            c = e.collective
            if c is not None and c.kind in ("send", "recv"):
                rank = r.processes[e.process].rank
                table = sends if c.kind == "send" else recvs
                # A receive records no input: its buffer is not something sent.
                sent = e.input_health[0] if e.input_health else None
                table[(rank, c.peer, c.sequence)] = (e.step, sent)
        bad_send = [k for k, (step, h) in sends.items()
                    if k[0] == 0 and step == PIPELINE_BAD_STEP and h is not None and h.any_nonfinite]  # fmt: skip
        assert len(bad_send) == 1
        (_, _, seq) = bad_send[0]
        assert (1, 0, seq) in recvs and recvs[(1, 0, seq)][0] == PIPELINE_BAD_STEP
        by_clock = r.first_nonfinite()
        assert by_clock is not None and r.processes[by_clock.process].rank == 1
        a = analysis.analyze(r)
        stage0, stage1 = process_of_rank(r, 0), process_of_rank(r, 1)
    o = a.origin
    assert o is not None and a.ranks is not None
    assert (o.op_type, o.rank, o.step) == ("aten.log.default", 0, PIPELINE_BAD_STEP)
    assert o.source is not None and o.source.line == marked_line(
        str(PIPELINE_PROGRAM), "# <- origin"
    )
    v = a.ranks.to_json()
    assert v["decided_by"] == "collective" and v["origin_process"] == stage0
    (received,) = [p for p in v["processes"] if p["process"] == stage1]
    assert received["role"] == "received" and received["senders"] == [stage0]
    via = received["via"]["collective"]
    assert (via["kind"], via["peer"], via["sequence"]) == ("recv", 0, seq)
    spread = v["spread"]
    assert [c["collective"]["kind"] for c in spread["copies"]] == ["send", "recv"]
    assert (spread["from"], spread["reached"]) == ([stage0], [stage1])
    # A receive ends when it got the data, however late its rank came to it: the offset
    # is approximate (a collective, which every member leaves together, aligns better).
    assert received["clock_offset"] == pytest.approx(5.0, abs=1.5)


# -- TensorFlow MirroredStrategy over two logical CPUs -------------------------------------------

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


@pytest.fixture(scope="module")
def tf_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAS_TF:
        pytest.skip("needs TensorFlow")
    logdir = tmp_path_factory.mktemp("mirrored") / "dump"
    out = subprocess.run(
        [sys.executable, str(TF_PROGRAM), str(logdir)],
        capture_output=True, text=True, env=clean_env(), timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.split() == ["nan"]  # the loss
    return logdir


def tf_line(marker: str) -> int:
    return marked_line(str(TF_PROGRAM), f"# <- {marker}")


@pytest.mark.tf
@pytest.mark.slow
def test_mirrored_dump_reads_cleanly(tf_logdir: Path) -> None:
    with open_dump(tf_logdir) as r:
        assert r.problems == []
        (p,) = r.processes  # TensorFlow writes one file set per host, for both devices
        assert p.framework.startswith("tensorflow ") and p.rank is None
        assert set(r.devices(0).values()) >= {CPU0, CPU1}
        assert r.num_executions() > 0 and r.num_graph_execution_traces() > 0
        traces = r.traces()
        assert {t.tensor_debug_mode.name for t in traces} == {"FULL_HEALTH"}
        # Each replica's Log made one -inf of its two rows, and its labels * log one NaN.
        forward = {
            (t.op_type, t.device_name): (t.op_name, t.health.size, t.health.neg_inf, t.health.nan)
            for t in traces
            if t.op_name in ("Log", "replica_1/Log", "mul", "replica_1/mul")
        }
        assert forward == {
            ("Log", CPU0): ("Log", 2, 1, 0), ("Log", CPU1): ("replica_1/Log", 2, 1, 0),
            ("Mul", CPU0): ("mul", 2, 0, 1), ("Mul", CPU1): ("replica_1/mul", 2, 0, 1),
        }  # fmt: skip
        logs = [t for t in traces if t.op_type == "Log"]
        assert {r.graph(t.graph_id).name for t in logs} == {"train_step"}  # type: ignore[union-attr]
        for t in logs:  # both replicas' ops come from the one source line
            op = r.graph_op(t.graph_id, t.op_name)
            assert op is not None
            mine = [f.lineno for f in r.stack(op) if f.file_path == str(TF_PROGRAM)]
            assert mine[-1] == tf_line("origin")  # innermost: TensorFlow's own frames


@pytest.mark.tf
@pytest.mark.slow
def test_mirrored_report_finds_the_log_and_its_line(
    tf_logdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = report_json(tf_logdir, capsys)
    assert data["framework"].startswith("tensorflow ") and data["problems"] == []
    assert data["origin_kind"] == "born"
    origin = data["origin"]
    assert (origin["kind"], origin["op_type"], origin["rank"]) == (TRACES, "Log", None)
    assert origin["graph_name"] == "train_step"
    assert origin["counts"]["neg_inf"] == 1 and "log of zero" in origin["explanation"]
    assert origin["source"]["file"] == str(TF_PROGRAM)
    source = origin["source"]
    assert (source["line"], source["function"]) == (tf_line("origin"), "replica_step")
    assert data["first_inf"]["index"] == origin["index"]
    first_nan = data["first_nan"]
    assert (first_nan["op_type"], first_nan["source"]["line"]) == ("Mul", tf_line("first_nan"))
    assert [c["op_type"] for c in data["chain"]] == ["Log", "Mul"]


@pytest.mark.tf
@pytest.mark.slow
def test_mirrored_graph_traces_show_both_devices(tf_logdir: Path) -> None:
    runs = RunSet(tf_logdir)
    try:
        page = call(runs, "/api/traces", end=1000)
        assert page["total"] == len(page["rows"]) > 0
        assert {row["device"] for row in page["rows"]} == {CPU0, CPU1}
        logs = call(runs, "/api/traces", op_type="Log")["rows"]
        assert sorted(row["device"] for row in logs) == [CPU0, CPU1]
        assert all(row["nonfinite"] and row["counts"]["neg_inf"] == 1 for row in logs)
        # Both replicas' gradients went through the cross-device reduction.
        reduce = call(runs, "/api/traces", op_type="CollectiveReduceV2")["rows"]
        assert sorted(row["device"] for row in reduce) == [CPU0, CPU1]
        assert all(row["counts"]["nan"] == 2 for row in reduce)
        first = call(runs, "/api/alerts")["first"]
        assert first["kind"] == TRACES and first["index"] == logs[0]["index"]
        trace = call(runs, f"/api/traces/{first['index']}")
        assert (trace["op_type"], trace["process"]) == ("Log", 0)
        mine = [f for f in trace["stack"] if f["file"] == str(TF_PROGRAM)]
        assert mine[-1]["line"] == tf_line("origin") and mine[-1]["user"] is True
    finally:
        runs.close()
