"""Headroom from dumps written here with nanscope's writer: the format pieces (ranges in the
record, the index's columns, the range history), and the analysis's rules checked against
numbers computed in the test."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.analysis import analyze, analyze_headroom
from nanscope.events import DumpWriter, ExecutionEvent, Phase
from nanscope.events._history import RangeHistory
from nanscope.format import headroom
from nanscope.format.files import RANGES
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.proto.types_pb2 import DataType
from nanscope.format.records import scan
from nanscope.reader import EXECUTIONS
from nanscope.report import warning_json, warning_text
from tests.helpers import iter_payloads

HALF, BF16, F32 = int(DataType.DT_HALF), int(DataType.DT_BFLOAT16), int(DataType.DT_FLOAT)


def summary(amax: float, amin: float = 1e-3, dtype: int = HALF, nan: int = 0) -> np.ndarray:
    """A recorded FULL_HEALTH summary: tfdbg2's 11 slots, then the ranges."""
    return np.array([-1, -1, dtype, 1, 10, 0, 0, nan, 4, 1, 5 - nan, amax, amin], np.float64)


def write(
    logdir: Path,
    series: dict[tuple[str, Phase], list[float]],
    dtype: int = HALF,
    extra_ops: tuple[str, ...] = (),
    **kwargs: object,
) -> None:
    """One execution per (module, phase) and step, whose largest |x| is the series' value."""
    kwargs.setdefault("circular_buffer_size", -1)
    w = DumpWriter(logdir, "FULL_HEALTH", **kwargs)  # type: ignore[arg-type]
    steps = max(len(v) for v in series.values())
    tid = 0
    for step in range(steps):
        for (module, phase), values in series.items():
            if step < len(values):
                tid += 1
                w.write_execution(ExecutionEvent("aten.mm.default", [tid], [tid - 1],
                                                 summaries=[summary(values[step], dtype=dtype)],
                                                 module_path=module, phase=phase, step=step))  # fmt: skip
        for op in extra_ops:
            tid += 1
            w.write_execution(ExecutionEvent(op, [tid], [tid - 1], step=step))
    w.close()


# -- the format --------------------------------------------------------------------------------


def test_combine_takes_the_output_nearest_its_format_max() -> None:
    # float32 1e5 is far from its max; float16 6e4 is 92% of 65,504: that one is reported.
    row = headroom.combine([F32, HALF], [(1e5, 2.0), (6e4, 0.5)])
    assert row == headroom.RangeRow(6e4, 0.5, HALF)
    assert headroom.combine([HALF], [None]) == headroom.UNKNOWN_RANGES
    # float64 extremes are held at float32's limits (the index stores float32).
    big = headroom.combine([int(DataType.DT_DOUBLE)], [(1e300, 1e-300)])
    assert big.amax == headroom.FORMATS["float32"].max
    assert big.amin == headroom.FORMATS["float32"].smallest


def test_of_value_skips_nonfinite_and_zeros() -> None:
    v = np.array([0.0, -3.0, np.inf, np.nan, 1e-4], dtype=np.float32)
    dtype, (amax, amin) = headroom.of_value(v)  # type: ignore[misc]
    assert dtype == F32 and amax == 3.0 and amin == pytest.approx(1e-4)
    assert headroom.of_value(np.zeros(3)) == (int(DataType.DT_DOUBLE), (0.0, math.inf))
    assert headroom.of_value(np.arange(3)) is None  # integers have no headroom


def test_ranges_are_written_apart_from_the_tfdbg2_summary(tmp_path: Path) -> None:
    """The record keeps tfdbg2's 11 slots where TensorFlow reads them; the ranges go to
    output_ranges; the reader and the index give them back."""
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1)
    w.write_execution(ExecutionEvent("aten.mm.default", [1, 2], [0],
                                     summaries=[summary(300.0, 0.25), None],
                                     module_path="net.fc", phase=Phase.FORWARD))  # fmt: skip
    w.close()
    (path,) = tmp_path.glob("*.execution")
    (payload,) = list(iter_payloads(path.read_bytes(), str(path)))
    ev = pb.DebugEvent.FromString(payload)
    first = ev.execution.tensor_protos[0]
    assert len(first.tensor_content) == 8 * 11  # tfdbg2's FULL_HEALTH, as TensorFlow reads it
    assert list(ev.execution.output_ranges)[:2] == [300.0, 0.25]
    assert all(math.isnan(v) for v in ev.execution.output_ranges[2:])
    with nanscope.open_dump(tmp_path) as r:
        ex = r.execution(0)
        assert ex.output_ranges == ((300.0, 0.25), None)
        assert ex.outputs_json()[0]["range"] == {"max_abs": 300.0, "min_nonzero_abs": 0.25}
        (point,) = r.range_history()  # the history: one point, the step's extremes
        assert (float(point["amax"]), float(point["amin"]), int(point["range_dtype"])) == (
            300.0, 0.25, HALF,
        )  # fmt: skip
        assert r.string(int(point["module"])) == "net.fc" and int(point["phase"]) == 1


@pytest.mark.parametrize("points", [8, 7])  # an odd point out stays as it is
def test_the_history_halves_its_oldest_points_and_keeps_the_largest(points: int) -> None:
    h = RangeHistory(points=points)
    levels = [float(k) for k in range(20)]
    for step, v in enumerate(levels):
        h.add("m", 1, step, v, 1.0 / (step + 1), HALF)
        h.add("m", 1, step, v / 2, 0.5, HALF)  # a smaller value in the same step
    data = h.to_bytes()
    modules, kept = headroom.parse_history([r.payload for r in scan(data, "h").records])
    assert modules == ["m"]
    # Every step is covered once, in order, and each point holds its steps' largest value.
    lo, hi = kept["step_lo"].tolist(), kept["step_hi"].tolist()
    assert lo[0] == 0 and hi[-1] == 19 and all(a == b + 1 for a, b in zip(lo[1:], hi, strict=False))
    assert len(kept) <= points
    for p in kept:
        assert float(p["amax"]) == max(levels[p["step_lo"] : p["step_hi"] + 1])
        assert float(p["amin"]) == pytest.approx(min(0.5, 1.0 / (p["step_hi"] + 1)))


def test_a_history_larger_than_a_writer_makes_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crafted ``.nsranges`` cannot make the reader allocate what it claims."""
    from nanscope.reader import _dump

    write(tmp_path, {("net.fc", Phase.FORWARD): [1.0] * 5})
    monkeypatch.setattr(_dump, "MAX_HISTORY_BYTES", 64)
    with nanscope.open_dump(tmp_path) as r:
        assert len(r.range_history()) == 0
        assert any("more than a writer makes" in p.message for p in r.problems)


def test_without_a_history_the_records_serve(tmp_path: Path) -> None:
    """A damaged history is a problem; a missing one (a process killed before its first
    rewrite) is not: either way the kept records' ranges are read instead."""
    values = [2.0 ** (k / 20) for k in range(300)]
    write(tmp_path, {("net.fc", Phase.FORWARD): values})
    (path,) = tmp_path.glob(f"*.{RANGES}")
    with nanscope.open_dump(tmp_path) as r:
        expected = analyze_headroom(r)
    assert expected is not None and len(expected.warnings) == 1
    path.write_bytes(path.read_bytes()[:-3])
    with nanscope.open_dump(tmp_path) as r:
        assert len(r.range_history()) == 0
        assert any("range history cannot be read" in p.message for p in r.problems)
        h = analyze_headroom(r)
    path.unlink()
    with nanscope.open_dump(tmp_path) as r:
        assert not r.problems
        h2 = analyze_headroom(r)
    for got in (h, h2):
        assert got is not None
        assert [warning_text(w) for w in got.warnings] == [
            warning_text(w) for w in expected.warnings
        ]
        assert [w.value for w in got.warnings] == [w.value for w in expected.warnings]


# -- the rules ---------------------------------------------------------------------------------


def test_growth_to_overflow_is_warned_with_its_rate(tmp_path: Path) -> None:
    """|x| doubles every 20 steps from 1: 65,504 is passed at step 320. The projection rule
    (a level of at least 1/16 growing to overflow within 500 steps) holds from the step where
    |x| first reaches 65,504 / 16; the warning names the rate the test computes."""
    values = [2.0 ** (k / 20) for k in range(300)]
    write(tmp_path, {("net.fc", Phase.FORWARD): values, ("net.norm", Phase.FORWARD): [3.0] * 300})
    with nanscope.open_dump(tmp_path) as r:
        h = analyze_headroom(r)
    assert h is not None
    (w,) = h.warnings
    assert (w.kind, w.module, w.phase, w.format, w.step) == ("overflow", "net.fc", "forward",
                                                            "float16", 299)  # fmt: skip
    assert w.value == np.float32(values[-1])
    assert w.growth_per_100 == pytest.approx(2.0**5, rel=1e-3)
    expected_since = next(k for k, v in enumerate(values) if v / 65504 >= 1 / 16)
    assert w.since_step == expected_since
    assert w.steps_left == pytest.approx(math.log2(65504 / values[-1]) * 20, abs=1)
    text = warning_text(w)
    assert "near overflow: `net.fc` reached" in text and "growing 32x per 100 steps" in text
    # The facts carry no words; the JSON report's warning adds them as its last key.
    assert "message" not in w.to_json()
    assert list(warning_json(w).items()) == [*w.to_json().items(), ("message", text)]


def test_sentinels_at_the_maximum_are_not_growth(tmp_path: Path) -> None:
    """finfo(float16).min as a mask value: exactly 65,504 every step."""
    write(tmp_path, {("attn", Phase.FORWARD): [65504.0] * 50})
    with nanscope.open_dump(tmp_path) as r:
        h = analyze_headroom(r)
    assert h is None or h.warnings == []


@pytest.mark.parametrize("scaler", [True, False])
def test_a_loss_scaler_makes_backward_overflow_expected(tmp_path: Path, scaler: bool) -> None:
    ops = ("aten._amp_foreach_non_finite_check_and_unscale_.default",) if scaler else ()
    write(tmp_path, {("fc", Phase.BACKWARD): [40000.0] * 30, ("fc", Phase.FORWARD): [1.0] * 30},
          extra_ops=ops)  # fmt: skip
    with nanscope.open_dump(tmp_path) as r:
        h = analyze_headroom(r)
    assert h is not None and h.scaler is scaler
    assert [(w.module, w.phase) for w in h.warnings] == ([] if scaler else [("fc", "backward")])


@pytest.mark.parametrize(("dtype", "warned"), [(HALF, True), (BF16, False)])
def test_a_module_whose_largest_value_is_subnormal_underflows(
    tmp_path: Path, dtype: int, warned: bool
) -> None:
    """Every value of the module below float16's smallest normal (6.1e-5) for 3 steps."""
    values = [1e-2, 1e-3, 1e-4, 3e-5, 1e-5, 4e-6]
    write(tmp_path, {("grad.fc", Phase.BACKWARD): values}, dtype=dtype)
    with nanscope.open_dump(tmp_path) as r:
        h = analyze_headroom(r)
    assert h is not None
    if not warned:
        assert h.warnings == []
        return
    (w,) = h.warnings
    assert (w.kind, w.since_step, w.step) == ("underflow", 3, 5)
    assert w.limit == 2.0**-14 and "round to zero below 2.98e-08" in warning_text(w)


def test_a_target_format_names_values_beyond_it(tmp_path: Path) -> None:
    write(tmp_path, {("mlp.fc1", Phase.FORWARD): [1000.0] * 20, ("mlp.fc2", Phase.FORWARD): [10.0] * 20},
          dtype=F32)  # fmt: skip
    with nanscope.open_dump(tmp_path) as r:
        assert analyze_headroom(r).warnings == []  # type: ignore[union-attr]  # float32: far
        h = analyze_headroom(r, "float8_e4m3fn")
    assert h is not None
    (w,) = h.warnings
    assert w.module == "mlp.fc1" and w.limit == 448.0
    assert warning_text(w).startswith("beyond float8_e4m3fn: `mlp.fc1` reached 1,000, 2.2x")


def test_the_history_outlives_the_circular_buffer(tmp_path: Path) -> None:
    """A buffer of 50 events keeps the last 25 steps; the trend is judged on all 300."""
    values = [2.0 ** (k / 20) for k in range(300)]
    write(tmp_path, {("net.fc", Phase.FORWARD): values, ("net.b", Phase.FORWARD): [1.0] * 300},
          circular_buffer_size=50)  # fmt: skip
    with nanscope.open_dump(tmp_path) as r:
        assert int(r.index(EXECUTIONS)["step"].min()) > 250
        a = analyze(r)
    assert a.headroom is not None
    (w,) = a.headroom.warnings
    assert w.since_step == next(k for k, v in enumerate(values) if v / 65504 >= 1 / 16) < 250
