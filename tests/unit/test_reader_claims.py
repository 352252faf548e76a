"""Records that claim more than they hold: refused before any allocation, reported, read around.

Each dump here is well framed (valid CRCs, valid protobuf): only the numbers lie. The reader
must report the claim with its file and byte offset, read the output as unknown, and go on;
the analysis and every API route must answer in little memory, in strict JSON, with a 4xx
where a route cannot serve what was asked.
"""

from __future__ import annotations

import json
import math
import re
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope.analysis import analyze
from nanscope.format import health
from nanscope.format.modes import MAX_COUNT, TensorDebugMode, shape_from_summary
from nanscope.format.tensors import MAX_FILL_ELEMENTS, MAX_RANK, DataType, proto_to_array
from nanscope.reader import EXECUTIONS, TRACES, DumpReader
from nanscope.reader._decode import MAX_SUMMARY_ELEMENTS
from nanscope.report import report_json
from nanscope.server.api import ROUTES
from nanscope.server.query import ApiError, Query
from nanscope.server.runs import RunSet
from tests.crafted import BIG, big_full_tensor_dump, big_summary_dump, proto, summary, write_dump
from tests.helpers import summaries_of

FH = [-1, -1, 1, 1, 10, 2, 0, 0, 1, 3, 4]  # FULL_HEALTH: 10 elements, two -inf
M = TensorDebugMode
GOOD = {M.FULL_HEALTH: FH, M.CONCISE_HEALTH: [-1, 10, 2, 0, 0],
        M.SHAPE: [-1, 1, 2, 10, 2, 5, 0, 0, 0, 0]}  # fmt: skip

# -- format: the decoders refuse before allocating -----------------------------------------------


@pytest.fixture
def peak() -> Iterator[Callable[[], int]]:
    """The peak of traced allocations (numpy's included) since the test started, in bytes."""
    tracemalloc.start()
    try:
        yield lambda: tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("claim", "says"),
    [
        (proto(DataType.DT_DOUBLE, BIG, double_val=[1.0]), "claims 144,000,000 elements"),
        (proto(DataType.DT_FLOAT, BIG), "the record holds 0 values"),
        (proto(DataType.DT_STRING, BIG, string_val=[b"x"]), "the record holds 1 value"),
        (proto(DataType.DT_FLOAT, BIG, content=b"\0" * 8), "needs 576,000,000"),
        (proto(DataType.DT_BFLOAT16, BIG, content=b"\0\0"), "needs 288,000,000"),
        # Dims whose int64 product wraps around to 0 (2**64) must not read as empty.
        (proto(DataType.DT_FLOAT, [2**32, 2**32]), "18,446,744,073,709,551,616 elements"),
        (proto(DataType.DT_FLOAT, [1] * (MAX_RANK + 1), float_val=[1.0]), "255 dimensions"),
    ],
)
def test_a_tensor_claiming_more_than_its_bytes_is_refused(
    claim: Any, says: str, peak: Callable[[], int]
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        proto_to_array(claim)
    assert peak() < 1 << 20


def test_the_fill_convention_fills_up_to_its_limit() -> None:
    filled = proto_to_array(proto(DataType.DT_FLOAT, [MAX_FILL_ELEMENTS], float_val=[2.0]))
    assert filled is not None and filled.shape == (MAX_FILL_ELEMENTS,) and filled[-1] == 2.0
    zeros = proto_to_array(proto(DataType.DT_DOUBLE, [4, 2]))
    assert zeros is not None and zeros.shape == (4, 2) and not zeros.any()
    with pytest.raises(ValueError, match="holds 1 value"):
        proto_to_array(proto(DataType.DT_FLOAT, [MAX_FILL_ELEMENTS + 1], float_val=[2.0]))


def test_a_summary_is_bounded_even_when_its_bytes_are_there() -> None:
    vector = summary(np.zeros(MAX_SUMMARY_ELEMENTS + 1))
    assert proto_to_array(vector) is not None  # as a value it is fine
    with pytest.raises(ValueError, match="a summary holds at most 1,024"):
        proto_to_array(vector, MAX_SUMMARY_ELEMENTS)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, 2.0**60])
@pytest.mark.parametrize(("mode", "slot"), [(M.FULL_HEALTH, 4), (M.FULL_HEALTH, 7),
                                            (M.FULL_HEALTH, 2), (M.CONCISE_HEALTH, 1),
                                            (M.SHAPE, 3)])  # fmt: skip
def test_a_summary_slot_that_is_not_a_count_makes_it_unknown(
    mode: TensorDebugMode, slot: int, bad: float
) -> None:
    vector = np.array(GOOD[mode], dtype=np.float64)
    assert health.summary_problem(mode, vector) is None and health.of_summary(mode, vector).size
    vector[slot] = bad
    assert health.of_summary(mode, vector) == health.UNKNOWN
    assert "NaN, infinite, negative or over 2**53" in (health.summary_problem(mode, vector) or "")
    if mode != M.SHAPE:
        assert health.index_row(mode, [vector]) == health.UNKNOWN_ROW


def test_index_counts_saturate_instead_of_overflowing_int64() -> None:
    vector = np.array([-1, -1, 1, 1, MAX_COUNT, MAX_COUNT, 0, 0, 0, 0, 0], dtype=np.float64)
    row = health.index_row(M.FULL_HEALTH, [vector] * 3000)
    assert row.size == row.neg_inf == 2**62 and row.nonfinite == 1


@pytest.mark.parametrize(
    ("vector", "says"),
    [
        ([-1, 1, 1e18, 10, 1, 2, 3, 4, 5, 6], "rank is 1e+18"),
        ([-1, 1, math.nan, 10, 1, 2, 3, 4, 5, 6], "rank is nan"),
        ([-1, 1, 2, 10, math.inf, 2, 0, 0, 0, 0], "not a count"),
        ([-1, 1, 2, 10, -3, 2, 0, 0, 0, 0], "not a count"),
        ([-1, 1], "at least 4 slots"),
    ],
)
def test_a_shape_summary_with_an_absurd_rank_or_dim_is_refused(
    vector: list[float], says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        shape_from_summary(np.array(vector))
    # The largest rank allowed sizes a tuple of 254 entries, not 10**18.
    assert len(shape_from_summary(np.array([-1, 1, MAX_RANK, 1, 1, 1, 1, 1, 1, 1.0]))) == MAX_RANK


# -- the reader: reported with file and offset, read as unknown ----------------------------------


def _read_all(root: Path) -> tuple[DumpReader, list[str]]:
    """Open ``root``, decode every event as the report and the GUI would; the problems."""
    reader = DumpReader(root)
    for kind, get in ((EXECUTIONS, reader.execution), (TRACES, reader.trace)):
        for i in range(reader.num(kind)):
            event = get(i)
            json.dumps([event.to_json(), event.outputs_json()], allow_nan=False)
    json.dumps(report_json(analyze(reader)), allow_nan=False)
    return reader, [p.message for p in reader.problems]


def test_the_issues_dump_is_reported_and_read_in_little_memory(
    tmp_path: Path, peak: Callable[[], int]
) -> None:
    path = big_summary_dump(tmp_path)
    reader, problems = _read_all(tmp_path)
    with reader:
        assert peak() < 16 << 20
        assert f"{path}: record at byte offset 0: output 0: a summary of shape 12000x12000 " \
               "claims 144,000,000 elements (a summary holds at most 1,024); not shown" in problems  # fmt: skip
        ex = reader.execution(0)
        assert ex.debug_tensor_values == (None,) and not ex.recorded and ex.problems
        assert reader.trace(0).debug_tensor_value is None


def test_full_tensor_values_without_their_bytes_are_reported(
    tmp_path: Path, peak: Callable[[], int]
) -> None:
    path = big_full_tensor_dump(tmp_path)
    reader, problems = _read_all(tmp_path)
    with reader:
        assert peak() < 16 << 20
        mine = [p for p in problems if p.startswith(f"{path}: record at byte offset 0: ")]
        assert [p.split(": ")[2] for p in mine] == ["output 0", "output 1"]
        assert "the record holds 1 value" in mine[0] and "holds 0 values" in mine[1]
        assert reader.execution(0).tensor_values == (None, None)


def test_malformed_summaries_are_unknown_not_a_crash(tmp_path: Path) -> None:
    nan_counts = summary([-1, -1, 1, 1, math.nan, 1, 0, math.inf, 1, 3, 6])
    write_dump(tmp_path / "h", M.FULL_HEALTH, [nan_counts, summary(FH)], trace=nan_counts)
    reader, problems = _read_all(tmp_path / "h")
    with reader:
        assert any("output 0: its FULL_HEALTH summary holds a count that is NaN" in p
                   for p in problems)  # fmt: skip
        ex = reader.execution(0)
        # The well-formed output still counts: the event keeps its -inf.
        assert ex.output_health[0] == health.UNKNOWN and ex.health.neg_inf == 2
        assert reader.first_nonfinite() is not None
    shape = summary([-1, 1, 1e18, 10, 1, 2, 3, 4, 5, 6])
    write_dump(tmp_path / "s", M.SHAPE, [shape], trace=shape)
    reader, problems = _read_all(tmp_path / "s")
    with reader:
        assert reader.execution(0).shape is None and reader.trace(0).shape is None
        assert any("a SHAPE summary's rank is 1e+18 (0..254)" in p for p in problems)


def test_numbers_a_record_states_do_not_drive_loops(tmp_path: Path) -> None:
    write_dump(tmp_path, M.NO_TENSOR, num_outputs=2**31 - 1,
               input_names=["x:" + "9" * 5000, "y:²"])  # fmt: skip
    reader, _ = _read_all(tmp_path)
    with reader:
        assert len(reader.execution(0).outputs_json()) == 4096
        op = reader.graph_op("g", "Log")
        assert op is not None and op.inputs == [("x:" + "9" * 5000, 0), ("y:²", 0)]


def test_a_non_finite_wall_time_reads_as_unknown(tmp_path: Path) -> None:
    from nanscope.format.proto import debug_event_pb2 as pb
    from nanscope.format.records import frame

    path = write_dump(tmp_path, M.FULL_HEALTH, [summary(FH)], trace=summary(FH))
    event = pb.DebugEvent.FromString(next(_payloads(path)))
    event.wall_time = math.nan
    path.write_bytes(frame(event.SerializeToString()))
    reader, _ = _read_all(tmp_path)
    with reader:
        assert reader.execution(0).wall_time == 0.0
        assert float(reader.index(EXECUTIONS)["wall_time"][0]) == 0.0


def _payloads(path: Path) -> Iterator[bytes]:
    from tests.helpers import iter_payloads

    yield from iter_payloads(path.read_bytes(), str(path))


# -- the server's routes: 4xx or an answer, in strict JSON, in little memory ---------------------


def _call(runs: RunSet, route: str, event: int | None = None, **params: str) -> dict[str, Any]:
    """Call ``route``'s handler as the server would; ``event``: the path's ``<int:index>``."""
    args = {} if event is None else {"index": event}
    result = ROUTES[route](runs, Query({"run": ".", **params}), args)
    json.dumps(result, allow_nan=False)  # what the server sends must be strict JSON
    return result


@pytest.mark.parametrize("make", [big_summary_dump, big_full_tensor_dump])
def test_api_routes_answer_crafted_dumps_with_problems_and_4xx(
    tmp_path: Path, make: Callable[[Path], Path], peak: Callable[[], int]
) -> None:
    path = make(tmp_path)
    runs = RunSet(tmp_path, refresh_interval=0.0)
    try:
        for route in ("/api/alerts", "/api/analysis", "/api/executions", "/api/traces",
                      "/api/timeline"):  # fmt: skip
            _call(runs, route)
        detail = _call(runs, "/api/executions/<int:index>", 0)
        assert detail["outputs"][0]["summary"] is None and detail["outputs"][0]["counts"] is None
        _call(runs, "/api/traces/<int:index>", 0)
        (run,) = _call(runs, "/api/runs")["runs"]
        assert any(f"{path}: record at byte offset 0" in p["message"] for p in run["problems"])
        for kind in (EXECUTIONS, TRACES):
            with pytest.raises(ApiError) as refused:
                _call(runs, "/api/tensor", kind=kind, index="0")
            assert refused.value.status == 404
            if make is big_full_tensor_dump:
                assert "cannot be read" in refused.value.message
                assert "claims 144,000,000 elements" in refused.value.message
        assert peak() < 64 << 20
    finally:
        runs.close()


def test_tensor_statistics_of_a_value_backed_by_its_bytes(tmp_path: Path) -> None:
    values = np.array([[1.0, -np.inf, 0.5], [np.nan, 3.0, 1e308]], dtype=np.float64)
    from nanscope.format.tensors import array_to_proto

    write_dump(tmp_path, M.FULL_TENSOR, [array_to_proto(values)], trace=array_to_proto(values))
    runs = RunSet(tmp_path, refresh_interval=0.0)
    try:
        got = _call(runs, "/api/tensor", kind=EXECUTIONS, index="0")
    finally:
        runs.close()
    assert got["values"][:2] == [1.0, "-inf"] and got["shape"] == [2, 3]
    stats = got["stats"]
    assert stats["finite"] == 4 and stats["min"] == 0.5 and stats["max"] == 1e308
    assert stats["mean"] == pytest.approx((1.0 + 0.5 + 3.0 + 1e308) / 4)


def test_a_source_record_rewritten_to_claim_a_huge_length_is_a_record_error(
    tmp_path: Path, peak: Callable[[], int]
) -> None:
    import struct

    from nanscope.format import files
    from nanscope.format.records import masked_crc32c
    from nanscope.reader import UNREADABLE
    from tests.helpers import write_small_dump

    write_small_dump(tmp_path, n=2)
    with DumpReader(tmp_path) as reader:
        assert reader.source_files(0) and reader.source_lines(0, 0)
        path = files.discover(tmp_path)[0].path(files.SOURCE_FILES)
        data = bytearray(path.read_bytes())
        length = struct.pack("<Q", 2**62)  # with a valid CRC: only the size is a lie
        data[0:12] = length + struct.pack("<I", masked_crc32c(length))
        path.write_bytes(bytes(data))  # the same file, changed after it was indexed
        with pytest.raises(UNREADABLE):
            reader.source_lines(0, 0)
    assert peak() < 16 << 20


def test_a_summary_of_complex_numbers_or_strings_is_refused(tmp_path: Path) -> None:
    pairs = proto(DataType.DT_COMPLEX64, [11])
    pairs.scomplex_val.extend([1.0, 0.0] * 11)
    words = proto(DataType.DT_STRING, [2], string_val=[b"a", b"b"])
    write_dump(tmp_path, M.FULL_HEALTH, [pairs, words, summary(FH)], trace=pairs)
    reader, problems = _read_all(tmp_path)
    with reader:
        assert summaries_of(reader.execution(0))[:2] == (None, None)
        assert reader.execution(0).health.neg_inf == 2  # the third output is read
    assert sum("a summary of complex64 holds no counts" in p for p in problems) == 2
    assert any("output 1: a summary of object holds no counts" in p for p in problems)


def test_a_full_tensor_view_is_read_through_its_reference_or_refused(tmp_path: Path) -> None:
    """A view's values come from the record it names; one that reads outside them is a
    problem (not shown), one whose record is not in the dump reads as not recorded."""
    from nanscope.events import DumpWriter, ExecutionEvent
    from nanscope.format.tensors import ValueView

    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = DumpWriter(tmp_path, M.FULL_TENSOR, circular_buffer_size=-1, framework="test")
    views = [
        ValueView(1, 0, 1, (4, 2), (1, 4), (8, 0, 0, 0, 0, 0, 8)),  # 4x2 elements from element 1
        ValueView(1, 0, 5, (4, 2), (1, 4), (8, 0, 0, 0, 0, 0, 8)),  # reads past the end
        ValueView(99, 0, 0, (2,), (1,), (2, 0, 0, 0, 0, 0, 2)),  # a record not in the dump
    ]
    written: list[Any] = [base, *views]
    for i, value in enumerate(written):
        w.write_execution(
            ExecutionEvent(op_type=f"op{i}", output_tensor_ids=[i + 1], summaries=[value])
        )
    w.close()
    import nanscope

    first, good, outside, missing = nanscope.open_dump(tmp_path).executions()
    assert first.tensor_values is not None and good.tensor_values is not None
    np.testing.assert_array_equal(first.tensor_values[0], base)
    flat = base.reshape(-1)
    want = [[flat[1 + i + 4 * j] for j in range(2)] for i in range(4)]
    np.testing.assert_array_equal(good.tensor_values[0], np.array(want, dtype=np.float32))
    assert outside.tensor_values == (None,) and "reads element" in outside.problems[0]
    assert missing.tensor_values == (None,) and missing.problems == ()
    # The health comes from the counts either way.
    assert [e.health.size for e in (good, outside, missing)] == [8, 8, 2]
