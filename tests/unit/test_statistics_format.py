"""The statistics' representation: the hash, the accumulation by parts, the on-disk field.

Oracles: splitmix64's published first output, numpy's mean/std/norm over the
whole array, and the field read back by protobuf's own parser.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.statistics import (
    HASH_BITS,
    STATISTICS_WIDTH,
    Accumulator,
    Statistics,
    bits_hash,
    from_slots,
    per_output,
    splitmix64,
    statistics_of,
)
from tests.helpers import iter_payloads


def test_splitmix64_is_the_published_generator() -> None:
    # The first outputs of splitmix64 seeded with 0 (Vigna's reference implementation).
    state = np.array([1, 2, 3], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    want = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    got = splitmix64(state - np.uint64(0x9E3779B97F4A7C15))
    assert [int(x) for x in got] == want


def test_the_hash_ignores_order_and_sees_every_bit() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1000).astype(np.float32)
    assert bits_hash(a) == bits_hash(rng.permutation(a)) == bits_hash(a.reshape(10, 100).T)
    b = a.copy()
    b[17] = np.nextafter(b[17], np.float32(np.inf))  # one ulp
    assert bits_hash(b) != bits_hash(a)
    assert bits_hash(np.array([0.0], np.float32)) != bits_hash(np.array([-0.0], np.float32))
    assert 0 <= bits_hash(a) < 2**HASH_BITS
    assert bits_hash(np.zeros(0, np.float32)) == 0


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_accumulated_by_parts_equals_the_whole(dtype: type, offset: float) -> None:
    rng = np.random.default_rng(1)
    a: np.ndarray = (rng.standard_normal(700_001) + offset).astype(dtype)
    a[[3, 70, 500_000]] = [np.nan, np.inf, -np.inf]
    acc = Accumulator()
    for lo in (0, 1000, 300_000):  # uneven parts
        hi = {0: 1000, 1000: 300_000, 300_000: a.size}[lo]
        acc.add(a[lo:hi])
    mean, std, l2, h = acc.result()
    finite = a[np.isfinite(a)].astype(np.float64)
    assert h == bits_hash(a)
    assert mean == pytest.approx(finite.mean(), rel=1e-12, abs=1e-12)
    assert std == pytest.approx(finite.std(), rel=1e-9)
    assert l2 == pytest.approx(np.linalg.norm(finite), rel=1e-12)


def test_repeats_count_each_element_that_many_times() -> None:
    a = np.array([1.0, 2.0, np.nan, 7.5], np.float32)
    acc = Accumulator()
    acc.add(a)
    got = Statistics(*acc.result(repeats=6)[:3], int(acc.result(repeats=6)[3]))
    want = statistics_of(np.tile(a, 6))
    assert got.hash == want.hash
    assert got.mean == pytest.approx(want.mean)
    assert got.std == pytest.approx(want.std)
    assert got.l2 == pytest.approx(want.l2)


def test_no_finite_element_gives_nan_and_still_a_hash() -> None:
    a = np.array([np.nan, np.inf], np.float32)
    acc = Accumulator()
    acc.add(a)
    mean, std, l2, h = acc.result()
    assert math.isnan(mean) and math.isnan(std) and math.isnan(l2)
    assert h == bits_hash(a)
    st = from_slots([mean, std, l2, h])
    assert st is not None and st.hash == bits_hash(a)
    assert from_slots([math.nan] * 4) is None


def test_per_output_and_json() -> None:
    slots = [1.5, 0.5, 3.0, 12.0, *[math.nan] * 4, 0.0, 0.0, 0.0, float(2**53)]
    first, second, third = per_output(slots)
    assert first == Statistics(1.5, 0.5, 3.0, 12)
    assert second is None
    assert third is not None and third.hash is None  # beyond 52 bits: not a hash
    assert first.to_json() == {"mean": 1.5, "std": 0.5, "l2": 3.0, "hash": "000000000000c"}


def _summary(stats: Statistics | None) -> np.ndarray:
    head = [-1, -1, 1, 1, 4, 0, 0, 0, 1, 1, 2, 3.0, 0.5]
    tail = [math.nan] * 4 if stats is None else [stats.mean, stats.std, stats.l2, stats.hash]
    return np.array(head + tail, dtype=np.float64)


def test_the_writer_puts_them_in_their_field_and_the_reader_reads_them(tmp_path: Path) -> None:
    values = np.array([-1.0, 0.0, 2.0, 3.0], np.float32)
    want = statistics_of(values)
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1)
    w.write_execution(ExecutionEvent("two", [1, 2], [], summaries=[_summary(want), None]))
    w.write_execution(ExecutionEvent("plain", [3], [], summaries=[_summary(None)[:13]]))
    w.write_execution(ExecutionEvent("inputs", [4], [1], summaries=[_summary(want)],
                                     input_summaries=[_summary(want)]))  # fmt: skip
    w.close()
    (path,) = tmp_path.rglob("*.execution")
    records = [
        pb.DebugEvent.FromString(b).execution for b in iter_payloads(path.read_bytes(), str(path))
    ]
    two, plain, inputs = records
    assert list(two.output_statistics[:4]) == [want.mean, want.std, want.l2, float(want.hash or 0)]
    assert all(math.isnan(x) for x in two.output_statistics[4:]) and len(two.output_statistics) == 8
    assert len(plain.output_statistics) == 0
    # On disk a summary keeps tfdbg2's eleven slots, inputs' too.
    protos = (*two.tensor_protos[:1], *inputs.input_tensor_protos)
    assert all(p.tensor_shape.dim[0].size == 11 and len(p.tensor_content) == 88 for p in protos)
    a, b, c = nanscope.open_dump(tmp_path).executions()
    assert a.output_statistics == (want, None)
    assert b.output_statistics == ()
    assert c.output_statistics == (want,)


def test_a_summary_with_statistics_is_statistics_width_wide() -> None:
    assert len(_summary(None)) == STATISTICS_WIDTH


def test_graph_traces_carry_them_too(tmp_path: Path) -> None:
    """A compiled graph's rows with statistics: eleven slots in the trace's summary, the
    four statistics in its field (the rows without any: no field)."""
    from nanscope.events import Graph, GraphOp

    want = statistics_of(np.array([1.0, -2.0, 4.0], np.float32))
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1)
    w.write_graph(Graph("g1", "f", instrumented_ops=("a", "b")))
    for name in ("a", "b"):
        w.write_graph_op(GraphOp("g1", "Mul", name, "f"))
    rows = np.stack([_summary(want), _summary(None)])
    rows[:, 11:13] = np.nan  # a graph computes no ranges
    w.write_traces("g1", ["a", "b"], [0, 0], rows)
    w.close()
    a, b = nanscope.open_dump(tmp_path).traces()
    assert a.output_statistics == (want,)
    assert b.output_statistics == ()
    assert a.debug_tensor_value is not None and len(a.debug_tensor_value) == 11
    np.testing.assert_array_equal(a.debug_tensor_value, rows[0, :11])
