"""The reader: index, decoding, live dumps, and damaged input."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent, TraceEvent
from nanscope.format import files, records
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.reader import EXECUTIONS, TRACES

from ..helpers import full_health, write_small_dump


def test_index_and_decoding(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=10, bad=(6, 8))
    with nanscope.open_dump(tmp_path) as r:
        assert r.problems == []
        assert r.num_executions() == 10 and r.num_graph_execution_traces() == 10
        idx = r.index(EXECUTIONS)
        assert idx["step"].tolist() == list(range(10))
        assert [r.string(i) for i in idx["name"][:4]] == ["op0", "op1", "op2", "op0"]
        assert r.nonfinite(EXECUTIONS).tolist() == [6, 8]
        assert idx["neg_inf"][6] == 2 and idx["nonfinite"][5] == 0
        ref = r.first_nonfinite(EXECUTIONS)
        assert ref is not None and ref.index == 6
        ex = r.execution(6)
        assert ex.op_type == "op0" and ex.output_tensor_ids == (7,) and ex.input_tensor_ids == (6,)
        assert ex.health.neg_inf == 2 and ex.health.any_nonfinite
        assert ex.sequence == 7 and ex.step == 6
        (frame,) = [f for f in r.stack(ex) if f.file_path.endswith("helpers.py")]
        assert frame.function == "write_small_dump"
        assert "capture_stack" in r.source_lines(frame.file_index)[frame.lineno - 1]
        tr = r.trace(7)
        assert (tr.op_name, tr.op_type, tr.graph_ids) == ("Log", "Log", ("g",))
        assert [r.string(t) for t in r.trace_op_types()[:2]] == ["Placeholder", "Log"]
        assert [t.index for t in r.traces(8, 100)] == [8, 9]
        with pytest.raises(IndexError, match="out of range"):
            r.execution(10)


def test_sidecar_serves_the_index_without_decoding(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=30, bad=(3,))
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 30 and r.nonfinite(EXECUTIONS).tolist() == [3]
        assert r.decoded_for_index() == 0


def test_index_without_sidecar_is_identical(tmp_path: Path) -> None:
    """TensorFlow writes no sidecar: scanning must give the same index."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_small_dump(a, n=30, bad=(3, 17))
    shutil.copytree(a, b)
    for p in b.glob("*.nsidx"):
        p.unlink()
    with nanscope.open_dump(a) as ra, nanscope.open_dump(b) as rb:
        assert ra.decoded_for_index() == 0 and rb.decoded_for_index() == 60
        for kind in (EXECUTIONS, TRACES):
            ia, ib = ra.index(kind), rb.index(kind)
            for col in (
                "offset",
                "length",
                "step",
                "sequence",
                "neg_inf",
                "nan",
                "nonfinite",
            ):
                np.testing.assert_array_equal(ia[col], ib[col], err_msg=col)
            assert [ra.string(x) for x in ia["name"]] == [rb.string(x) for x in ib["name"]]


def test_sidecar_that_disagrees_is_ignored(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=20, bad=(11,))
    (fs,) = files.discover(tmp_path)
    # Swap in the sidecar of another dump: rows no longer match the records.
    other = tmp_path.parent / "other"
    write_small_dump(other, n=5, bad=())
    (ofs,) = files.discover(other)
    sidecar = Path(str(fs.path("execution")) + ".nsidx")
    shutil.copy(str(ofs.path("execution")) + ".nsidx", sidecar)
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 20
        assert r.nonfinite(EXECUTIONS).tolist() == [11]


def test_live_dump_is_read_incrementally(tmp_path: Path) -> None:
    w = DumpWriter(tmp_path, "FULL_HEALTH", -1, flush_interval=3600)
    try:
        w.write_execution(ExecutionEvent("a", [1], summaries=[full_health()]))
        w.flush()
        r = nanscope.open_dump(tmp_path)
        assert r.num_executions() == 1 and r.first_nonfinite() is None
        assert not r.update()  # nothing new
        for i in range(5):
            w.write_execution(ExecutionEvent("b", [i], summaries=[full_health(nan=int(i == 3))]))
        w.flush()
        assert r.update()
        assert r.num_executions() == 6 and r.nonfinite(EXECUTIONS).tolist() == [4]
        assert r.execution(5).op_type == "b"
        r.close()
    finally:
        w.close()


def test_circular_rewrite_is_reindexed(tmp_path: Path) -> None:
    w = DumpWriter(tmp_path, "FULL_HEALTH", 3, flush_interval=3600, origin_window=0)
    try:
        for i in range(3):
            w.write_execution(ExecutionEvent("a", [i], summaries=[full_health()]))
        w.flush()
        r = nanscope.open_dump(tmp_path)
        assert [e.sequence for e in r.executions()] == [1, 2, 3]
        old = r.execution(0)
        for i in range(2):
            w.write_execution(ExecutionEvent("b", [i], summaries=[full_health()]))
        w.flush()
        assert old.sequence == 1
        r.update()
        assert [e.sequence for e in r.executions()] == [3, 4, 5] and r.generation >= 1
        r.close()
    finally:
        w.close()


def test_torn_last_record_is_a_warning_and_everything_before_is_read(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=8, bad=())
    (fs,) = files.discover(tmp_path)
    for p in (fs.path("execution"), Path(str(fs.path("execution")) + ".nsidx")):
        data = p.read_bytes()
        if p.suffix == ".nsidx":
            p.unlink()
            continue
        p.write_bytes(data[:-7])
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 7
        (problem,) = r.problems
        assert problem.severity == "warning" and "incomplete record" in problem.message


def test_flipped_byte_reports_file_and_offset(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=8, bad=())
    (fs,) = files.discover(tmp_path)
    path = fs.path("graph_execution_traces")
    Path(str(path) + ".nsidx").unlink()
    data = bytearray(path.read_bytes())
    third = records.scan(bytes(data), "x").records[3].offset
    data[third + records.HEADER_SIZE + 5] ^= 0x01
    path.write_bytes(bytes(data))
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_graph_execution_traces() == 7
        (problem,) = r.problems
        assert problem.severity == "error"
        assert str(path) in problem.message and f"byte offset {third}" in problem.message


def test_missing_files_and_empty_metadata(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=4, bad=())
    (fs,) = files.discover(tmp_path)
    fs.path("graph_execution_traces").unlink()
    fs.path("stack_frames").unlink()
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 4 and r.num_graph_execution_traces() == 0
        (problem,) = r.problems
        assert "missing .stack_frames, .graph_execution_traces" in problem.message
        assert r.stack(r.execution(0)) == []  # frames unknown, not a crash


def test_newer_format_version_is_flagged(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=2, bad=())
    (fs,) = files.discover(tmp_path)
    ev = pb.DebugEvent(wall_time=1.0)
    ev.debug_metadata.file_version = "debug.Event:2"
    fs.path("metadata").write_bytes(records.frame(ev.SerializeToString()))
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 2
        assert any("newer than this nanscope reads" in p.message for p in r.problems)


def test_missing_and_empty_logdir(tmp_path: Path) -> None:
    with pytest.raises(nanscope.DumpNotFoundError, match="no such directory"):
        nanscope.open_dump(tmp_path / "absent")
    with pytest.raises(nanscope.DumpNotFoundError, match="no tfdbg2 dump here"):
        nanscope.open_dump(tmp_path)


def test_garbage_files_do_not_crash(tmp_path: Path) -> None:
    prefix = files.file_set_prefix(tmp_path, 1, "h")
    for s in files.SUFFIXES:
        files.FileSet(prefix).path(s).write_bytes(os.urandom(300))
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 0
        assert r.problems and all(p.message for p in r.problems)


def test_many_processes_one_run(tmp_path: Path) -> None:
    for rank in (1, 0):
        write_small_dump(tmp_path, n=5, bad=(2,) if rank == 1 else (), rank=rank, run_id="shared")
    with nanscope.open_dump(tmp_path) as r:
        assert r.run_id == "shared" and r.problems == []
        assert sorted(p.rank for p in r.processes) == [0, 1]  # type: ignore[type-var]  # a None rank fails
        assert r.num_executions() == 10
        ref = r.first_nonfinite(EXECUTIONS)
        assert ref is not None
        assert r.processes[ref.process].rank == 1
        assert r.execution(ref.index).process == ref.process


def test_process_indices_follow_the_start_time_order(tmp_path: Path) -> None:
    """Regression: ``ProcessInfo.index`` and graphs kept the order of the file names.

    Processes are ordered by start time; the GUI filters by ``processes[i].index``.
    """
    first = write_small_dump(tmp_path, n=5, bad=(2,), rank=1, run_id="shared")
    write_small_dump(tmp_path, n=5, bad=(), rank=0, run_id="shared")
    # The earlier set's name sorts last (as when ranks start in another second).
    for f in list(tmp_path.glob(f"{first.prefix.name}.*")):
        f.rename(f.with_name(f.name.replace(first.prefix.name, "tfdbg_events.9999999999.h-rank1")))
    with nanscope.open_dump(tmp_path) as r:
        assert r.problems == []
        assert [p.rank for p in r.processes] == [1, 0]  # rank 1 started first
        assert [p.index for p in r.processes] == [0, 1]
        for p in r.processes:
            assert {g.process for g in r.graphs(p.index).values()} == {p.index}
        ref = r.first_nonfinite(EXECUTIONS)
        assert ref is not None and r.processes[ref.process].rank == 1
        assert r.execution(ref.index).process == ref.process == r.processes[ref.process].index


def test_a_set_found_later_that_started_earlier_moves_the_others(tmp_path: Path) -> None:
    early, late = tmp_path / "early", tmp_path / "late"
    write_small_dump(early, n=5, bad=(2,), rank=1, run_id="shared")
    write_small_dump(late, n=3, bad=(), rank=0, run_id="shared")
    with nanscope.open_dump(late) as r:
        assert [p.rank for p in r.processes] == [0] and r.num_executions() == 3
        generation = r.generation
        for f in early.iterdir():  # copied in while the reader is open
            f.rename(late / f.name)
        assert r.update()
        assert [(p.rank, p.index) for p in r.processes] == [(1, 0), (0, 1)]
        assert r.generation > generation  # earlier indices moved: viewers reload
        procs = r.processes_of(EXECUTIONS)
        assert procs.tolist() == [0] * 5 + [1] * 3
        for i in range(r.num_executions()):
            assert r.execution(i).process == procs[i]
        assert {g.process for g in r.graphs(1).values()} == {1}
        ref = r.first_nonfinite(EXECUTIONS)
        assert ref is not None and r.processes[ref.process].rank == 1


def test_trace_written_before_its_graph_is_tolerated(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "FULL_HEALTH", -1) as w:
        w.write_trace(TraceEvent("unknown-graph", "X", 0, full_health()))
    with nanscope.open_dump(tmp_path) as r:
        tr = r.trace(0)
        assert tr.op_type == "" and tr.graph_ids == ("unknown-graph",)


def test_batched_traces_index_matches_a_scan(tmp_path: Path) -> None:
    """Batches take a vectorised path to the sidecar: it must agree with decoding."""
    a, b = tmp_path / "a", tmp_path / "b"
    with DumpWriter(a, "FULL_HEALTH", -1) as w:
        for call in range(3):
            m = np.stack([full_health(neg_inf=int(call == 2 and i == 4)) for i in range(7)])
            w.write_traces("g", [f"op{i}" for i in range(7)], list(range(7)), m, step=call)
            w.write_trace(TraceEvent("g", "single", 0, full_health(), step=call))
    shutil.copytree(a, b)
    for p in b.glob("*.nsidx"):
        p.unlink()
    with nanscope.open_dump(a) as ra, nanscope.open_dump(b) as rb:
        assert ra.decoded_for_index() == 0 and rb.decoded_for_index() == 24
        ia, ib = ra.index(TRACES), rb.index(TRACES)
        for col in ("offset", "length", "slot", "step", "sequence", "neg_inf", "nonfinite"):
            np.testing.assert_array_equal(ia[col], ib[col], err_msg=col)
        assert [ra.string(x) for x in ia["name"]] == [rb.string(x) for x in ib["name"]]
        assert ra.nonfinite(TRACES).tolist() == [20]
        assert ra.trace(20).op_name == "op4" and ra.trace(23).op_name == "single"
