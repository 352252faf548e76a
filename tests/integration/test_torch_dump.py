"""PyTorch dumping: summaries in every mode against numpy, filters, sessions, links, phases."""

from __future__ import annotations

import math
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nanscope
from nanscope.reader import EXECUTIONS, DumpReader, Execution

from ..helpers import marked_line, summaries_of, summary_of, torch_recorder

pytestmark = pytest.mark.torch

INF, NAN = math.inf, math.nan
THIS_FILE = os.path.abspath(__file__)
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ALL_MODES = ["NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_TENSOR"]
HEALTH_MODES = ["CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH"]
# tfdbg2 DataType numbers.
DTYPE_ENUM = {
    torch.float32: 1,
    torch.float64: 2,
    torch.int32: 3,
    torch.uint8: 4,
    torch.complex64: 8,
    torch.int64: 9,
    torch.bool: 10,
    torch.bfloat16: 14,
    torch.float16: 19,
}
FULL_TENSOR_DTYPE = {
    torch.float16: np.float16,
    torch.bfloat16: np.float32,  # widened
    torch.float32: np.float32,
    torch.float64: np.float64,
}

# Every category of value: -inf, +inf, nan, negative, zero (both signs), positive.
X_VALUES = [[-INF, INF, NAN, -2.5], [-1.0, 0.0, -0.0, 0.5], [3.0, 1.0, 2.0, 0.25]]
Y_VALUES = [[2.0, 0.0, 1.0, -1.0], [INF, 5.0, NAN, 0.0], [-2.0, 0.0, 4.0, -INF]]


# -- helpers ----------------------------------------------------------------------------------


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# <marker>``."""
    return marked_line(THIS_FILE, f"# {marker}")


def record(
    logdir: Path, fn: Callable[[], Any], mode: str = "FULL_HEALTH", **kwargs: Any
) -> tuple[DumpReader, list[Execution], Any]:
    """Run ``fn`` while dumping into ``logdir``; returns the reader, executions and result."""
    kwargs.setdefault("circular_buffer_size", -1)
    with nanscope.enable_dump_debug_info(logdir, mode, **kwargs):
        result = fn()  # @record-call
    r = nanscope.open_dump(logdir)
    assert r.problems == []
    return r, r.executions(), result


def values64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy().reshape(-1)


def expected_summary(t: Any, mode: str) -> np.ndarray | None:
    """The summary of ``t`` in ``mode``, computed independently with numpy."""
    dtype = t.dtype
    if mode == "SHAPE":
        if dtype.is_complex:
            return None
        dims = list(t.shape)[-6:]
        dims += [0] * (6 - len(dims))
        return np.array([-1, DTYPE_ENUM[dtype], t.dim(), t.numel(), *dims], dtype=np.float64)
    if dtype not in FULL_TENSOR_DTYPE:
        return None
    v = values64(t)
    finite = np.isfinite(v)
    ninf = np.count_nonzero(np.isneginf(v))
    pinf = np.count_nonzero(np.isposinf(v))
    nan = np.count_nonzero(np.isnan(v))
    if mode == "CURT_HEALTH":
        return np.array([-1, float(not finite.all())])
    if mode == "CONCISE_HEALTH":
        return np.array([-1, v.size, ninf, pinf, nan], dtype=np.float64)
    assert mode == "FULL_HEALTH"
    neg = np.count_nonzero(finite & (v < 0))
    zero = np.count_nonzero(v == 0)
    pos = np.count_nonzero(finite & (v > 0))
    return np.array(
        [-1, -1, DTYPE_ENUM[dtype], t.dim(), v.size, ninf, pinf, nan, neg, zero, pos],
        dtype=np.float64,
    )


def check_outputs(e: Execution, outputs: list[Any], mode: str) -> None:
    """The recorded outputs of ``e`` are what numpy says about ``outputs``."""
    assert len(e.output_tensor_ids) == len(outputs), e.op_type
    if mode == "NO_TENSOR":
        assert e.debug_tensor_values is None and e.tensor_values is None
        return
    if mode == "FULL_TENSOR":
        assert e.debug_tensor_values is None and e.tensor_values is not None
        for got, t in zip(e.tensor_values, outputs, strict=True):
            if t.dtype.is_complex:
                want = t.detach().resolve_conj().numpy()
            elif t.dtype == torch.bfloat16:
                want = t.detach().float().numpy()
            else:
                want = t.detach().numpy()
            assert got is not None and got.dtype == want.dtype, (e.op_type, got)
            np.testing.assert_array_equal(got, want, err_msg=e.op_type)
        return
    assert e.tensor_values is None and e.debug_tensor_values is not None
    for got, t in zip(e.debug_tensor_values, outputs, strict=True):
        want = expected_summary(t, mode)
        if want is None:
            assert got is None, (e.op_type, t.dtype, got)
        else:
            assert got is not None, (e.op_type, t.dtype)
            np.testing.assert_array_equal(got, want, err_msg=f"{e.op_type} {t.dtype} {mode}")


def by_op(execs: list[Execution], op_type: str) -> Execution:
    (e,) = [e for e in execs if e.op_type == op_type]
    return e


def frame_lines(r: DumpReader, frame_ids: tuple[str, ...], process: int = 0) -> list[int]:
    """The lines of this file in a stack, outermost first."""
    return [f.lineno for f in r.stack_frames(frame_ids, process) if f.file_path == THIS_FILE]


# -- summaries in every mode ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("mode", ALL_MODES)
def test_float_summaries_match_numpy(tmp_path: Path, mode: str, dtype: Any) -> None:
    x = torch.tensor(X_VALUES, dtype=dtype)
    y = torch.tensor(Y_VALUES, dtype=dtype)

    def run() -> dict[str, Any]:
        return {
            "aten.log.default": torch.log(x),
            "aten.mul.Tensor": x * y,
            "aten.exp.default": torch.exp(x),
            "aten.slice.Tensor": (s := x[1:]),
            "aten.tanh.default": torch.tanh(s),
        }

    r, execs, outs = record(tmp_path, run, mode)
    assert [e.op_type for e in execs] == list(outs)
    assert [e.sequence for e in execs] == [1, 2, 3, 4, 5]
    assert all(e.phase == 1 and e.step == 0 for e in execs)
    for e in execs:
        check_outputs(e, [outs[e.op_type]], mode)
    # The index agrees with the records: only log, mul and exp hold Inf/NaN.
    bad = [i for i, t in enumerate(outs.values()) if not torch.isfinite(t).all()]
    assert bad == [0, 1, 2]
    if mode in ("NO_TENSOR", "SHAPE"):
        assert r.nonfinite(EXECUTIONS).tolist() == []
        assert r.first_nonfinite(EXECUTIONS) is None
    else:
        assert r.nonfinite(EXECUTIONS).tolist() == bad
        ref = r.first_nonfinite(EXECUTIONS)
        assert ref is not None and ref.index == 0
    if mode in ("FULL_HEALTH", "CONCISE_HEALTH", "FULL_TENSOR"):
        idx = r.index(EXECUTIONS)
        for i, t in enumerate(outs.values()):
            v = values64(t)
            assert idx["nan"][i] == np.isnan(v).sum()
            assert idx["neg_inf"][i] == np.isneginf(v).sum()
            assert execs[i].health.size == v.size
            h = execs[i].health
            assert (h.nan, h.neg_inf, h.pos_inf) == (
                np.isnan(v).sum(),
                np.isneginf(v).sum(),
                np.isposinf(v).sum(),
            )
    if mode == "FULL_HEALTH":
        h = by_op(execs, "aten.log.default").health
        v = values64(outs["aten.log.default"])
        finite = np.isfinite(v)
        assert (h.neg, h.zero, h.pos) == (
            int(np.count_nonzero(finite & (v < 0))),
            int(np.count_nonzero(v == 0)),
            int(np.count_nonzero(finite & (v > 0))),
        )
        assert h.any_nonfinite is True
        assert by_op(execs, "aten.tanh.default").health.any_nonfinite is False


@pytest.mark.parametrize("mode", ALL_MODES)
def test_integer_and_bool_outputs(tmp_path: Path, mode: str) -> None:
    def run() -> list[Any]:
        a = torch.arange(12)
        b = a.view(3, 4)
        u = torch.arange(3, dtype=torch.uint8)
        z = torch.zeros(1, 2, 1, 3, 1, 2, 2)
        return [a, b, u, z, b > 5, b.to(torch.int32), u * 2, z + 1]  # z + 1: rank 7

    r, execs, outs = record(tmp_path, run, mode)
    assert [e.op_type for e in execs] == [
        "aten.arange.default",
        "aten.view.default",
        "aten.arange.default",
        "aten.zeros.default",
        "aten.gt.Scalar",
        "aten._to_copy.default",
        "aten.mul.Tensor",
        "aten.add.Tensor",
    ]
    for e, t in zip(execs, outs, strict=True):
        check_outputs(e, [t], mode)
    if mode == "SHAPE":
        # The last six dims of a rank-7 tensor.
        assert summary_of(execs[7]).tolist() == [-1, 1, 7, 24, 2, 1, 3, 1, 2, 2]
        assert summary_of(execs[4])[1] == 10  # bool
        assert summary_of(execs[0])[1] == 9  # int64
        assert summary_of(execs[5])[1] == 3  # int32
        assert summary_of(execs[6])[1] == 4  # uint8
    if mode in HEALTH_MODES:
        ints = [e for e in execs if e.op_type not in ("aten.zeros.default", "aten.add.Tensor")]
        assert len(ints) == 6 and all(e.debug_tensor_values == (None,) for e in ints)
    assert r.nonfinite(EXECUTIONS).tolist() == []


@pytest.mark.parametrize("mode", ALL_MODES)
def test_complex_outputs_are_recorded_without_health(tmp_path: Path, mode: str) -> None:
    re_, im = torch.tensor([1.0, INF, 0.0]), torch.tensor([2.0, 0.0, NAN])

    def run() -> dict[str, Any]:
        z = torch.complex(re_, im)
        return {"aten.complex.default": z, "aten.mul.Tensor": z * 2, "aten.abs.default": z.abs()}

    _, execs, outs = record(tmp_path, run, mode)
    assert [e.op_type for e in execs] == list(outs)
    for e in execs:
        check_outputs(e, [outs[e.op_type]], mode)
    if mode in (*HEALTH_MODES, "SHAPE"):
        assert by_op(execs, "aten.complex.default").debug_tensor_values == (None,)
        assert summaries_of(by_op(execs, "aten.abs.default"))[0] is not None


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arrays=st.lists(
        st.sampled_from([np.float16, np.float32, np.float64]).flatmap(
            lambda dt: hnp.arrays(
                dt,
                hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
                elements=st.one_of(
                    st.sampled_from([-INF, INF, NAN, 0.0, -0.0]),
                    st.floats(width=16 if dt == np.float16 else 32),
                ),
            )
        ),
        min_size=1,
        max_size=4,
    ),
    mode=st.sampled_from(HEALTH_MODES),
)
def test_random_values_match_numpy(arrays: list[np.ndarray], mode: str) -> None:
    tensors = [torch.from_numpy(a.copy()) for a in arrays]
    with tempfile.TemporaryDirectory() as logdir:
        _, execs, outs = record(Path(logdir), lambda: [t.clone() for t in tensors], mode)
        assert [e.op_type for e in execs] == ["aten.clone.default"] * len(tensors)
        for e, t in zip(execs, outs, strict=True):
            check_outputs(e, [t], mode)


# -- filters ----------------------------------------------------------------------------------


def test_op_regex_limits_summaries_not_executions(tmp_path: Path) -> None:
    x = torch.tensor(X_VALUES)

    def run() -> None:
        torch.exp(torch.log(x) * 2)

    _, execs, _ = record(tmp_path / "a", run, op_regex=r"aten\.log")
    assert [e.op_type for e in execs] == ["aten.log.default", "aten.mul.Tensor", "aten.exp.default"]
    check_outputs(execs[0], [torch.log(x)], "FULL_HEALTH")
    assert execs[1].debug_tensor_values == (None,) and execs[2].debug_tensor_values == (None,)
    # The inputs and outputs are linked even where nothing is summarised.
    assert execs[1].input_tensor_ids == execs[0].output_tensor_ids
    assert execs[2].input_tensor_ids == execs[1].output_tensor_ids
    # re.match, as TensorFlow: the pattern must match from the start of the op name.
    _, execs, _ = record(tmp_path / "b", run, op_regex="log")
    assert len(execs) == 3 and all(e.debug_tensor_values == (None,) for e in execs)
    _, execs, _ = record(tmp_path / "c", run, op_regex=r"aten\.(log|exp)")
    assert [summaries_of(e)[0] is not None for e in execs] == [True, False, True]


@pytest.mark.parametrize(
    "tensor_dtypes",
    [[torch.float64], ["float64"], ("float64", torch.int64), lambda dt: dt == torch.float64],
    ids=["dtype-list", "name-list", "tuple", "predicate"],
)
def test_tensor_dtypes_filter(tmp_path: Path, tensor_dtypes: Any) -> None:
    x32 = torch.tensor(X_VALUES, dtype=torch.float32)
    x64 = torch.tensor(X_VALUES, dtype=torch.float64)

    def run() -> list[Any]:
        return [torch.log(x32), torch.log(x64), x32 * 2, x64 * 2]

    _, execs, outs = record(tmp_path, run, tensor_dtypes=tensor_dtypes)
    assert len(execs) == 4
    for e, t in zip(execs, outs, strict=True):
        if t.dtype == torch.float64:
            check_outputs(e, [t], "FULL_HEALTH")
        else:
            assert e.debug_tensor_values == (None,)


def test_tensor_dtypes_filter_in_shape_mode(tmp_path: Path) -> None:
    def run() -> list[Any]:
        a = torch.arange(6)
        return [a, a.float(), a > 2]

    _, execs, outs = record(tmp_path, run, "SHAPE", tensor_dtypes=[torch.int64, torch.bool])
    assert [v is not None for e in execs for v in summaries_of(e)] == [True, False, True]
    check_outputs(execs[0], [outs[0]], "SHAPE")
    check_outputs(execs[2], [outs[2]], "SHAPE")


@pytest.mark.parametrize(
    ("tensor_dtypes", "match"),
    [
        ("float32", "tensor_dtypes must be a list of dtypes"),
        (torch.float32, "tensor_dtypes must be a list of dtypes"),
        (["float33"], "'float33' is not a torch dtype"),
        ([torch.float32, 3], "3 is not a torch dtype"),
        (["Tensor"], "'Tensor' is not a torch dtype"),
    ],
)
def test_invalid_tensor_dtypes_is_a_clear_error(
    tmp_path: Path, tensor_dtypes: Any, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        nanscope.enable_dump_debug_info(tmp_path / "bad", tensor_dtypes=tensor_dtypes)
    # Nothing was left enabled: other settings are accepted right away.
    with nanscope.enable_dump_debug_info(tmp_path / "ok", "SHAPE"):
        torch.ones(2) + 1
    assert nanscope.open_dump(tmp_path / "ok").num_executions() == 2


@pytest.mark.parametrize(
    ("mode", "match"),
    [
        ("FULLHEALTH", "unknown tensor debug mode 'FULLHEALTH'; use one of: NO_TENSOR"),
        (99, "unknown tensor debug mode 99"),
        ("FULL_NUMERICS", "FULL_NUMERICS cannot be written"),
        ("REDUCE_INF_NAN_THREE_SLOTS", "cannot be written"),
    ],
)
def test_unknown_mode_is_a_clear_error(tmp_path: Path, mode: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        nanscope.enable_dump_debug_info(tmp_path, mode)
    with nanscope.enable_dump_debug_info(tmp_path / "ok", "NO_TENSOR"):
        pass


@pytest.mark.parametrize("mode", ["full_health", " shape ", 4, nanscope.TensorDebugMode.SHAPE])
def test_mode_by_any_case_or_number(tmp_path: Path, mode: Any) -> None:
    _, execs, _ = record(tmp_path, lambda: torch.ones(3) * 2, mode)
    assert execs[-1].tensor_debug_mode.name in ("FULL_HEALTH", "SHAPE")
    assert summaries_of(execs[-1])[0] is not None


# -- sessions ---------------------------------------------------------------------------------


def test_enable_twice_with_same_settings_returns_the_same_session(tmp_path: Path) -> None:
    s1 = nanscope.enable_dump_debug_info(tmp_path, "CONCISE_HEALTH", circular_buffer_size=-1)
    try:
        s2 = nanscope.enable_dump_debug_info(str(tmp_path), "concise_health", -1)
        assert s2 is s1
        assert s1.logdir == str(tmp_path) and s1.framework == "torch"
        torch.ones(2) * 3
    finally:
        nanscope.disable_dump_debug_info()
    execs = nanscope.open_dump(tmp_path).executions()
    assert [e.op_type for e in execs] == ["aten.ones.default", "aten.mul.Tensor"]


@pytest.mark.parametrize(
    "other",
    [
        {"tensor_debug_mode": "SHAPE"},
        {"circular_buffer_size": 10},
        {"op_regex": "aten"},
        {"tensor_dtypes": [torch.float32]},
        {"logdir": "elsewhere"},
    ],
)
def test_enable_with_other_settings_is_an_error(tmp_path: Path, other: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "logdir": tmp_path / "a",
        "tensor_debug_mode": "FULL_HEALTH",
        "circular_buffer_size": -1,
    }
    s = nanscope.enable_dump_debug_info(**base)
    try:
        changed = {**base, **other}
        if other.get("logdir"):
            changed["logdir"] = tmp_path / other["logdir"]
        with pytest.raises(ValueError, match=r"already dumping to .*disable_dump_debug_info\(\)"):
            nanscope.enable_dump_debug_info(**changed)
        # The first session is untouched and still records.
        assert nanscope.enable_dump_debug_info(**base) is s
        torch.ones(1) + 1
    finally:
        nanscope.disable_dump_debug_info()
    assert nanscope.open_dump(tmp_path / "a").num_executions() == 2


def test_disable_then_enable_again(tmp_path: Path) -> None:
    nanscope.disable_dump_debug_info()  # nothing enabled: a no-op
    nanscope.disable_dump_debug_info()
    first = nanscope.enable_dump_debug_info(tmp_path / "a", circular_buffer_size=-1)
    try:
        torch.ones(2) * 2
    finally:
        nanscope.disable_dump_debug_info()
    torch.ones(2) * 3  # not recorded anywhere
    second = nanscope.enable_dump_debug_info(tmp_path / "b", "SHAPE", circular_buffer_size=-1)
    try:
        assert second is not first
        torch.ones(4).sum()
    finally:
        nanscope.disable_dump_debug_info()
    nanscope.disable_dump_debug_info()
    first.close()  # closing an already closed session is harmless
    a = nanscope.open_dump(tmp_path / "a").executions()
    b = nanscope.open_dump(tmp_path / "b").executions()
    assert [e.op_type for e in a] == ["aten.ones.default", "aten.mul.Tensor"]
    assert [e.op_type for e in b] == ["aten.ones.default", "aten.sum.default"]
    assert b[0].tensor_debug_mode.name == "SHAPE"


def test_leaving_the_context_stops_recording(tmp_path: Path) -> None:
    with nanscope.enable_dump_debug_info(tmp_path, circular_buffer_size=-1) as s:
        torch.ones(2) + 1
        s.flush()
        assert nanscope.open_dump(tmp_path).num_executions() == 2
    torch.ones(2) + 1
    assert nanscope.open_dump(tmp_path).num_executions() == 2
    # Another session can start at once.
    with nanscope.enable_dump_debug_info(tmp_path / "next", "SHAPE"):
        pass


# -- tensor ids -------------------------------------------------------------------------------


def test_consumers_link_to_producers(tmp_path: Path) -> None:
    x = torch.tensor([1.0, -2.0, 3.0])

    def run() -> None:
        a = x + 1
        b = a * 2
        torch.add(b, a)

    _, execs, _ = record(tmp_path, run)
    add, mul, add2 = execs
    assert mul.input_tensor_ids == add.output_tensor_ids
    assert add2.input_tensor_ids == mul.output_tensor_ids + add.output_tensor_ids
    ids = [i for e in execs for i in e.output_tensor_ids]
    assert len(set(ids)) == len(ids)
    assert add.input_tensor_ids[0] not in ids  # x came from outside
    assert all(
        d == execs[0].output_tensor_device_ids[0] for e in execs for d in e.output_tensor_device_ids
    )


def test_inplace_ops_give_a_fresh_id(tmp_path: Path) -> None:
    x = torch.tensor([1.0, -2.0, 3.0])

    def run() -> Any:
        a = x * 1
        a.add_(1)
        c = a * 3
        a.mul_(0)
        return c, a

    _, execs, (c, a) = record(tmp_path, run)
    mul, add_, mul2, mul_ = execs
    assert [e.op_type for e in execs][1::2] == ["aten.add_.Tensor", "aten.mul_.Tensor"]
    assert add_.input_tensor_ids == mul.output_tensor_ids
    assert add_.output_tensor_ids != mul.output_tensor_ids
    assert mul2.input_tensor_ids == add_.output_tensor_ids
    assert mul_.input_tensor_ids == add_.output_tensor_ids
    # The in-place outputs are summarised after the op.
    check_outputs(add_, [torch.tensor([2.0, -1.0, 4.0])], "FULL_HEALTH")
    check_outputs(mul_, [a], "FULL_HEALTH")
    check_outputs(mul2, [c], "FULL_HEALTH")


@pytest.mark.parametrize("base_inside", [False, True], ids=["base-from-outside", "base-recorded"])
def test_views_have_the_counts_of_their_base(tmp_path: Path, base_inside: bool) -> None:
    x0 = torch.tensor(X_VALUES)

    def run() -> dict[str, Any]:
        x = x0 * 1 if base_inside else x0
        return {
            "aten.t.default": x.t(),
            "aten.view.default": x.view(2, 3, 2),
            "aten.reshape": x.reshape(-1),  # a view: recorded as aten.view
            "aten.unsqueeze.default": x.unsqueeze(0),
            "aten.transpose.int": x.transpose(0, 1),
            "aten.permute.default": x.permute(1, 0),
        }

    _, execs, outs = record(tmp_path, run)
    views = [e for e in execs if e.op_type != "aten.mul.Tensor"]
    assert len(views) == len(outs)
    base = expected_summary(x0, "FULL_HEALTH")
    assert base is not None
    base_counts = base[4:]
    for e, t in zip(views, outs.values(), strict=True):
        check_outputs(e, [t], "FULL_HEALTH")
        got = summary_of(e)
        assert got[3] == t.dim()
        np.testing.assert_array_equal(got[4:], base_counts)
        if base_inside:
            assert e.input_tensor_ids == execs[0].output_tensor_ids
    assert views[0].op_type == "aten.t.default" and summary_of(views[0])[3] == 2
    assert summary_of(views[3])[3] == 3


@pytest.mark.parametrize(
    "mode",
    [
        "FULL_HEALTH",
        "CONCISE_HEALTH",
        "CURT_HEALTH",
        "SHAPE",  # SHAPE summaries are never reused
        "FULL_TENSOR",
    ],
)
def test_view_as_other_dtype_is_summarised_as_that_dtype(tmp_path: Path, mode: str) -> None:
    def run() -> list[Any]:
        x = torch.tensor([1.0, -2.0, 0.0, 3.0]) * 1
        return [x.view(torch.int32), x.view(torch.float16)]

    _, execs, outs = record(tmp_path, run, mode)
    views = [e for e in execs if e.op_type == "aten.view.dtype"]
    assert len(views) == 2
    check_outputs(views[0], [outs[0]], mode)
    check_outputs(views[1], [outs[1]], mode)


@pytest.mark.parametrize("how", ["setitem", "alias-inplace"])
def test_view_after_write_through_an_alias_sees_the_new_values(tmp_path: Path, how: str) -> None:
    def run() -> Any:
        a = torch.tensor(X_VALUES[1:]) * 1  # finite
        if how == "setitem":
            a[0, 0] = NAN
        else:
            v = a.view(-1)
            v.mul_(0)
        return a.t()

    _, execs, t = record(tmp_path, run)
    check_outputs(execs[-1], [t], "FULL_HEALTH")


def test_negative_bit_views_are_recorded(tmp_path: Path) -> None:
    z = torch.complex(torch.tensor([1.0, 2.0]), torch.tensor([3.0, -4.0]))

    def run() -> Any:
        return z.conj().imag * 1

    _, execs, out = record(tmp_path, run)
    ops = [e.op_type for e in execs]
    assert "aten._neg_view.default" in ops and "aten.select.int" in ops
    check_outputs(execs[-1], [out], "FULL_HEALTH")
    # Every consumed id was produced by a recorded op.
    produced = {i for e in execs for i in e.output_tensor_ids}
    assert set(execs[-1].input_tensor_ids) <= produced


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "CONCISE_HEALTH", "CURT_HEALTH", "SHAPE"])
def test_empty_tensors(tmp_path: Path, mode: str) -> None:
    def run() -> list[Any]:
        e = torch.zeros(0, 3)
        return [e, torch.log(e), e.t(), torch.empty(0, dtype=torch.float16) * 2]

    _, execs, outs = record(tmp_path, run, mode)
    assert len(execs) == 5  # zeros, log, t, empty, mul
    pairs = [(execs[0], outs[0]), (execs[1], outs[1]), (execs[2], outs[2]), (execs[4], outs[3])]
    for e, t in pairs:
        check_outputs(e, [t], mode)
        assert e.health.any_nonfinite in (False, None)
        if mode in ("FULL_HEALTH", "CONCISE_HEALTH", "SHAPE"):
            assert e.health.size == 0
    if mode == "FULL_HEALTH":
        assert summary_of(execs[1]).tolist() == [-1, -1, 1, 2, 0, 0, 0, 0, 0, 0, 0]


def test_uninitialised_memory_is_not_reported_as_nonfinite(tmp_path: Path) -> None:
    from nanscope.backends.torch.suspension import not_recorded

    def run() -> None:
        for _ in range(50):
            with not_recorded():  # not recorded: NaN memory, then freed
                garbage = torch.full((4096,), NAN)
            del garbage
            torch.empty(4096)  # usually gets that memory back

    r, execs, _ = record(tmp_path, run)
    assert len(execs) == 50
    assert r.first_nonfinite(EXECUTIONS) is None


def test_views_of_uninitialised_memory_are_not_summarised(tmp_path: Path) -> None:
    """Regression: DDP views its gradient buckets right after ``empty``; NaN garbage was an origin."""
    from nanscope.backends.torch.suspension import not_recorded

    def run() -> Any:
        for _ in range(20):
            with not_recorded():  # not recorded: NaN memory, then freed
                garbage = torch.full((4096,), NAN)
            del garbage
            bucket = torch.empty(4096)  # usually gets that memory back
            bucket.as_strided((2048,), (2,)).view(32, 64).t()
            bucket[:5].view(5, 1)
        written = torch.empty(4)
        written.fill_(NAN)  # a write: its views have values again
        return written.view(2, 2)

    r, execs, out = record(tmp_path, run)
    ops = [e.op_type for e in execs]
    views = [e for e in execs[:-3] if e.op_type != "aten.empty.memory_format"]
    assert {e.op_type for e in views} == {
        "aten.as_strided.default", "aten.view.default", "aten.t.default", "aten.slice.Tensor"
    }  # fmt: skip
    assert all(e.debug_tensor_values == (None,) for e in views)
    assert ops[-3:] == ["aten.empty.memory_format", "aten.fill_.Scalar", "aten.view.default"]
    check_outputs(execs[-1], [out], "FULL_HEALTH")
    ref = r.first_nonfinite(EXECUTIONS)
    assert ref is not None and r.execution(ref.index).op_type == "aten.fill_.Scalar"


# -- stacks -----------------------------------------------------------------------------------


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return torch.add(x, 1)  # @leaf-op


def _deep(k: int, x: torch.Tensor) -> torch.Tensor:
    if k == 0:
        return _leaf(x)  # @deep-leaf
    return _deep(k - 1, x)  # @deep-recurse


DEEP = 6  # frames that every path shares above its own ones


def _via_a(x: torch.Tensor) -> torch.Tensor:
    return _deep(DEEP, x)  # @via-a


def _via_b(x: torch.Tensor) -> torch.Tensor:
    return _deep(DEEP, x)  # @via-b


def _twice(x: torch.Tensor) -> torch.Tensor:
    y = _via_a(x)  # @twice-a
    return _via_a(y)  # @twice-b


def _call_paths() -> torch.Tensor:
    x = torch.ones(2)
    for i in range(12):
        k = i % 3
        if k == 0:
            x = _via_a(x)  # @run-a
        elif k == 1:
            x = _via_b(x)  # @run-b
        else:
            x = _twice(x)  # @run-twice
    return x


def test_each_op_has_the_stack_it_ran_under_where_call_paths_share_frames(tmp_path: Path) -> None:
    """One line of code reached by interleaved call paths that share their innermost frames
    (the same eight frames at the same addresses, differing in an outer frame's line only,
    as in ``_twice``): each op's recorded stack is its own path. A recorder that tells a stack
    seen before by fewer than all its frames gives the second call in ``_twice`` the first's."""
    r, execs, _ = record(tmp_path, _call_paths, "NO_TENSOR")
    adds = [e for e in execs if e.op_type == "aten.add.Tensor"]
    shared = [line_of("@deep-recurse")] * DEEP + [line_of("@deep-leaf"), line_of("@leaf-op")]
    a = [line_of("@run-a"), line_of("@via-a"), *shared]
    b = [line_of("@run-b"), line_of("@via-b"), *shared]
    twice = [line_of("@run-twice"), line_of("@twice-a"), line_of("@via-a"), *shared]
    twice_b = [line_of("@run-twice"), line_of("@twice-b"), line_of("@via-a"), *shared]
    expected = [a, b, twice, twice_b] * 4
    assert len(adds) == len(expected)
    for e, path in zip(adds, expected, strict=True):
        lines = frame_lines(r, e.stack_frame_ids)
        # The path, under the test's own frames (its call of _call_paths and record's).
        assert lines[-len(path) :] == path
        assert lines[-len(path) - 1] == line_of("@record-call")


# -- backward, optimizer, steps ---------------------------------------------------------------


def test_backward_ops_link_to_their_forward_op(tmp_path: Path) -> None:
    x = torch.tensor([0.5, 2.0, 4.0], requires_grad=True)

    def run() -> None:
        y = torch.log(x)  # @log-forward
        z = torch.exp(y) * 3  # @exp-forward
        z.sum().backward()  # @backward-call

    r, execs, _ = record(tmp_path, run)
    seq = {e.sequence: e for e in execs}
    log = by_op(execs, "aten.log.default")
    exp = by_op(execs, "aten.exp.default")
    assert log.phase == exp.phase == 1 and log.forward_sequence == 0
    backward = [e for e in execs if e.phase == 2]
    assert backward, [e.op_type for e in execs]
    # d/dx log(x) = grad / x: the aten.div of the backward pass belongs to the log.
    (div,) = [e for e in backward if e.op_type == "aten.div.Tensor"]
    assert div.forward_sequence == log.sequence
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 3.0), rtol=1e-6)
    # The backward of exp multiplies by exp's output, and links to exp.
    exp_back = [e for e in backward if e.forward_sequence == exp.sequence]
    # A dispatch mode also sees the detach that unpacks the saved output; the
    # native recorder sees the unpacking inside the node, not as an op.
    native = torch_recorder() == "native"
    expected = {"aten.mul.Tensor"} if native else {"aten.mul.Tensor", "aten.detach.default"}
    assert {e.op_type for e in exp_back} == expected
    # Its saved output reaches it (through detach where the unpacking is an op).
    (mul,) = [e for e in exp_back if e.op_type == "aten.mul.Tensor"]
    producer = {i: e for e in execs for i in e.output_tensor_ids}
    origins = set()
    for tid in mul.input_tensor_ids:
        while tid in producer and producer[tid].op_type == "aten.detach.default":
            tid = producer[tid].input_tensor_ids[0]
        origins.add(tid)
    assert exp.output_tensor_ids[0] in origins
    # Every link points at a recorded forward op.
    for e in backward:
        if e.forward_sequence:
            assert seq[e.forward_sequence].phase == 1
    # Where it ran (the backward() call) and where its forward op was created.
    assert frame_lines(r, div.stack_frame_ids)[-1] == line_of("@backward-call")
    assert frame_lines(r, div.forward_stack_frame_ids)[-1] == line_of("@log-forward")
    assert frame_lines(r, log.stack_frame_ids)[-1] == line_of("@log-forward")
    assert frame_lines(r, exp_back[0].forward_stack_frame_ids)[-1] == line_of("@exp-forward")
    assert log.forward_stack_frame_ids == ()
    # The saved input of the log (x) is the forward op's input.
    assert log.input_tensor_ids[0] in div.input_tensor_ids


def test_backward_ops_take_the_module_path_of_their_forward_op(tmp_path: Path) -> None:
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 3)
            self.fc2 = torch.nn.Linear(3, 1)

        def forward(self, x: Any) -> Any:
            return self.fc2(torch.relu(self.fc1(x)))

    net = Net()

    def run() -> None:
        net(torch.randn(2, 4)).sum().backward()

    _, execs, _ = record(tmp_path, run)
    seq = {e.sequence: e for e in execs}
    fwd_paths = {e.module_path for e in execs if e.phase == 1}
    assert {"Net", "fc1 (Linear)", "fc2 (Linear)"} <= fwd_paths
    assert by_op(execs, "aten.relu.default").module_path == "Net"
    (th,) = [e for e in execs if e.op_type == "aten.threshold_backward.default"]
    assert th.phase == 2 and seq[th.forward_sequence].op_type == "aten.relu.default"
    assert th.module_path == "Net"
    linked = [e for e in execs if e.phase == 2 and e.forward_sequence]
    assert linked
    for e in linked:
        assert e.module_path == seq[e.forward_sequence].module_path
    assert {e.module_path for e in linked} >= {"fc1 (Linear)", "fc2 (Linear)"}


def _two_layer_net() -> Any:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(2, 2)
            self.fc2 = torch.nn.Linear(2, 2)

        def forward(self, x: Any) -> Any:
            return self.fc2(self.fc1(x))

    return Net()


def test_module_paths_of_a_reused_module(tmp_path: Path) -> None:
    net, x = _two_layer_net(), torch.ones(1, 2)

    def run() -> None:
        net(x)
        net(x)

    _, execs, _ = record(tmp_path, run)
    assert [e.module_path for e in execs] == [
        "fc1 (Linear)", "fc1 (Linear)", "fc2 (Linear)", "fc2 (Linear)",
    ] * 2  # fmt: skip


def test_module_path_after_calling_a_submodule_on_its_own(tmp_path: Path) -> None:
    net, x = _two_layer_net(), torch.ones(1, 2)

    def run() -> None:
        net.fc1(x)
        net(x)

    _, execs, _ = record(tmp_path, run)
    assert [e.module_path for e in execs[:2]] == ["Linear", "Linear"]
    assert [e.module_path for e in execs[2:]] == [
        "fc1 (Linear)", "fc1 (Linear)", "fc2 (Linear)", "fc2 (Linear)",
    ]  # fmt: skip


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_optimizer_phase_and_steps(tmp_path: Path, optimizer: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=0.1)
    data = torch.randn(4, 3)

    def run() -> None:
        for _ in range(3):
            loss = model(data).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    r, execs, _ = record(tmp_path, run)
    phases = [e.phase for e in execs]
    steps = [e.step for e in execs]
    assert set(phases) == {1, 2, 3}
    # Steps never go down and count completed optimizer.step() calls.
    assert steps == sorted(steps) and set(steps) == {0, 1, 2}
    for step in range(3):
        block = [e for e in execs if e.step == step]
        p = [e.phase for e in block]
        # forward, then backward, then the optimizer, within one step.
        assert p == sorted(p), (step, p)
        assert p[0] == 1 and p[-1] == 3 and 2 in p
        updates = [e for e in block if e.phase == 3]
        # The parameter update is an in-place op on each parameter.
        assert any(
            e.op_type.startswith(("aten.add_", "aten._foreach_add_")) for e in updates
        ) or any("addcdiv_" in e.op_type for e in updates), [e.op_type for e in updates]
        assert all(e.forward_sequence == 0 for e in updates)
    # The index carries the phase and step too.
    idx = r.index(EXECUTIONS)
    assert idx["step"].tolist() == steps
    assert idx["phase"].tolist() == phases


def test_optimizer_updates_link_to_the_parameters(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.ones(1, 2)

    def run() -> None:
        model(x).sum().backward()
        opt.step()
        model(x).sum()

    _, execs, _ = record(tmp_path, run)
    first_t, second_t = [e for e in execs if e.op_type == "aten.t.default" and e.phase == 1]
    (update,) = [e for e in execs if e.phase == 3 and e.op_type == "aten.add_.Tensor"]
    weight_id = first_t.input_tensor_ids[0]
    assert update.input_tensor_ids[0] == weight_id
    assert second_t.input_tensor_ids[0] == update.output_tensor_ids[0] != weight_id
    assert update.step == 0 and second_t.step == 1


def test_backward_on_the_enabling_thread_is_recorded(tmp_path: Path) -> None:
    """Enable on this thread, call backward() on it: the engine carries the mode."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)

    def run() -> None:
        torch.log(x).sum().backward()
        torch.autograd.grad(torch.exp(x).sum(), x)

    _, execs, _ = record(tmp_path, run)
    back = [e.op_type for e in execs if e.phase == 2]
    assert "aten.div.Tensor" in back and "aten.mul.Tensor" in back


def test_training_loop_on_a_worker_thread_is_recorded(tmp_path: Path) -> None:
    """The documented way: enable, train and disable on the thread that runs the loop."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            with nanscope.enable_dump_debug_info(tmp_path, circular_buffer_size=-1):
                torch.log(x).sum().backward()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=loop)
    t.start()
    t.join()
    assert not errors
    execs = nanscope.open_dump(tmp_path).executions()
    (div,) = [e for e in execs if e.op_type == "aten.div.Tensor"]
    assert div.phase == 2 and div.forward_sequence == by_op(execs, "aten.log.default").sequence
    torch.log(x)  # the main thread never had the mode
    assert nanscope.open_dump(tmp_path).num_executions() == len(execs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (engine device threads)")
def test_backward_on_the_engines_device_thread_is_recorded(tmp_path: Path) -> None:
    """On CUDA the engine runs backward on its own device thread; the mode goes with it."""
    x = torch.tensor(X_VALUES, device="cuda", requires_grad=True)

    def run() -> Any:
        y = torch.log(x)  # @cuda-log
        y.sum().backward()
        return y.detach().cpu()

    r, execs, y = record(tmp_path, run)
    log = by_op(execs, "aten.log.default")
    check_outputs(log, [y], "FULL_HEALTH")
    (div,) = [e for e in execs if e.op_type == "aten.div.Tensor"]
    assert div.phase == 2 and div.forward_sequence == log.sequence
    assert frame_lines(r, div.forward_stack_frame_ids)[-1] == line_of("@cuda-log")


def test_backward_called_from_a_thread_started_later_is_recorded(tmp_path: Path) -> None:
    """Dispatch modes are per thread; threads started after enabling get the mode too."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)

    def run() -> None:
        loss = torch.log(x).sum()
        t = threading.Thread(target=loss.backward)
        t.start()
        t.join()

    _, execs, _ = record(tmp_path, run)
    assert x.grad is not None  # the backward pass did run
    assert [e.op_type for e in execs][:2] == ["aten.log.default", "aten.sum.default"]
    backward = [e for e in execs if e.phase == 2]
    assert any(e.op_type == "aten.div.Tensor" for e in backward)
    log = by_op(execs, "aten.log.default")
    assert any(e.forward_sequence == log.sequence for e in backward)


def test_threads_running_before_enabling(tmp_path: Path) -> None:
    """The native recorder sees every thread; the Python dispatch mode (a documented
    limit) only those started after recording began, and the caller's."""
    started, go, done = threading.Event(), threading.Event(), threading.Event()

    def worker() -> None:
        started.set()
        go.wait(10)
        torch.exp(torch.ones(2))
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)

    def run() -> None:
        go.set()
        done.wait(10)

    _, execs, _ = record(tmp_path, run)
    t.join()
    recorded = "aten.exp.default" in [e.op_type for e in execs]
    assert recorded == (torch_recorder() == "native")


# -- the circular buffer ----------------------------------------------------------------------


def test_circular_buffer_keeps_the_first_nonfinite_op(tmp_path: Path) -> None:
    def run() -> None:
        x = torch.ones(4)
        for _ in range(30):
            x = x + 1
        torch.log(x - x)  # the -inf
        for _ in range(400):
            x = x * 1.0

    r, execs, _ = record(tmp_path, run, circular_buffer_size=20)
    total = 1 + 30 + 2 + 400
    assert len(execs) < total
    # The newest events are there ...
    assert execs[-1].sequence == total
    assert [e.sequence for e in execs[-20:]] == list(range(total - 19, total + 1))
    # ... and so is the first Inf, long after it left the buffer.
    ref = r.first_nonfinite(EXECUTIONS)
    assert ref is not None
    bad = r.execution(ref.index)
    assert bad.op_type == "aten.log.default" and bad.sequence == 33
    assert bad.health.neg_inf == 4
    (inp,) = bad.input_debug_tensor_values
    assert inp is not None and inp[9] == 4  # all zeros went in
    sequences = [e.sequence for e in execs]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


def test_everything_is_kept_with_a_negative_buffer_size(tmp_path: Path) -> None:
    def run() -> None:
        x = torch.ones(2)
        for _ in range(1500):
            x = x + 1

    _, execs, _ = record(tmp_path, run, circular_buffer_size=-1)
    assert [e.sequence for e in execs] == list(range(1, 1502))


# -- no effect on the program -----------------------------------------------------------------


def _train_mlp(steps: int = 5) -> tuple[list[float], list[Any]]:
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5), torch.nn.LogSoftmax(1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data, labels = torch.randn(16, 20), torch.randint(0, 5, (16,))
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.nll_loss(model(data), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "FULL_TENSOR", "SHAPE"])
def test_results_are_unchanged_by_recording(tmp_path: Path, mode: str) -> None:
    plain_losses, plain_params = _train_mlp()
    _, execs, (losses, params) = record(tmp_path, _train_mlp, mode)
    assert losses == plain_losses
    for a, b in zip(params, plain_params, strict=True):
        assert torch.equal(a, b)
    assert len(execs) > 100 and {e.phase for e in execs} == {1, 2, 3}
    assert {e.step for e in execs} == set(range(6))


def test_inference_mode_tensors_are_recorded(tmp_path: Path) -> None:
    """Inference tensors have no version counter: their views are summarised afresh."""

    def run() -> Any:
        with torch.inference_mode():
            x = torch.tensor([[1.0, 0.0], [float("nan"), 2.0]]) * 1
            return x.t()

    _, execs, t = record(tmp_path, run)
    check_outputs(execs[-1], [t], "FULL_HEALTH")
    assert execs[-1].health.nan == 1
