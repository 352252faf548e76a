"""The one-line explanations: each case cites its evidence (which input, what count, the
dtype's limit).

The catalogue builds each situation with real torch tensors, runs the real op, counts
the result's non-finite values with torch itself, and feeds those counts to ``explain``
the way the recorder records them (the tensors in order, a list argument's one by one,
then the Python numbers; an input that the op wrote in place is unknown: ``None``).
The other tests use hand-made counts and need no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from nanscope.analysis._explain import born_from_output, explain, op_family
from nanscope.format.health import Health

if TYPE_CHECKING:
    import torch


def counts(
    size: int, *, neg_inf: int = 0, pos_inf: int = 0, nan: int = 0, neg: int = 0,
    zero: int = 0, dtype: str = "float32",
) -> Health:  # fmt: skip
    """A FULL_HEALTH summary with these counts (the rest positive)."""
    pos = size - neg_inf - pos_inf - nan - neg - zero
    bad = neg_inf + pos_inf + nan > 0
    return Health(size, neg_inf, pos_inf, nan, neg, zero, pos, bad, dtype)


# -- the catalogue, against torch -------------------------------------------------------------


def health(t: torch.Tensor | list[torch.Tensor]) -> Health:
    """What FULL_HEALTH records for a tensor, counted by torch itself."""
    import torch

    if isinstance(t, list):
        t = torch.cat([x.flatten() for x in t])
    finite = torch.isfinite(t)
    return Health(
        size=t.numel(),
        neg_inf=int((t == -float("inf")).sum()),
        pos_inf=int((t == float("inf")).sum()),
        nan=int(torch.isnan(t).sum()),
        neg=int(((t < 0) & finite).sum()),
        zero=int((t == 0).sum()),
        pos=int(((t > 0) & finite).sum()),
        any_nonfinite=bool((~finite).any()),
        dtype=str(t.dtype).removeprefix("torch."),
    )


def number(value: float) -> Health:
    """A Python number argument, as the recorder summarises it (a float64 scalar)."""
    import torch

    return health(torch.tensor(value, dtype=torch.float64))


def aten(name: str) -> Any:
    """``aten.addcdiv_.default`` -> the op itself (so the names are the recorded ones)."""
    import torch

    _, op, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, op), overload)


def outputs(result: Any) -> Health:
    """The health of an op's outputs together (the event's counts)."""
    import torch

    if isinstance(result, torch.Tensor):
        return health(result)
    return health([r for r in result if isinstance(r, torch.Tensor)])


@pytest.fixture
def tt() -> Any:
    """torch (the catalogue is skipped without it)."""
    return pytest.importorskip("torch")


@pytest.mark.torch
class TestCatalogue:
    """Each case run in torch: the explanation names the op, the input, the cause, the limit."""

    def test_addcdiv_adamw_eps_rounds_to_zero_in_float16(self, tt: Any) -> None:
        f16 = tt.float16
        assert tt.tensor([1e-8], dtype=f16).item() == 0  # AdamW's eps is 0 in float16
        param = tt.ones(4, dtype=f16)
        exp_avg = tt.tensor([0.0, 1e-3, 1e-3, 1.0], dtype=f16)
        exp_avg_sq = tt.tensor([0.0, 0.0, 1e-2, 1.0], dtype=f16)  # underflowed to 0
        denom = exp_avg_sq.sqrt().add_(1e-8)
        op = "aten.addcdiv_.default"
        out = aten(op)(param, exp_avg, denom, value=-1e-3)
        o = health(out)
        assert (o.nan, o.neg_inf, o.pos_inf) == (1, 1, 0)  # 0/0 and -1e-3 * 1e-3 / 0
        text = explain(op, o, [None, health(exp_avg), health(denom)])  # self: written in place
        assert text.startswith("x/0 and 0/0 in addcdiv_: the divisor (input 2) had 2 zeros")
        assert "the numerator (input 1) 1 zero" in text
        assert "float16 an eps below 5.96e-8" in text and "AdamW's eps=1e-8" in text

    def test_addcdiv_x_over_zero(self, tt: Any) -> None:
        t2 = tt.tensor([0.0, 2.0, 0.0])
        t1 = tt.tensor([1.0, 1.0, 1.0])
        op = "aten.addcdiv_.default"
        out = aten(op)(tt.zeros(3), t1, t2)
        text = explain(op, health(out), [None, health(t1), health(t2)])
        assert text == "x/0 in addcdiv_: the divisor (input 2) had 2 zeros"

    def test_addcdiv_bfloat16_notes_its_smallest_value(self, tt: Any) -> None:
        t2 = tt.tensor([1e-41, 1.0], dtype=tt.bfloat16)  # below bfloat16's smallest: 0
        t1 = tt.ones(2, dtype=tt.bfloat16)
        op = "aten.addcdiv.default"
        out = aten(op)(tt.zeros(2, dtype=tt.bfloat16), t1, t2)
        text = explain(op, health(out), [health(tt.zeros(2)), health(t1), health(t2)])
        assert "x/0 in addcdiv: the divisor (input 2) had 1 zero" in text
        assert "bfloat16 an eps below 9.2e-41" in text and "AdamW" not in text

    def test_foreach_addcdiv_names_the_divisor_list(self, tt: Any) -> None:
        params = [tt.ones(2), tt.ones(3)]
        t1s = [tt.ones(2), tt.ones(3)]
        t2s = [tt.tensor([0.0, 1.0]), tt.tensor([0.0, 0.0, 1.0])]
        op = "aten._foreach_addcdiv.ScalarList"
        out = aten(op)(params, t1s, t2s, [1.0, 1.0])
        ins = [health(t) for t in (*params, *t1s, *t2s)]
        text = explain(op, outputs(out), ins)
        assert text == "x/0 in _foreach_addcdiv: the divisors (list 2) had 3 zeros"

    def test_div_names_the_divisor(self, tt: Any) -> None:
        a, b = tt.tensor([1.0, -2.0, 3.0]), tt.tensor([0.0, 0.0, 1.0])
        out = a / b
        text = explain("aten.div.Tensor", health(out), [health(a), health(b)])
        assert text == "x/0 in div: the divisor (input 1) had 2 zeros"

    def test_div_zero_over_zero_cites_both_inputs(self, tt: Any) -> None:
        a, b = tt.tensor([0.0, 0.0, 3.0]), tt.tensor([0.0, 0.0, 1.0])
        out = a / b
        text = explain("aten.div.Tensor", health(out), [health(a), health(b)])
        assert text.startswith("0/0 in div: zeros divided by zeros")
        assert "the divisor (input 1) had 2 zeros, the numerator (input 0) 2 zeros" in text

    def test_div_by_a_python_zero(self, tt: Any) -> None:
        a = tt.tensor([1.0, 2.0])
        out = aten("aten.div.Scalar")(a, 0.0)
        text = explain("aten.div.Scalar", health(out), [health(a), number(0.0)])
        assert text == "x/0 in div: the divisor (input 1) had 1 zero"

    def test_div_in_float16_notes_an_eps_rounding_to_zero(self, tt: Any) -> None:
        a = tt.ones(2, dtype=tt.float16)
        b = tt.zeros(2, dtype=tt.float16) + 1e-8
        out = a / b
        text = explain("aten.div.Tensor", health(out), [health(a), health(b)])
        assert text.startswith("x/0 in div: the divisor (input 1) had 2 zeros")
        assert "float16 an eps below 5.96e-8 (the smallest float16) rounds to 0" in text

    def test_reciprocal_divides_by_its_only_input(self, tt: Any) -> None:
        x = tt.tensor([0.0, 4.0])
        out = tt.reciprocal(x)
        text = explain("aten.reciprocal.default", health(out), [health(x)])
        assert text == "x/0 in reciprocal: the divisor (input 0) had 1 zero"

    def test_div_overflow_without_zeros(self, tt: Any) -> None:
        a, b = tt.tensor([1e30]), tt.tensor([1e-30])
        out = a / b
        assert health(b).zero == 0 and health(out).pos_inf == 1
        text = explain("aten.div.Tensor", health(out), [health(a), health(b)])
        assert text.startswith("overflow in div: the inputs were finite and the divisor (input 1)")
        assert "had no zeros" in text and "the largest float32 (3.4e38)" in text

    def test_addcmul_overflow_in_float16(self, tt: Any) -> None:
        v = tt.zeros(2, dtype=tt.float16)
        g = tt.tensor([300.0, 1.0], dtype=tt.float16)
        op = "aten.addcmul_.default"
        out = aten(op)(v, g, g)  # 300 * 300 = 90000 > 65504
        text = explain(op, health(out), [None, health(g), health(g)])
        assert text == (
            "overflow in addcmul_: the recorded inputs were finite, but "
            "self + value * tensor1 * tensor2 exceeds the largest float16 (65504)"
        )

    def test_pow_overflow(self, tt: Any) -> None:
        x = tt.tensor([1e20, 3.0])
        out = x**2
        text = explain("aten.pow.Tensor_Scalar", health(out), [health(x), number(2.0)])
        assert text == (
            "overflow in pow: the inputs were finite, but the result exceeds the largest "
            "float32 (3.4e38)"
        )

    def test_pow_of_zero_to_a_negative_power(self, tt: Any) -> None:
        x = tt.tensor([0.0, 2.0])
        out = x**-1.0
        text = explain("aten.pow.Tensor_Scalar", health(out), [health(x), number(-1.0)])
        assert text == (
            "0 to a negative power in pow: the base (input 0) had 1 zero, "
            "the exponent (input 1) is negative"
        )

    def test_pow_of_a_negative_to_a_fraction(self, tt: Any) -> None:
        x = tt.tensor([-2.0, 2.0])
        out = x**0.5
        text = explain("aten.pow.Tensor_Scalar", health(out), [health(x), number(0.5)])
        assert text == (
            "a negative number to a fractional power in pow gives NaN: "
            "the base (input 0) had 1 negative value"
        )

    @pytest.mark.parametrize(
        ("dtype", "value", "limit", "above"),
        [
            ("float32", 89.0, "float32 (3.4e38)", "88.7"),
            ("float16", 12.0, "float16 (65504)", "11.1"),
        ],
    )
    def test_exp_overflow(self, tt: Any, dtype: str, value: float, limit: str, above: str) -> None:
        x = tt.tensor([value, 0.0], dtype=getattr(tt, dtype))
        out = tt.exp(x)
        text = explain("aten.exp.default", health(out), [health(x)])
        assert text == (
            f"overflow in exp: the input was finite, but exp(x) exceeds the largest {limit} "
            f"for x above {above}"
        )

    def test_vector_norm_sum_of_squares_overflows_float32(self, tt: Any) -> None:
        x = tt.full((4,), 1e19)  # the norm, 2e19, fits; its sum of squares, 4e38, does not
        out = tt.linalg.vector_norm(x)
        op = "aten.linalg_vector_norm.default"
        text = explain(op, health(out), [health(x), number(2.0)])
        assert text == (
            "overflow in linalg_vector_norm: the inputs were finite, but the norm's sum of "
            "squares exceeds the largest float32 (3.4e38), as it does for a norm above 1.8e19"
        )

    def test_norm_in_bfloat16(self, tt: Any) -> None:
        x = tt.full((4,), 2e19, dtype=tt.bfloat16)
        out = aten("aten.norm.Scalar")(x, 2)
        text = explain("aten.norm.Scalar", health(out), [health(x), number(2.0)])
        assert "overflow in norm:" in text and "sum of squares" in text
        assert "the largest bfloat16 (3.39e38)" in text

    def test_norm_in_float16_overflows_the_norm_itself(self, tt: Any) -> None:
        ok = tt.full((4,), 300.0, dtype=tt.float16)
        assert tt.isfinite(tt.linalg.vector_norm(ok))  # float16 norms accumulate in float32
        x = tt.full((4,), 40000.0, dtype=tt.float16)
        out = tt.linalg.vector_norm(x)
        text = explain("aten.linalg_vector_norm.default", health(out), [health(x)])
        assert text == (
            "overflow in linalg_vector_norm: the input was finite, but the norm exceeds "
            "the largest float16 (65504)"
        )

    def test_foreach_norm(self, tt: Any) -> None:
        grads = [tt.full((4,), 1e19), tt.ones(3)]
        op = "aten._foreach_norm.Scalar"
        out = aten(op)(grads, 2.0)
        text = explain(op, outputs(out), [health(g) for g in grads] + [number(2.0)])
        assert text.startswith("overflow in _foreach_norm: the inputs were finite, but the norm's")
        assert "the largest float32 (3.4e38)" in text

    def test_layer_norm_zero_variance_with_eps_zero(self, tt: Any) -> None:
        x = tt.ones(2, 4)
        op = "aten.native_layer_norm.default"
        out = aten(op)(x, [4], None, None, 0.0)
        o = outputs(out)
        assert o.nan == 8 and o.pos_inf == 2  # the result NaN, rstd +inf
        text = explain(op, o, [health(x), number(0.0)])
        assert text.startswith("native_layer_norm with eps=0 (input 1): a row whose values")
        assert "variance 0" in text and "rstd = 1/sqrt(var + eps) = inf" in text
        assert "0 * inf = NaN" in text

    def test_layer_norm_all_zero_input_says_so(self, tt: Any) -> None:
        x = tt.zeros(1, 4)
        w = tt.ones(4)
        op = "aten.native_layer_norm.default"
        out = aten(op)(x, [4], w, None, 0.0)
        text = explain(op, outputs(out), [health(x), health(w), number(0.0)])
        assert "eps=0 (input 2)" in text and "(the input's 4 values were all 0)" in text

    def test_layer_norm_row_overflow(self, tt: Any) -> None:
        x = tt.tensor([[3e38, 3e38, 3e38, -3e38]])
        op = "aten.native_layer_norm.default"
        out = aten(op)(x, [4], None, None, 1e-5)
        o = outputs(out)
        assert o.nan and not o.pos_inf
        text = explain(op, o, [health(x), number(1e-5)])
        assert text == (
            "overflow in native_layer_norm: the inputs were finite, but a row's mean or "
            "variance exceeds the largest float32 (3.4e38), which makes NaN"
        )

    def test_layer_norm_weight_overflows_float16(self, tt: Any) -> None:
        x = tt.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=tt.float16)
        w = tt.full((4,), 60000.0, dtype=tt.float16)
        op = "aten.native_layer_norm.default"
        out = aten(op)(x, [4], w, None, 1e-5)
        text = explain(op, outputs(out), [health(x), health(w), number(1e-5)])
        assert text.startswith("overflow in native_layer_norm: the inputs were finite")
        assert "times the weight" in text and "the largest float16 (65504)" in text

    def test_layer_norm_backward_overflows_float16(self, tt: Any) -> None:
        f16 = tt.float16
        x = tt.tensor([[0.0, 0.0, 0.0, 1e-3]], dtype=f16)  # near-equal values: rstd ~ 313
        _, mean, rstd = aten("aten.native_layer_norm.default")(x, [4], None, None, 1e-5)
        g = tt.tensor([[500.0, -500.0, 300.0, 0.0]], dtype=f16)
        w, b = tt.ones(4, dtype=f16), tt.zeros(4, dtype=f16)
        op = "aten.native_layer_norm_backward.default"
        out = aten(op)(g, x, [4], mean, rstd, w, b, [True, True, True])
        o = outputs(out)
        assert o.pos_inf and not o.nan
        ins = [health(t) for t in (g, x, mean, rstd, w, b)]
        text = explain(op, o, ins)
        assert text.startswith(
            "overflow in native_layer_norm_backward: the inputs were finite, but a gradient "
            "exceeds the largest float16 (65504)"
        )
        assert "rstd (input 3)" in text

    @pytest.mark.parametrize(
        ("source", "value", "target", "expected"),
        [
            ("float32", 70000.0, "float16", "values above 65504 became inf"),
            ("float32", -70000.0, "float16", "values below -65504 became -inf"),
            ("float32", 3.4e38, "bfloat16", "values above 3.39e38 became inf"),
            ("float64", 1e39, "float32", "values above 3.4e38 became inf"),
        ],
    )
    def test_cast_overflow(
        self, tt: Any, source: str, value: float, target: str, expected: str
    ) -> None:
        x = tt.tensor([value, 1.0], dtype=getattr(tt, source))
        op = "aten._to_copy.default"
        out = aten(op)(x, dtype=getattr(tt, target))
        text = explain(op, health(out), [health(x)])
        assert text == f"a cast to {target} overflowed: {expected} (input 0 was {source}, finite)"

    def test_copy_into_float16_names_the_source(self, tt: Any) -> None:
        dst = tt.zeros(2, dtype=tt.float16)
        src = tt.tensor([1e5, -1e5])
        out = aten("aten.copy_.default")(dst, src)
        text = explain("aten.copy_.default", health(out), [None, health(src)])
        assert text == (
            "a cast to float16 overflowed: values beyond ±65504 became ±inf "
            "(input 1 was float32, finite)"
        )

    def test_sqrt_of_negatives(self, tt: Any) -> None:
        x = tt.tensor([-1.0, -4.0, 9.0])
        out = tt.sqrt(x)
        text = explain("aten.sqrt.default", health(out), [health(x)])
        assert text == "sqrt of a negative number: the input had 2 negative values"

    def test_foreach_sqrt(self, tt: Any) -> None:
        xs = [tt.tensor([-1.0, 4.0]), tt.tensor([9.0])]
        op = "aten._foreach_sqrt.default"
        out = aten(op)(xs)
        text = explain(op, outputs(out), [health(x) for x in xs])
        assert text == "sqrt of a negative number: the input had 1 negative value"

    def test_matmul_partial_sums_cancel_into_nan(self, tt: Any) -> None:
        a, b = tt.tensor([[1e20, -1e20]]), tt.tensor([[1e20], [1e20]])
        # 1e40 - 1e40: inf - inf. Whether a kernel's partial sums meet as +inf and -inf
        # depends on how it blocks and accumulates: one that accumulates in order with
        # fused multiply-adds returns +inf here (PyTorch's AVX-512 CPU kernel does), so the
        # NaN is what a cancelling kernel returns, made here rather than asked of this one.
        assert tt.mm(a, b).isinf().all() or tt.mm(a, b).isnan().all()
        out = tt.full((1, 1), float("nan"))
        text = explain("aten.mm.default", health(out), [health(a), health(b)])
        assert text == (
            "overflow in matmul: the inputs were finite, but products or partial sums exceeded "
            "the largest float32 (3.4e38), and +inf and -inf cancelled into NaN"
        )

    def test_matmul_overflow_in_float16(self, tt: Any) -> None:
        x = tt.full((4, 64), 40.0, dtype=tt.float16)
        w = tt.full((64, 8), 30.0, dtype=tt.float16)
        out = tt.mm(x, w)
        text = explain("aten.mm.default", health(out), [health(x), health(w)])
        assert "overflow in matmul" in text and "the largest float16 (65504)" in text

    def test_softmax_of_plus_inf(self, tt: Any) -> None:
        x = tt.tensor([1.0, float("inf")])
        out = tt.softmax(x, 0)
        text = explain("aten._softmax.default", health(out), [health(x)])
        assert text.startswith("softmax of a row holding +inf gives NaN")


# -- hand-made counts ------------------------------------------------------------------------


def test_op_family_takes_in_place_and_foreach_variants() -> None:
    assert op_family("aten.addcdiv_.default") == "addcdiv"
    assert op_family("aten._foreach_addcdiv_.ScalarList") == "addcdiv"
    assert op_family("aten._foreach_norm.Scalar") == "norm"
    assert op_family("aten.linalg_vector_norm.default") == "norm"
    assert op_family("aten._foreach_sqrt.default") == "sqrt"
    assert op_family("aten.native_layer_norm_backward.default") == "layer_norm_backward"
    assert op_family("aten._to_copy.default") == "cast"
    assert op_family("RealDiv") == "div"
    assert op_family("aten.log.default") == "log"
    assert op_family("aten.some_new_op.default") == "some_new_op"


def test_foreach_addcdiv_in_place_with_a_tensor_of_scalars() -> None:
    # _foreach_addcdiv_.Tensor: three lists of 2, then the scalars' tensor.
    f16 = "float16"
    ins: list[Health | None] = [None, None]  # self: written in place
    ins += [counts(4, dtype=f16), counts(4, zero=1, dtype=f16)]
    ins += [counts(4, zero=2, dtype=f16), counts(4, zero=1, dtype=f16)]
    ins += [counts(2)]
    out = counts(8, nan=1, pos_inf=2, dtype=f16)
    text = explain("aten._foreach_addcdiv_.Tensor", out, ins)
    assert text.startswith("x/0 and 0/0 in _foreach_addcdiv_: the divisors (list 2) had 3 zeros")
    assert "the numerators (list 1) 1 zero" in text and "AdamW's eps=1e-8" in text


def test_inputs_not_recorded_say_what_the_output_proves() -> None:
    f16_inf = counts(4, pos_inf=1, dtype="float16")
    text = explain("aten.addcdiv_.default", counts(4, nan=1, dtype="float16"), [None] * 3)
    assert text.startswith(
        "division by zero in addcdiv_, most likely: a zero in the divisor (input 2)"
    )
    assert "not recorded" in text and "5.96e-8" in text
    assert explain("aten._to_copy.default", f16_inf, [None]) == (
        "a cast to float16 overflowing, most likely "
        "(values above 65504 became inf; the input's values were not recorded)"
    )
    assert explain("aten.exp.default", counts(4, pos_inf=1), [None]) == (
        "exp produced +inf; the inputs' values were not recorded"
    )
    assert explain("aten.log.default", counts(4, neg_inf=1), [None]).startswith("log of zero")
    assert explain("aten.div.Tensor", counts(4, pos_inf=1), [None, None]).startswith(
        "division by zero, most likely"
    )
    assert explain("aten.exp.default", Health(any_nonfinite=True), [None]) == (
        "exp produced Inf or NaN; this dump's mode records no counts"
    )


def test_unrecorded_counts_count_as_unknown() -> None:
    # CONCISE_HEALTH inputs: counts of Inf/NaN but no zeros, no dtype.
    concise = Health(size=4, neg_inf=0, pos_inf=0, nan=0, any_nonfinite=False)
    text = explain("aten._to_copy.default", Health(4, 0, 1, 0, any_nonfinite=True), [concise])
    assert (
        text
        == "a cast to a narrower type overflowed: finite values became +inf (input 0 was finite)"
    )
    no_counts = Health(any_nonfinite=False)  # CURT_HEALTH: not counted at all
    text = explain("aten.linalg_vector_norm.default", counts(1, pos_inf=1), [no_counts])
    assert text == "norm produced +inf; the inputs' values were not recorded"


def test_layer_norm_eps_zero_needs_no_tensor_values() -> None:
    # On an accelerator only the Python numbers are summarised: here the eps.
    out = counts(10, nan=8, pos_inf=2)
    text = explain(
        "aten.native_layer_norm.default", out, [None, None, counts(1, zero=1, dtype="float64")]
    )
    assert text.startswith("native_layer_norm with eps=0 (input 2)")


def test_an_infinite_input_is_carried_not_explained_as_a_cause() -> None:
    out = counts(4, pos_inf=1, dtype="float16")
    divisor = counts(4, pos_inf=1, dtype="float16")
    text = explain("aten.addcdiv_.default", out, [None, counts(4, dtype="float16"), divisor])
    assert text == "+inf came in through an input (produced earlier)"
    assert "already in an input" in explain("aten.exp.default", out, [divisor], external=True)


def test_the_established_wordings_stay() -> None:
    """What the end-to-end cases (tests/cases) assert, on hand-made counts."""
    assert explain("aten.log.default", counts(4, neg_inf=1), [counts(4, zero=1)]) == (
        "log of zero: the input had 1 zero"
    )
    assert "log of a negative number" in explain(
        "aten.log.default", counts(4, nan=2), [counts(4, neg=2)]
    )
    assert "0 * inf" in explain(
        "aten.mul.Tensor", counts(4, nan=1), [counts(4, pos_inf=1), counts(4, zero=1)]
    )
    assert "inf - inf" in explain(
        "aten.sub.Tensor", counts(1, nan=1), [counts(1, pos_inf=1), counts(1, pos_inf=1)]
    )
    assert "rsqrt of zero" in explain(
        "aten.rsqrt.default", counts(2, pos_inf=1), [counts(2, zero=1)]
    )
    assert "softmax of a row that is entirely -inf" in explain(
        "aten._softmax.default", counts(4, nan=4), [counts(4, neg_inf=4)]
    )
    # An in-place division: the numerator was overwritten, NaN over zeros is 0/0.
    text = explain("aten.div_.Tensor", counts(4, nan=2), [None, counts(4, zero=2)])
    assert text == "0/0 in div_: zeros divided by zeros; the divisor (input 1) had 2 zeros"
    assert "x/0" in explain("RealDiv", counts(2, pos_inf=1), [counts(2), counts(2, zero=1)])
    assert "overflow in exp" in explain("aten.exp.default", counts(1, pos_inf=1), [counts(1)])
    assert "masked_fill wrote -inf" in explain(
        "aten.masked_fill.Scalar", counts(4, neg_inf=2), [counts(4), counts(4), counts(1)]
    )


def test_a_value_written_by_a_fill_op_is_a_mask_not_a_carried_input() -> None:
    minus_inf = counts(1, neg_inf=1, dtype="float64")  # the Python number -inf
    assert explain("aten.scalar_tensor.default", counts(1, neg_inf=1), [minus_inf]) == (
        "scalar_tensor wrote -inf given as a value (an intentional mask?)"
    )
    mask = counts(6, dtype="bool")
    text = explain("aten.masked_fill.Scalar", counts(6, neg_inf=2), [counts(6), mask, minus_inf])
    assert text == "masked_fill wrote -inf given as a value (an intentional mask?)"
    # A NaN already in the tensor being filled came in through it.
    text = explain("aten.masked_fill.Scalar", counts(6, nan=1), [counts(6, nan=1), mask, counts(1)])
    assert text == "NaN came in through an input (produced earlier)"


def test_born_from_output_is_log_of_zero_only() -> None:
    assert born_from_output("aten.log.default", counts(4, neg_inf=1))
    assert not born_from_output("aten.log.default", counts(4, neg_inf=1, nan=1))
    assert not born_from_output("aten.exp.default", counts(4, pos_inf=1))
