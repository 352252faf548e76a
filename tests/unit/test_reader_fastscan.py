"""The bulk index of dumps without a sidecar (``reader/_fastscan.py``) against decoding every record.

A dump that TensorFlow wrote has no sidecar: its index is built from the
records. The fast path must build exactly the index that decoding each record
with protobuf builds (the same rows, the same strings, the same problems in
the same order), on TensorFlow's golden dumps, on a dump TensorFlow writes here,
and on damaged dumps, where it leaves what it cannot vouch for to the careful path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import HEADER_SIZE, frame
from nanscope.reader import EXECUTIONS, TRACES, DumpReader, _eventfile, _fastscan
from nanscope.reader._eventfile import EventFile

from ..helpers import TF_DUMP_NAMES, extract_tf_dumps


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_tf_dumps(tmp_path_factory.mktemp("tf_dumps"))


def read_index(dump: Path, fast: bool) -> dict[str, Any]:
    """Everything the index holds, strings resolved, and what was said about the dump."""
    old = EventFile.fast
    EventFile.fast = fast
    EventFile.write_sidecar = False  # both read the records (sidecars: tested below)
    try:
        with DumpReader(dump) as r:
            out: dict[str, Any] = {"problems": [(p.severity, p.message) for p in r.problems]}
            for kind in (EXECUTIONS, TRACES):
                idx = r.index(kind).copy()
                out[kind] = idx.tobytes()
                out[kind + " names"] = [r.string(int(s)) for s in idx["name"]]
                out[kind + " graphs"] = [r.string(int(s)) for s in idx["graph"]]
                out[kind + " ids"] = (idx["name"].tolist(), idx["graph"].tolist())
            out["decoded"] = r.decoded_for_index()
            out["fast"] = sum(
                p.traces.fast_decoded + p.executions.fast_decoded for p in r._processes
            )
            return out
    finally:
        EventFile.fast = old
        EventFile.write_sidecar = True


def assert_same_index(dump: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    fast, careful = read_index(dump, True), read_index(dump, False)
    assert careful["fast"] == 0
    for key in careful:
        if key != "fast":
            assert fast[key] == careful[key], key
    return fast, careful


@pytest.mark.parametrize("name", TF_DUMP_NAMES)
def test_golden_tf_dumps_fast_equals_careful(golden: Path, name: str) -> None:
    fast, careful = assert_same_index(golden / name)
    # TensorFlow's circular buffer let go of the first traces: said once; nothing else is.
    said = [m for _, m in careful["problems"]]
    if name.endswith("_circular"):
        assert len(said) == 1 and "circular buffer" in said[0], said
    else:
        assert said == []
    # Every record of TensorFlow's layout was read in bulk.
    assert fast["fast"] == fast["decoded"] > 0


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Chunks of a few records: records straddle chunk ends; strings are met chunk by chunk."""
    monkeypatch.setattr(_eventfile, "CHUNK", 700)
    yield


def test_golden_in_small_chunks(golden: Path, small_chunks: None) -> None:
    for name in ("FULL_HEALTH", "FULL_TENSOR", "CURT_HEALTH"):
        fast, _ = assert_same_index(golden / name)
        assert fast["fast"] > 0


@pytest.fixture(params=["probe 4096", "probe 6"])
def probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The framing walk's period guess after 6 records: exercised on small dumps too."""
    monkeypatch.setattr(_fastscan, "_PROBE", int(request.param.split()[1]))


def test_period_guess_on_golden(golden: Path, probe: None) -> None:
    for name in TF_DUMP_NAMES:
        fast, _ = assert_same_index(golden / name)
        assert fast["fast"] == fast["decoded"] > 0


def test_period_guess_is_checked() -> None:
    """Lengths that repeat, then do not: every record found where the loop finds it."""
    from nanscope.format.records import scan

    payloads = [bytes(n) for n in [5, 9, 5, 9, 5, 9, 5, 9, 5, 9, 5, 7, 5, 9, 5, 9, 5, 9, 5]]
    blob = b"".join(frame(p) for p in payloads) + frame(bytes(40))[:30]
    for probe_size in (2, 4, 6, 4096):
        _fastscan._PROBE = probe_size
        try:
            framed = _fastscan.frame(blob)
        finally:
            _fastscan._PROBE = 4096
        assert framed is not None
        result = scan(blob, "x")
        assert [r.offset + HEADER_SIZE for r in result.records] == framed.starts.tolist()
        assert (framed.end, framed.torn) == (result.end, result.torn)


# -- damaged dumps ---------------------------------------------------------------------


def copy_dump(golden: Path, tmp_path: Path, name: str = "FULL_HEALTH") -> tuple[Path, Path]:
    dump = tmp_path / name
    shutil.copytree(golden / name, dump)
    (traces,) = dump.glob("*.graph_execution_traces")
    return dump, traces


def record_starts(data: bytes) -> list[int]:
    starts, pos = [], 0
    while pos + HEADER_SIZE <= len(data):
        starts.append(pos)
        pos += 16 + int.from_bytes(data[pos : pos + 8], "little")
    return starts


def test_torn_tail(golden: Path, tmp_path: Path, probe: None) -> None:
    _dump, traces = copy_dump(golden, tmp_path)
    data = traces.read_bytes()
    starts = record_starts(data)
    traces.write_bytes(data[: starts[-3] + 20])  # the writer stopped inside a record
    fast, _ = assert_same_index(_dump)
    assert fast["fast"] > 0


@pytest.mark.parametrize("where", ["payload", "length", "footer"])
def test_flipped_byte(golden: Path, tmp_path: Path, where: str, probe: None) -> None:
    dump, traces = copy_dump(golden, tmp_path)
    data = bytearray(traces.read_bytes())
    at = record_starts(bytes(data))[10]
    data[at + {"payload": 30, "length": 1, "footer": -1}[where]] ^= 0x40
    if where == "footer":
        data[record_starts(bytes(data))[11] - 1] ^= 0x40
    traces.write_bytes(bytes(data))
    fast, _ = assert_same_index(dump)
    assert any("corrupt record" in m for _, m in fast["problems"]), fast["problems"]


def replace_record(path: Path, index: int, payload: bytes) -> int:
    """Replace record ``index`` of ``path`` by a well-framed record of ``payload``; its offset."""
    data = path.read_bytes()
    starts = record_starts(data)
    at = starts[index]
    path.write_bytes(data[:at] + frame(payload) + data[starts[index + 1] :])
    return at


def test_records_the_fast_path_does_not_vouch_for(
    golden: Path, tmp_path: Path, probe: None
) -> None:
    """Well-framed records in other layouts: decoded one by one, in their place."""
    dump, traces = copy_dump(golden, tmp_path)
    data = traces.read_bytes()
    starts = record_starts(data)

    def event(i: int) -> pb.DebugEvent:
        e = pb.DebugEvent()
        a = starts[i] + HEADER_SIZE
        e.ParseFromString(data[a : a + int.from_bytes(data[starts[i] : starts[i] + 8], "little")])
        return e

    # Fields out of order: the trace first, then step and wall time.
    e = event(3)
    e.step = 7
    trace = pb.DebugEvent(graph_execution_trace=e.graph_execution_trace).SerializeToString()
    tail = pb.DebugEvent(wall_time=e.wall_time, step=e.step).SerializeToString()
    replace_record(traces, 3, trace + tail)
    # Not a DebugEvent at all (a good CRC on garbage).
    replace_record(traces, 5, b"\xff\xff\xff\xff garbage")
    # Another kind of event in the traces file.
    replace_record(traces, 6, pb.DebugEvent(graph_id="g").SerializeToString())
    # A summary that holds no counts (a damaged output: the row is kept, a problem said).
    e = event(8)
    e.graph_execution_trace.tensor_proto.dtype = 7  # type: ignore[assignment]  # DT_STRING
    replace_record(traces, 8, e.SerializeToString())
    # A step that is negative (a ten-byte varint).
    e = event(9)
    e.step = -5
    replace_record(traces, 9, e.SerializeToString())
    fast, careful = assert_same_index(dump)
    messages = [m for _, m in careful["problems"]]
    assert any("not a DebugEvent" in m for m in messages), messages
    assert any("not shown" in m for m in messages), messages
    assert fast["fast"] > 0
    assert fast["fast"] < fast["decoded"]  # some records went the careful way


def test_damaged_repeated_summary(golden: Path, tmp_path: Path) -> None:
    """One damaged summary shared by many records: a problem for each record, in order."""
    dump, traces = copy_dump(golden, tmp_path)
    data = traces.read_bytes()
    starts = record_starts(data)
    a = starts[4] + HEADER_SIZE
    e = pb.DebugEvent()
    e.ParseFromString(data[a : a + int.from_bytes(data[starts[4] : starts[4] + 8], "little")])
    e.graph_execution_trace.tensor_proto.tensor_content = b"\x00\x01\x02"  # not whole float64s
    for i, t in ((4, 1.0), (12, 2.0), (20, 3.0)):
        e.wall_time = t
        replace_record(traces, i, e.SerializeToString())
    fast, careful = assert_same_index(dump)
    assert len(careful["problems"]) >= 3
    assert fast["fast"] == fast["decoded"]  # the damage was found in bulk, not by the careful path


# -- a dump TensorFlow writes here -----------------------------------------------------


@pytest.mark.tf
@pytest.mark.parametrize("mode", ["CURT_HEALTH", "FULL_HEALTH", "FULL_TENSOR"])
def test_live_tensorflow_dump(tmp_path: Path, mode: str) -> None:
    tf = pytest.importorskip("tensorflow")
    dump = tmp_path / mode
    writer = tf.debugging.experimental.enable_dump_debug_info(
        str(dump), tensor_debug_mode=mode, circular_buffer_size=-1
    )
    try:

        @tf.function  # type: ignore[untyped-decorator]
        def step(x: Any) -> Any:
            h = tf.math.log(x)
            for _ in range(3):
                h = tf.nn.relu(tf.matmul(h, tf.ones((4, 4))) - 1.0)
            return tf.reduce_sum(h)

        x = np.ones((2, 4), dtype=np.float32)
        for i in range(6):
            step(x * 0 if i == 4 else x)
            tf.math.log(tf.constant(x) - (1.0 if i == 5 else 0.0))  # eager: -inf at i == 5
        writer.FlushExecutionFiles()
        writer.FlushNonExecutionFiles()
    finally:
        tf.debugging.experimental.disable_dump_debug_info()
    assert not list(dump.glob("*.nsidx"))
    fast, careful = assert_same_index(dump)
    assert fast["fast"] == fast["decoded"] > 0
    assert careful["problems"] == []


# -- the sidecar left next to a dump without one ---------------------------------------


def digests(dump: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in dump.iterdir()}


def settle(dump: Path) -> None:
    """Files as a finished run leaves them: not modified for a while."""
    for p in dump.iterdir():
        os.utime(p, (p.stat().st_atime - 60, p.stat().st_mtime - 60))


def open_with_sidecars(dump: Path) -> dict[str, Any]:
    with DumpReader(dump) as r:
        return {
            "decoded": r.decoded_for_index(),
            "problems": [(p.severity, p.message) for p in r.problems],
            **{
                kind: (
                    r.index(kind).tobytes(),
                    [r.string(int(s)) for s in r.index(kind)["name"]],
                    [r.string(int(s)) for s in r.index(kind)["graph"]],
                )
                for kind in (EXECUTIONS, TRACES)
            },
        }


@pytest.mark.parametrize("name", ["FULL_HEALTH", "CURT_HEALTH", "FULL_TENSOR", "NO_TENSOR"])
def test_sidecar_written_on_first_read(golden: Path, tmp_path: Path, name: str) -> None:
    dump = tmp_path / name
    shutil.copytree(golden / name, dump)
    settle(dump)
    before = digests(dump)
    careful = read_index(dump, False)
    first = open_with_sidecars(dump)
    after = digests(dump)
    written = sorted(set(after) - set(before))
    assert written == sorted(
        p.name + ".nsidx"
        for p in dump.iterdir()
        if p.suffix in (".execution", ".graph_execution_traces") and p.stat().st_size
    )
    assert {k: after[k] for k in before} == before  # TensorFlow's files untouched
    assert not [p for p in dump.iterdir() if p.name.endswith(".tmp")]
    second = open_with_sidecars(dump)
    assert first["decoded"] > 0 and second["decoded"] == 0  # the second open read no record
    for result in (first, second):
        assert result["problems"] == careful["problems"] == []
        for kind in (EXECUTIONS, TRACES):
            assert result[kind][0] == careful[kind], kind
            assert result[kind][1:] == (careful[kind + " names"], careful[kind + " graphs"])
    assert digests(dump) == after  # the second open wrote nothing


def test_no_sidecar_for_damaged_or_fresh_files(golden: Path, tmp_path: Path) -> None:
    dump, traces = copy_dump(golden, tmp_path)
    data = bytearray(traces.read_bytes())
    data[record_starts(bytes(data))[5] + 30] ^= 0x01
    traces.write_bytes(bytes(data))
    settle(dump)
    open_with_sidecars(dump)
    # The damaged file: no sidecar (it could not repeat the problem); the sound one: one.
    assert not Path(str(traces) + ".nsidx").exists()
    (execution,) = dump.glob("*.execution")
    assert Path(str(execution) + ".nsidx").exists()
    # A file just written (a writer may still be appending): no sidecar.
    fresh, _ = copy_dump(golden, tmp_path / "fresh")
    for p in fresh.iterdir():
        os.utime(p)  # modified just now
    open_with_sidecars(fresh)
    assert not list(fresh.glob("*.nsidx"))


def test_existing_sidecar_is_never_replaced(golden: Path, tmp_path: Path) -> None:
    dump, traces = copy_dump(golden, tmp_path)
    junk = Path(str(traces) + ".nsidx")
    junk.write_bytes(b"not a sidecar")
    settle(dump)
    result = open_with_sidecars(dump)
    assert junk.read_bytes() == b"not a sidecar"  # ignored as damaged, left as it was
    assert result["decoded"] > 0
