"""Multi-host dumps given as several directories: one DumpReader, ``report`` and ``serve`` over
the directories of one run, each host's ranks in its own.

The dumps are written with nanscope's own writer: host A's ranks 0 and 1 in one directory,
host B's ranks 2 and 3 in another, all of one run id; rank 2 makes an Inf. The oracle is the
same four file sets copied into one directory, the layout one reader has always read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope import DumpNotFoundError, open_dump
from nanscope.cli import main
from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.format import files
from nanscope.reader import DumpReader, read_run_id
from nanscope.server.runs import RunSet
from tests.helpers import call, full_health

RUN_ID = "run-multihost"
WORLD_SIZE = 4
STEPS = 5
BAD_RANK, BAD_STEP = 2, 3  # on host B


def write_rank(
    logdir: Path, rank: int, host: str, run_id: str = RUN_ID, steps: int = STEPS
) -> None:
    """One rank's file set: ``steps`` executions, each the input of the next; on BAD_RANK a
    log makes -inf at BAD_STEP, and it stays to the end (harmful)."""
    w = DumpWriter(
        logdir, "FULL_HEALTH", circular_buffer_size=-1, run_id=run_id, rank=rank,
        world_size=WORLD_SIZE, host_name=host,
    )  # fmt: skip
    stack = w.capture_stack()
    for step in range(steps):
        bad = rank == BAD_RANK and step >= BAD_STEP
        h = full_health(neg_inf=2 if bad else 0)
        op = "aten.log.default" if rank == BAD_RANK and step == BAD_STEP else "aten.mul.Tensor"
        w.write_execution(
            ExecutionEvent(op, [step + 1], [step],
                           summaries=[h], stack=stack, step=step)
        )  # fmt: skip
    w.close()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Host A's dump directory (ranks 0, 1) and host B's (ranks 2, 3)."""
    a = tmp_path_factory.mktemp("hostA") / "dump"
    b = tmp_path_factory.mktemp("hostB") / "dump"
    for rank in (0, 1):
        write_rank(a, rank, "hostA")
    for rank in (2, 3):
        write_rank(b, rank, "hostB")
    return a, b


@pytest.fixture(scope="module")
def shared(hosts: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The oracle: all four file sets copied into one directory."""
    one = tmp_path_factory.mktemp("shared")
    for d in hosts:
        for p in d.iterdir():
            shutil.copy2(p, one / p.name)
    return one


def copy_rank(src: Path, rank: int, dst: Path) -> None:
    """Copy the file set of ``rank`` (with its sidecars) from ``src`` into ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.glob(f"{files.PREFIX}.*-rank{rank}-*"):
        shutil.copy2(p, dst / p.name)


def report_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["report", *argv, "--json"]) == 1  # 1: a harmful Inf found
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


# -- the reader --------------------------------------------------------------------------------


def test_reader_reads_every_directory_as_one_dump(hosts: tuple[Path, Path], shared: Path) -> None:
    a, b = hosts
    with DumpReader([a, b]) as r, DumpReader(shared) as oracle:
        assert r.logdir == a and r.logdirs == [a, b]
        assert sorted(p.rank for p in r.processes if p.rank is not None) == [0, 1, 2, 3]
        assert {p.host.split("-rank")[0] for p in r.processes} == {"hostA", "hostB"}
        assert r.run_id == RUN_ID and not r.problems
        assert r.num_executions() == 4 * STEPS == oracle.num_executions()
        # Ordered as in one directory: by start time, then name.
        assert [p.name for p in r.processes] == [p.name for p in oracle.processes]
        assert np.array_equal(r.processes_of("execution"), oracle.processes_of("execution"))
        first = r.first_nonfinite()
        assert first is not None
        assert r.processes[first.process].rank == BAD_RANK
        assert r.execution(first.index).op_type == "aten.log.default"
        # The sidecar index next to each file set was used (nothing to decode for it).
        assert r.decoded_for_index() == 0


def test_open_dump_takes_several_roots_and_one_as_before(hosts: tuple[Path, Path]) -> None:
    a, b = hosts
    with open_dump([str(a), str(b)]) as r:
        assert len(r.processes) == 4
    with open_dump(a) as r, DumpReader([a, a]) as twice:  # one root named twice is read once
        assert r.logdirs == [a] and len(r.processes) == 2
        assert len(twice.processes) == 2 and twice.logdirs == [a]


def test_file_sets_of_one_name_in_two_roots_stay_apart(
    hosts: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = hosts
    copy = tmp_path / "copy"
    copy_rank(a, 0, copy)  # the same name as rank 0's set in a
    with DumpReader([a, copy]) as r:
        assert len(r.processes) == 3 and r.num_executions() == 3 * STEPS
        (name,) = {p.name for p in r.processes if p.rank == 0}
        assert [p.rank for p in r.processes].count(0) == 2
        assert any(p.name == name for p in r.processes)


def test_update_finds_a_file_set_that_appears_later_in_any_root(
    hosts: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = hosts
    late = tmp_path / "hostB"
    copy_rank(b, 2, late)
    with DumpReader([a, late]) as r:
        assert len(r.processes) == 3
        assert not r.update()
        write_rank(late, 3, "hostB")
        assert r.update()
        assert sorted(p.rank for p in r.processes if p.rank is not None) == [0, 1, 2, 3]
        assert r.num_executions() == 4 * STEPS
        first = r.first_nonfinite()
        assert first is not None and r.processes[first.process].rank == BAD_RANK


def test_different_run_ids_across_roots_are_named_with_the_roots(
    hosts: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = hosts
    other = tmp_path / "other"
    write_rank(other, 2, "hostB", run_id="another-run")
    with DumpReader([a, other]) as r:
        messages = [p.message for p in r.problems]
    assert (
        f"file sets from different runs (another-run, {RUN_ID}) in {a}, {other}: "
        "give the directories of one run"
    ) in messages


def test_a_missing_root_is_named(hosts: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = hosts
    missing = tmp_path / "nope"
    with pytest.raises(DumpNotFoundError, match=f"^{missing}: no such directory"):
        DumpReader([a, missing])


def test_read_run_id(hosts: tuple[Path, Path], tmp_path: Path) -> None:
    assert read_run_id(hosts[1]) == RUN_ID
    assert read_run_id(tmp_path) is None


# -- nanscope report ---------------------------------------------------------------------------


def test_report_of_two_roots_equals_the_report_of_one_shared_directory(
    hosts: tuple[Path, Path], shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = hosts
    two = report_json([str(a), str(b)], capsys)
    one = report_json([str(shared)], capsys)
    assert two.pop("logdir") == str(a)
    assert one.pop("logdir") == str(shared)
    assert two.pop("logdirs") == [str(d) for d in hosts] and one.pop("logdirs") == [str(shared)]
    assert two == one
    assert two["found_harmful"] and two["origin"]["rank"] == BAD_RANK
    assert two["origin"]["op_type"] == "aten.log.default"


def test_report_of_a_missing_root_fails_in_one_line(
    hosts: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "hostC"
    assert main(["report", str(hosts[0]), str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err


# -- nanscope serve ----------------------------------------------------------------------------


@pytest.fixture
def logdirs(hosts: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """Two hosts' logdirs with runs below them: ``job1`` of RUN_ID on both (ranks 0, 1 on
    the first, 2, 3 on the second), and ``solo`` of a different run on each."""
    a, b = hosts
    first, second = tmp_path / "a" / "logs", tmp_path / "b" / "logs"
    for rank in (0, 1):
        copy_rank(a, rank, first / "job1")
    for rank in (2, 3):
        copy_rank(b, rank, second / "job1")
    write_rank(first / "solo", 0, "hostA", run_id="solo-a", steps=1)
    write_rank(second / "solo", 0, "hostB", run_id="solo-b", steps=1)
    return first, second


def test_runs_of_one_run_id_under_two_logdirs_are_one_run(logdirs: tuple[Path, Path]) -> None:
    first, second = logdirs
    runs = RunSet([first, second], refresh_interval=0)
    try:
        assert runs.logdir == first and runs.logdirs == [first, second]
        listed = {r["run"]: r for r in call(runs, "/api/runs")["runs"]}
        assert sorted(listed) == ["job1", "solo", "solo@2"]
        job = listed["job1"]
        assert job["run_id"] == RUN_ID and job["num_executions"] == 4 * STEPS
        assert sorted(p["rank"] for p in job["processes"]) == [0, 1, 2, 3]
        assert runs.get("job1").paths == (first / "job1", second / "job1")
        assert {listed["solo"]["run_id"], listed["solo@2"]["run_id"]} == {"solo-a", "solo-b"}
        first = call(runs, "/api/alerts", run="job1")["first"]
        event = call(runs, f"/api/executions/{first['index']}", run="job1")
        assert event["op_type"] == "aten.log.default"
        assert job["processes"][event["process"]]["rank"] == BAD_RANK
    finally:
        runs.close()


def test_a_run_gains_the_directory_that_another_logdir_gets_later(
    hosts: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = hosts
    first, second = tmp_path / "a", tmp_path / "b"
    copy_rank(a, 0, first / "job1")
    second.mkdir()
    runs = RunSet([first, second], refresh_interval=0)
    try:
        (job,) = call(runs, "/api/runs")["runs"]
        assert job["run"] == "job1" and len(job["processes"]) == 1
        copy_rank(b, 2, second / "job1")
        (job,) = call(runs, "/api/runs")["runs"]
        assert job["run"] == "job1" and sorted(p["rank"] for p in job["processes"]) == [0, 2]
    finally:
        runs.close()


def test_one_logdir_is_served_as_before(logdirs: tuple[Path, Path]) -> None:
    first, _ = logdirs
    runs = RunSet(first, refresh_interval=0)
    try:
        assert runs.logdirs == [first] and runs.names() == ["job1", "solo"]
        job = runs.get("job1")
        assert job.paths == (first / "job1",) and job.path == first / "job1"
        listed = call(runs, "/api/runs")
        assert listed["logdir"] == str(first)
        assert [len(r["processes"]) for r in listed["runs"]] == [2, 1]
    finally:
        runs.close()


def test_a_missing_logdir_is_named(logdirs: tuple[Path, Path], tmp_path: Path) -> None:
    missing = tmp_path / "c" / "logs"
    with pytest.raises(DumpNotFoundError, match="no such directory") as info:
        RunSet([logdirs[0], missing])
    assert str(missing) in str(info.value)


def test_a_directory_whose_metadata_is_being_written_waits_for_its_run_id(
    hosts: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = hosts
    first, second = tmp_path / "a", tmp_path / "b"
    copy_rank(a, 0, first / "job1")
    starting = second / "job1" / f"{files.PREFIX}.0000000001.hostB-rank2-pid1-abcdef.metadata"
    starting.parent.mkdir(parents=True)
    starting.touch()  # created, its record not written yet
    runs = RunSet([first, second], refresh_interval=0)
    try:
        assert runs.names() == ["job1"] and runs.get("job1").paths == (first / "job1",)
        starting.unlink()
        copy_rank(b, 2, second / "job1")
        assert runs.names() == ["job1"]
        assert runs.get("job1").paths == (first / "job1", second / "job1")
    finally:
        runs.close()
