"""Never a false all-clear: damage is found when a file is indexed, whichever path indexes
it; decoding never raises for a damaged record; problems say when an event history is
incomplete; and any number of processes is read within the descriptor limit."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.analysis import analyze
from nanscope.format import files, records
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.reader import EXECUTIONS, TRACES, DumpReader, Problem, _eventfile, _fastscan, _handles

from ..helpers import write_small_dump

KINDS = ((EXECUTIONS, files.EXECUTION), (TRACES, files.GRAPH_EXECUTION_TRACES))


def offsets_of(path: Path) -> list[int]:
    return [r.offset for r in records.scan(path.read_bytes(), str(path)).records]


def flip(path: Path, at: int) -> None:
    """Flip one bit of ``path`` at ``at``, in place (same inode)."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 0x10]))


def summary(r: DumpReader) -> tuple[list[tuple[str, str, bool, str | None, int | None]], bytes]:
    problems = [(p.severity, p.message, p.incomplete, p.file, p.offset) for p in r.problems]
    index = b"".join(
        np.ascontiguousarray(r.index(k)[c]).tobytes()
        for k, _ in KINDS
        for c in ("offset", "length", "sequence", "step", "nonfinite", "neg_inf")
    )
    return problems, index


# -- 1. damage is found when the file is indexed -------------------------------------------------


@pytest.mark.parametrize(("kind", "suffix"), KINDS)
@pytest.mark.parametrize("where", ["payload", "footer"])
def test_a_bad_crc_in_the_middle_is_found_when_a_sidecar_serves_the_index(
    tmp_path: Path, kind: str, suffix: str, where: str
) -> None:
    write_small_dump(tmp_path, n=30, bad=(3,))
    (fs,) = files.discover(tmp_path)
    path = fs.path(suffix)
    assert Path(str(path) + files.INDEX_SUFFIX).exists()
    starts = offsets_of(path)
    damaged = starts[12]
    length = starts[13] - damaged
    flip(path, damaged + (records.HEADER_SIZE + 7 if where == "payload" else length - 2))
    with nanscope.open_dump(tmp_path) as r:
        assert r.decoded_for_index() == 0  # the sidecar still served the index
        assert r.num(kind) == 29  # the damaged record is skipped
        assert damaged not in r.index(kind)["offset"].tolist()
        assert 13 not in r.index(kind)["sequence"].tolist()
        (problem,) = r.problems
        assert problem.severity == "error" and problem.incomplete
        assert (problem.file, problem.offset) == (str(path), damaged)
        assert f"byte offset {damaged}" in problem.message and "bad payload CRC" in problem.message
        assert r.incomplete == [problem]
        assert r.incomplete_events(0, kind) == [problem]
        other = TRACES if kind == EXECUTIONS else EXECUTIONS
        assert r.incomplete_events(0, other) == []
        for i in range(r.num(kind)):  # everything indexed decodes
            event = r.execution(i) if kind == EXECUTIONS else r.trace(i)
            assert event.problems == ()
        with_sidecar = summary(r)
    # The scan (no sidecar) finds the same damage, reports it the same, builds the same index.
    for p in tmp_path.glob("*" + files.INDEX_SUFFIX):
        p.unlink()
    old = _eventfile.EventFile.write_sidecar
    _eventfile.EventFile.write_sidecar = False
    try:
        with nanscope.open_dump(tmp_path) as r:
            assert summary(r) == with_sidecar
    finally:
        _eventfile.EventFile.write_sidecar = old


def test_damage_in_many_records_and_chunks_is_each_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of a few records (and records larger than a block, read in pieces)."""
    write_small_dump(tmp_path, n=40, bad=(3,))
    (fs,) = files.discover(tmp_path)
    path = fs.path(files.GRAPH_EXECUTION_TRACES)
    starts = offsets_of(path)
    hit = [0, 1, 17, 39]
    for i in hit:
        flip(path, starts[i] + records.HEADER_SIZE + 3)
    for chunk, rows in ((1 << 20, 1 << 16), (300, 7), (40, 3)):  # 40: all larger than a block
        monkeypatch.setattr(_eventfile, "VERIFY_CHUNK", chunk)
        monkeypatch.setattr(_eventfile, "_VERIFY_ROWS", rows)
        with nanscope.open_dump(tmp_path) as r:
            assert r.num(TRACES) == 36 and r.num(EXECUTIONS) == 40
            assert [p.offset for p in r.incomplete] == [starts[i] for i in hit], chunk
            assert r.decoded_for_index() == 0


def test_damage_in_one_process_of_many_leaves_the_others_whole(tmp_path: Path) -> None:
    """Many processes' sidecar rows are read into one merged index: a damaged record
    closes up its process's part, and every other row stays its process's."""
    write_small_dump(tmp_path / "one", n=10, bad=(3,))
    copy_sets(tmp_path / "one", tmp_path / "many", 3)
    sets = files.discover(tmp_path / "many")
    path = sets[1].path(files.GRAPH_EXECUTION_TRACES)
    at = offsets_of(path)[5]
    flip(path, at + records.HEADER_SIZE + 1)
    with nanscope.open_dump(tmp_path / "many") as r:
        assert r.num(TRACES) == 29 and r.num(EXECUTIONS) == 30
        (problem,) = r.incomplete
        assert (problem.file, problem.offset) == (str(path), at)
        damaged = next(p.index for p in r._processes if p.file_set.prefix == sets[1].prefix)
        assert [r.incomplete_events(i) == [] for i in range(3)] == [i != damaged for i in range(3)]
        procs = r.processes_of(TRACES).tolist()
        assert [procs.count(i) for i in range(3)] == [9 if i == damaged else 10 for i in range(3)]
        for i in range(r.num(TRACES)):
            trace = r.trace(i)
            assert not trace.problems and trace.process == procs[i]
            assert trace.sequence == int(r.index(TRACES)["sequence"][i])


def test_a_damaged_header_under_a_sidecar_is_read_as_the_scan_reads_it(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=20, bad=(3,))
    (fs,) = files.discover(tmp_path)
    path = fs.path(files.EXECUTION)
    at = offsets_of(path)[9]
    flip(path, at + 2)  # the length field: the framing after it is unknown
    with nanscope.open_dump(tmp_path) as r:
        assert r.incomplete and r.incomplete[0].offset == at
        assert all(p.file == str(path) for p in r.incomplete)
        assert r.num_executions() < 20
        for i in range(r.num_executions()):
            assert r.execution(i).problems == ()


def test_verify_tiled_finds_exactly_the_damaged_records() -> None:
    rng = np.random.default_rng(7)
    payloads = [rng.bytes(int(n)) for n in rng.integers(0, 300, 500)]
    body = b"".join(records.frame(p) for p in payloads)
    lengths = np.array([len(p) for p in payloads], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths + records.OVERHEAD)[:-1]]).astype(np.int64)

    def check(data: bytes) -> np.ndarray | None:
        buf = np.zeros(_fastscan.BEFORE + len(data) + _fastscan.AFTER, dtype=np.uint8)
        buf[_fastscan.BEFORE : _fastscan.BEFORE + len(data)] = np.frombuffer(data, np.uint8)
        return _fastscan.verify_tiled(buf, starts, lengths)

    found = check(body)
    assert found is not None and found.tolist() == []
    for trial in range(200):
        data = bytearray(body)
        hit = sorted(set(rng.integers(0, len(payloads), int(rng.integers(1, 4))).tolist()))
        hit = [i for i in hit if lengths[i]]
        for i in hit:  # a payload byte or a footer byte
            span = int(lengths[i]) + 4
            data[int(starts[i]) + records.HEADER_SIZE + int(rng.integers(0, span))] ^= 1 << int(
                rng.integers(0, 8)
            )
        found = check(bytes(data))
        assert found is not None and found.tolist() == hit, trial
    data = bytearray(body)
    data[int(starts[5]) + 8] ^= 1  # a length's CRC: the framing is not what it says
    assert check(bytes(data)) is None


def test_zeros_crc_is_the_crc_of_zeros() -> None:
    import google_crc32c

    for n in (0, 1, 3, 16, 255, 4096, 123_457):
        assert _fastscan.zeros_crc(n) == google_crc32c.value(bytes(n))


# -- 1b. decoding never raises for a damaged record ------------------------------------------------


@pytest.mark.parametrize(("kind", "suffix"), KINDS)
def test_a_record_damaged_after_indexing_decodes_as_a_problem(
    tmp_path: Path, kind: str, suffix: str
) -> None:
    write_small_dump(tmp_path, n=10, bad=(3,))
    (fs,) = files.discover(tmp_path)
    path = fs.path(suffix)
    at = offsets_of(path)[4]
    with nanscope.open_dump(tmp_path) as r:
        assert r.problems == []
        flip(path, at + records.HEADER_SIZE + 5)  # in place: the handle reads it
        event = r.execution(4) if kind == EXECUTIONS else r.trace(4)
        assert event.index == 4 and event.step == 4 and event.sequence == 5
        assert not event.recorded and event.health.any_nonfinite is None
        (why,) = event.problems
        assert f"byte offset {at}" in why and "bad payload CRC" in why
        (problem,) = r.problems
        assert problem.incomplete and (problem.file, problem.offset) == (str(path), at)
        # The lists too, and every other event as it was.
        events = r.executions() if kind == EXECUTIONS else r.traces()
        assert [bool(e.problems) for e in events] == [i == 4 for i in range(10)]
        assert r.tensor_debug_mode is not None
        analyze(r)  # the report goes on


def test_an_undecodable_record_under_a_sidecar_decodes_as_a_problem(tmp_path: Path) -> None:
    """A record with a sound CRC that holds no DebugEvent, which a sidecar row points at."""
    write_small_dump(tmp_path, n=6, bad=())
    (fs,) = files.discover(tmp_path)
    path = fs.path(files.EXECUTION)
    data = path.read_bytes()
    starts = offsets_of(path)
    length = starts[3] - starts[2]
    junk = records.frame(b"\xff" * (length - records.OVERHEAD))  # same length: rows still tile
    path.write_bytes(data[: starts[2]] + junk + data[starts[3] :])
    with nanscope.open_dump(tmp_path) as r:
        assert r.num_executions() == 6  # the sidecar's row is kept: its CRC is sound
        event = r.execution(2)
        assert event.problems and "not a DebugEvent" in event.problems[0]
        assert [p.offset for p in r.incomplete] == [starts[2]]


# -- 2. which problems say that a history is incomplete --------------------------------------------


def test_problems_say_which_event_histories_are_incomplete(tmp_path: Path) -> None:
    cases = {}
    for name in ("traces", "both", "frames", "torn", "version"):
        write_small_dump(tmp_path / name, n=4, bad=())
        (cases[name],) = files.discover(tmp_path / name)
    cases["traces"].path(files.GRAPH_EXECUTION_TRACES).unlink()
    cases["both"].path(files.GRAPH_EXECUTION_TRACES).unlink()
    cases["both"].path(files.EXECUTION).unlink()
    cases["frames"].path(files.STACK_FRAMES).unlink()
    torn = cases["torn"].path(files.EXECUTION)
    Path(str(torn) + files.INDEX_SUFFIX).unlink()
    torn.write_bytes(torn.read_bytes()[:-5])
    ev = pb.DebugEvent(wall_time=1.0)
    ev.debug_metadata.file_version = "debug.Event:2"
    cases["version"].path(files.METADATA).write_bytes(records.frame(ev.SerializeToString()))

    def only(name: str) -> Problem:
        with nanscope.open_dump(tmp_path / name) as r:
            (problem,) = r.problems
            assert r.incomplete == ([problem] if problem.incomplete else [])
            return problem

    p = only("traces")
    assert p.incomplete and p.file == str(cases["traces"].path(files.GRAPH_EXECUTION_TRACES))
    p = only("both")
    assert p.incomplete and p.file == str(cases["both"].prefix)
    with nanscope.open_dump(tmp_path / "both") as r:
        assert r.incomplete_events(0, EXECUTIONS) == r.incomplete_events(0, TRACES) == [p]
    assert not only("frames").incomplete
    p = only("torn")
    end = records.scan(torn.read_bytes(), str(torn)).end  # where the torn record starts
    assert p.incomplete and p.file == str(torn) and p.offset == end
    assert not only("version").incomplete
    assert p.to_json() == {"severity": "warning", "message": p.message, "incomplete": True,
                           "file": str(torn), "offset": p.offset}  # fmt: skip


def test_an_unreadable_event_file_is_incomplete_an_unreadable_frames_file_is_not(
    tmp_path: Path,
) -> None:
    for suffix, incomplete in ((files.EXECUTION, True), (files.STACK_FRAMES, False)):
        root = tmp_path / suffix
        write_small_dump(root, n=3, bad=())
        (fs,) = files.discover(root)
        path = fs.path(suffix)
        path.unlink()
        path.mkdir()  # a directory where a file should be
        with nanscope.open_dump(root) as r:
            said = [p for p in r.problems if "not a regular file" in p.message]
            assert said and all(p.file == str(path) for p in said)
            assert bool(r.incomplete) is incomplete


def test_a_sidecar_that_disagrees_loses_no_event(tmp_path: Path) -> None:
    dump, other = tmp_path / "dump", tmp_path / "other"
    write_small_dump(dump, n=20, bad=(11,))
    (fs,) = files.discover(dump)
    write_small_dump(other, n=5, bad=())
    (ofs,) = files.discover(other)
    shutil.copy(str(ofs.path(files.EXECUTION)) + ".nsidx", str(fs.path(files.EXECUTION)) + ".nsidx")
    with nanscope.open_dump(dump) as r:
        assert r.num_executions() == 20 and r.problems == [] and r.incomplete == []


def test_a_torn_tail_that_the_writer_finishes_is_no_longer_a_problem(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=5, bad=())
    (fs,) = files.discover(tmp_path)
    path = fs.path(files.EXECUTION)
    Path(str(path) + files.INDEX_SUFFIX).unlink()
    data = path.read_bytes()
    path.write_bytes(data[:-9])  # the writer is still writing its last record
    _eventfile.EventFile.write_sidecar = False
    try:
        with nanscope.open_dump(tmp_path) as r:
            assert r.num_executions() == 4
            (problem,) = r.incomplete
            assert "incomplete record" in problem.message
            with open(path, "ab") as fh:
                fh.write(data[-9:])
            r.update()
            assert r.num_executions() == 5 and r.incomplete == [] and r.problems == []
    finally:
        _eventfile.EventFile.write_sidecar = True


# -- 3. many processes within the descriptor limit -------------------------------------------------


def copy_sets(template: Path, root: Path, count: int) -> None:
    """``count`` file sets under ``root``, each a copy of ``template``'s one set."""
    (fs,) = files.discover(template)
    root.mkdir(parents=True)
    names = [p.name[len(fs.prefix.name) :] for p in template.iterdir()]
    for k in range(count):
        prefix = files.file_set_prefix(root, 1_700_000_000, f"host{k:04d}")
        for tail in names:
            shutil.copy(str(fs.prefix) + tail, str(prefix) + tail)


CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    soft, hard, taken = (int(a) for a in sys.argv[2:5])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(taken)]  # the program's own
    import nanscope
    out = {}
    with nanscope.open_dump(sys.argv[1]) as r:
        out["processes"] = len(r.processes)
        out["events"] = [r.num_executions(), r.num_graph_execution_traces()]
        lost = 0
        for i in range(r.num_executions()):
            lost += bool(r.execution(i).problems)
        for i in range(r.num_graph_execution_traces() - 1, -1, -1):
            lost += bool(r.trace(i).problems)
        out["lost"] = lost
        out["per_process"] = len(set(r.processes_of("execution").tolist()))
        r.update()
        out["problems"] = [p.message for p in r.problems]
        out["open"] = len(os.listdir("/proc/self/fd")) - taken  # all but the program's
    out["limit"] = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(json.dumps(out))
    """
)


def read_in_a_child(dump: Path, soft: int, hard: int, taken: int = 0) -> dict[str, Any]:
    """Read every event of ``dump`` in a child process whose descriptor limit is
    ``(soft, hard)`` and which holds ``taken`` descriptors of its own."""
    env = {**os.environ, "PYTHONPATH": str(Path(nanscope.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(dump), str(soft), str(hard), str(taken)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc"
)


@needs_proc
def test_300_processes_are_read_under_a_descriptor_limit_of_256(tmp_path: Path) -> None:
    write_small_dump(tmp_path / "one", n=3, bad=(1,))
    copy_sets(tmp_path / "one", tmp_path / "many", 300)
    out = read_in_a_child(tmp_path / "many", 256, 256)
    assert out["processes"] == 300 and out["events"] == [900, 900]
    assert out["problems"] == [] and out["lost"] == 0
    assert out["per_process"] == 300
    assert out["open"] <= 128 + 16 and out["limit"] == [256, 256]


@needs_proc
def test_the_soft_limit_is_raised_to_the_hard_one_when_more_handles_are_wanted(
    tmp_path: Path,
) -> None:
    write_small_dump(tmp_path / "one", n=2, bad=(1,))
    copy_sets(tmp_path / "one", tmp_path / "many", 40)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"a hard descriptor limit of {hard}")
    out = read_in_a_child(tmp_path / "many", 64, 1024)
    assert out["problems"] == [] and out["lost"] == 0 and out["events"] == [80, 80]
    assert out["limit"] == [1024, 1024]
    assert out["open"] >= 80  # every event file stays open: none was closed and reopened


@needs_proc
def test_a_program_holding_most_descriptors_leaves_the_reader_enough(tmp_path: Path) -> None:
    """The cache's share (half the limit) is more than what is left: an open that finds no
    descriptor makes the cache give some back, and the reader goes on."""
    write_small_dump(tmp_path / "one", n=2, bad=(1,))
    copy_sets(tmp_path / "one", tmp_path / "many", 30)
    out = read_in_a_child(tmp_path / "many", 64, 64, taken=40)
    assert out["problems"] == [] and out["lost"] == 0 and out["events"] == [60, 60]


@pytest.fixture
def few_handles(monkeypatch: pytest.MonkeyPatch) -> int:
    """A cache of 4 handles (so that a dump of a few processes makes it close some)."""
    monkeypatch.setattr(_handles, "MIN_HANDLES", 0)
    monkeypatch.setattr(_handles, "_capacity", lambda want: 4)
    return 4


def test_a_closed_handle_reopens_its_file_and_a_replaced_file_is_reported(
    tmp_path: Path, few_handles: int
) -> None:
    write_small_dump(tmp_path / "one", n=3, bad=(1,))
    copy_sets(tmp_path / "one", tmp_path / "many", 6)
    with nanscope.open_dump(tmp_path / "many") as r:
        assert r.problems == [] and r.num_executions() == 18
        assert _handles.open_count() <= few_handles
        ops = [r.execution(i).op_type for i in range(18)]  # reopened as needed
        assert ops == ["op0", "op1", "op2"] * 6
        assert _handles.open_count() <= few_handles
        # Process 0's file was closed by the cache (others were read since); replace it.
        assert not r._processes[0].executions._handle.is_open
        path = r._processes[0].executions.path
        tmp = path.with_name(path.name + ".new")
        shutil.copy(path, tmp)
        os.replace(tmp, path)
        event = r.execution(0)  # not the new file's bytes: its old records are gone
        assert not event.recorded and "replaced" in event.problems[0]
        (stale,) = r.problems
        assert stale.severity == "warning" and not stale.incomplete and stale.file == str(path)
        r.update()  # the new file is indexed: the warning is void
        assert r.problems == [] and r.execution(0).op_type == "op0"
        assert not r.execution(0).problems


def test_a_circular_file_replaced_while_its_handle_is_open_still_yields_its_records(
    tmp_path: Path,
) -> None:
    write_small_dump(tmp_path, n=3, bad=(1,))
    (fs,) = files.discover(tmp_path)
    path = fs.path(files.EXECUTION)
    with nanscope.open_dump(tmp_path) as r:
        first = r.execution(2)
        path.unlink()  # a circular buffer's rewrite: a new file under the old name
        path.write_bytes(records.frame(pb.DebugEvent(wall_time=1.0).SerializeToString()))
        again = r.execution(2)
        assert again.op_type == first.op_type == "op2" and not again.problems
