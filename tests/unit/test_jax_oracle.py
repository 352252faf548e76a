"""The JAX oracle's own tests: it computes what JAX computes, and finds the known first Inf/NaN
of every buggy program in tests/jax_programs.py (the primitive, the marked line, the pass and
the loop iteration)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

import jax
import jax.numpy as jnp
import ml_dtypes
from jax import lax

from tests import jax_oracle as oracle
from tests import jax_programs as programs


@functools.cache
def _training(name: str) -> programs.Training:
    return programs.PROGRAMS[name].build(steps=1)


def _assert_close(got: list[np.ndarray], want: Any, rtol: float = 1e-4) -> None:
    leaves = jax.tree_util.tree_leaves(want)
    assert len(got) == len(leaves)
    for i, (g, w) in enumerate(zip(got, leaves, strict=True)):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"output {i}"
        # Absolute tolerance relative to the leaf's scale: sums of many float32 products
        # (matmuls, reductions) are added up in another order than XLA's.
        atol = 1e-6 * max(1.0, float(np.max(np.abs(w)))) if w.size else 0.0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"output {i}")


def _assert_event(event: oracle.Event | None, birth: programs.Birth | None) -> None:
    if birth is None:
        assert event is None
        return
    assert event is not None
    got = (event.primitive, event.file, event.line, event.kind, event.backward)
    want = (birth.primitive, programs.FILE, birth.line, birth.kind, birth.backward)
    assert got == want, f"{event.name_stack}: {event.counts}"
    assert (event.loop, event.iteration) == (birth.loop, birth.iteration)
    counts = event.counts
    assert counts.nonfinite > 0
    assert (
        sum(
            (
                counts.neg_inf,
                counts.pos_inf,
                counts.nan,
                counts.negative,
                counts.zero,
                counts.positive,
            )
        )
        == counts.size
        == int(np.prod(event.shape))
    )


# -- The programs ------------------------------------------------------------------------------

BUGGY = [name for name, p in programs.PROGRAMS.items() if not p.healthy]


@pytest.mark.parametrize("name", sorted(programs.PROGRAMS))
def test_first_inf_and_nan_of_each_program(name: str) -> None:
    expected = programs.PROGRAMS[name].expected
    training = _training(name)
    result = oracle.evaluate(training.train_step, *training.first_call())
    assert result.fallbacks == []  # the programs' primitives all have NumPy rules
    assert bool(result.nonfinite_inputs) == (name == "mlp_nan_input")
    if expected is None:
        assert result.first is None and result.first_nan is None
        return
    _assert_event(result.first, expected.first)
    _assert_event(result.first_nan, expected.first_nan)
    # first_inf is the first holding an infinity: first itself, or later than it
    if result.first_inf is not None:
        assert result.first_inf.index >= result.first.index  # type: ignore[union-attr]
        assert result.first_inf.counts.neg_inf + result.first_inf.counts.pos_inf > 0


def test_the_nan_input_is_reported_as_an_input() -> None:
    training = _training("mlp_nan_input")
    args = training.first_call()
    result = oracle.evaluate(training.train_step, *args)
    flat = jax.tree_util.tree_leaves(args)
    assert len(result.nonfinite_inputs) == 1
    bad = np.asarray(flat[result.nonfinite_inputs[0]])
    assert bad.shape == (32, 784) and np.isnan(bad).sum() == 1
    # the matmul reading it was not where a NaN was born: its input already held one, and
    # every later NaN descends from it
    assert result.first is not None and not result.first.inputs_finite
    assert result.births == []


@pytest.mark.parametrize("name", ["scan_nan_at_3", "while_nan_at_3", "custom_vjp_bwd"])
def test_the_jitted_step_gives_the_same_first_event(name: str) -> None:
    """Under jax.jit the step is one `jit` equation; the oracle goes inside it."""
    training = _training(name)
    plain = oracle.evaluate(training.train_step, *training.first_call())
    jitted = oracle.evaluate(jax.jit(training.train_step), *training.first_call())
    assert plain.first is not None and jitted.first is not None
    assert jitted.first.primitive == plain.first.primitive
    assert jitted.first.line == plain.first.line
    assert jitted.first.loops == plain.first.loops
    assert jitted.first.counts == plain.first.counts


@pytest.mark.parametrize("name", ["mlp", "scan_nan_at_3", "while_nan_at_3", "custom_vjp_fwd"])
def test_a_training_step_evaluates_like_jax(name: str) -> None:
    training = _training(name)
    args = training.first_call()
    result = oracle.evaluate(training.train_step, *args)
    _assert_close(result.outputs, jax.jit(training.train_step)(*args))


def test_the_transformer_loss_and_gradients_evaluate_like_jax() -> None:
    # (Not the whole step: AdamW's first update is about lr * sign(gradient), so gradients
    # within rounding of 0 make updates differ by up to 2 lr.)
    training = _training("transformer")
    params, _, tokens = training.first_call()
    fn = jax.value_and_grad(programs.lm_loss)
    result = oracle.evaluate(fn, params, tokens)
    _assert_close(result.outputs, jax.jit(fn)(params, tokens), rtol=1e-3)
    assert result.first is not None and result.first.kind == "-inf"  # the mask
    assert result.first_nan is None


@pytest.mark.parametrize(
    ("name", "predict"),
    [("mlp", programs.mlp_predict), ("custom_vjp_fwd", programs.prototype_predict)],
)
def test_forward_passes_go_into_custom_jvp_and_custom_vjp_calls(
    name: str, predict: Callable[..., Any]
) -> None:
    training = _training(name)
    params, _, x, _ = training.first_call()
    closed = jax.make_jaxpr(predict)(params, x)
    names = {eqn.primitive.name for eqn in closed.jaxpr.eqns}
    assert {"custom_jvp_call", "custom_vjp_call"} & names
    result = oracle.evaluate_jaxpr(closed, jax.tree_util.tree_leaves((params, x)))
    _assert_close(result.outputs, jax.jit(predict)(params, x))
    if name == "custom_vjp_fwd":
        # the primal function runs the forward rule's code: the same line
        assert result.first is not None
        assert (result.first.primitive, result.first.line) == (
            "div",
            programs.line_of("custom_vjp.fwd"),
        )


def test_evaluate_calls_stops_at_the_first_call_with_inf_or_nan() -> None:
    calls = [(np.array([1.0, 2.0], np.float32),), (np.array([0.0, 2.0], np.float32),)] * 2
    results = oracle.evaluate_calls(jnp.log, calls)
    assert len(results) == 2  # the second call: log(0)
    assert results[0].first is None and results[1].first is not None
    assert len(oracle.evaluate_calls(jnp.log, calls, stop_at_first=False)) == 4


# -- Semantics, on small functions ---------------------------------------------------------------


def test_counts_are_full_healths_with_finite_signs() -> None:
    result = oracle.evaluate(jnp.log, np.array([-1.0, 0.0, 1.0, 2.0, np.inf], np.float32))
    assert result.first is not None
    assert result.first.counts == oracle.Counts(
        size=5, neg_inf=1, pos_inf=1, nan=1, negative=0, zero=1, positive=1
    )
    assert result.first.inputs_finite is False  # the input held +inf
    assert result.nonfinite_inputs == [0]


def test_first_inf_and_first_nan_are_told_apart() -> None:
    def f(x: jax.Array) -> jax.Array:
        y = jnp.log(x)  # -inf at 0
        return y * 0.0  # NaN there

    result = oracle.evaluate(f, np.array([0.0, 1.0], np.float32))
    assert result.first is result.first_inf
    assert result.first_inf is not None and result.first_inf.primitive == "log"
    assert result.first_nan is not None and result.first_nan.primitive == "mul"
    assert result.first_nan.index > result.first_inf.index
    assert [b.primitive for b in result.births] == ["log"]  # mul read an infinity


def test_subnormals_are_flushed_as_xla_does_on_cpu() -> None:
    def f(x: jax.Array, scale: jax.Array) -> jax.Array:
        return jnp.log(jnp.exp(x) * scale)  # exp(-88.5) is subnormal: 0 under flush-to-zero

    x, one = np.array([-88.5, 1.0], np.float32), np.float32(1.0)
    flushed = oracle.evaluate(f, x, one)
    assert flushed.first is not None and flushed.first.primitive == "log"
    np.testing.assert_allclose(flushed.outputs[0], np.asarray(jax.jit(f)(x, one)), rtol=1e-6)
    assert flushed.outputs[0][0] == -np.inf
    assert oracle.evaluate(f, x, one, flush_denormals=False).first is None


def test_half_precision_overflows_in_its_own_dtype() -> None:
    def f(x: jax.Array) -> jax.Array:
        return x * x

    half = oracle.evaluate(f, np.array([300.0, 200.0], np.float16))  # 90000 > 65504
    assert half.first is not None and half.first.dtype == "float16"
    assert half.first.counts.pos_inf == 1
    bf16 = oracle.evaluate(f, np.array([300.0], ml_dtypes.bfloat16))
    assert bf16.first is None and bf16.outputs[0].dtype == ml_dtypes.bfloat16


def test_reverse_scan_iterations_count_in_execution_order() -> None:
    def f(xs: jax.Array) -> jax.Array:
        def body(c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            return c + x, jnp.log(x)

        ys: jax.Array = lax.scan(body, jnp.float32(0.0), xs, reverse=True)[1]
        return ys

    xs = np.array([1.0, 0.0, 2.0, 3.0], np.float32)  # the 0 is read by the 3rd iteration
    result = oracle.evaluate(f, xs)
    assert result.first is not None
    (loop,) = result.first.loops
    assert (loop.primitive, loop.iteration, loop.index, loop.length) == ("scan", 2, 1, 4)
    np.testing.assert_array_equal(result.outputs[0], np.asarray(f(jnp.asarray(xs))))


@pytest.mark.parametrize(("take_log", "finds"), [(True, True), (False, False)])
def test_cond_evaluates_only_the_branch_its_index_picks(take_log: bool, finds: bool) -> None:
    def f(p: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = lax.cond(p, jnp.log, jnp.negative, x)
        return out

    result = oracle.evaluate(f, np.asarray(take_log), np.zeros(2, np.float32))
    assert (result.first is not None) == finds


def test_a_primitive_without_a_numpy_rule_is_evaluated_by_jax_and_named() -> None:
    def f(x: jax.Array) -> jax.Array:
        return lax.erf_inv(x)

    x = np.array([0.5, 1.0], np.float32)  # erf_inv(1) = +inf
    result = oracle.evaluate(f, x)
    assert result.fallbacks == ["erf_inv"]
    assert result.first is not None and result.first.kind == "+inf"
    np.testing.assert_allclose(result.outputs[0], np.asarray(f(jnp.asarray(x))), rtol=1e-6)


def test_equations_inside_jnp_functions_take_the_callers_line() -> None:
    # jnp.where is a jit of its own whose equations carry no user frame
    def f(x: jax.Array) -> jax.Array:
        return jnp.where(x > 0, x, -jnp.inf)

    result = oracle.evaluate(f, np.array([1.0, -1.0], np.float32))
    assert result.first is not None and result.first.primitive == "convert_element_type"
    assert result.first.file == __file__
    assert result.first.function == f.__qualname__
