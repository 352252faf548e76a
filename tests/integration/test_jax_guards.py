"""Guards (docs/JAX.md, "Guards and replays"): an Inf/NaN that the program hides before its
results is still seen, and the call that held it is recorded in full.

Each program below makes an Inf or NaN and hides it from its result, through each kind of
operation that can: a ``jnp.where`` (``select_n``), ``max``, ``exp(-inf)``, a divisor
(``x / inf``), a slice, a cast to an integer, a comparison; and through a value that one use
hides and another keeps, until a later operation hides it (the value itself is not counted).
Each runs jitted, twice on finite data and then once on data that makes the hidden value,
under a FULL_HEALTH dump. The numpy oracle (``tests/jax_oracle.py``) says which call held a
non-finite value and which equation made it first: the dump must hold Inf/NaN at exactly that
call, every value of that call (a replay), and the report's origin must be the oracle's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import nanscope  # noqa: E402
from nanscope.analysis import analyze  # noqa: E402
from nanscope.reader import DumpReader  # noqa: E402
from nanscope.report import report_json  # noqa: E402
from tests.jax_oracle import evaluate  # noqa: E402


def hidden_by_where(x: Any) -> Any:
    return jnp.where(x > 0, jnp.log(x), 0.0).sum()


def hidden_by_max(x: Any) -> Any:
    return jnp.maximum(jnp.log(x), -1.0).sum()


def hidden_by_exp(x: Any) -> Any:
    return jnp.exp(jnp.log(x) * 3.0).sum()  # log(0) = -inf, exp(-inf) = 0


def hidden_by_a_divisor(x: Any) -> Any:
    return (x / (1.0 / x)).sum() + (1.0 / (1.0 / x)).sum()  # 1 / (1 / 0) = 1 / inf = 0


def hidden_by_a_slice(x: Any) -> Any:
    return jnp.log(x)[1:].sum()  # the -inf is in the element dropped


def hidden_by_a_cast(x: Any) -> Any:
    return jnp.log(x).astype(jnp.int32).sum().astype(jnp.float32)


def hidden_by_a_comparison(x: Any) -> Any:
    return (jnp.log(x) > -1.0).sum().astype(jnp.float32) + x.sum()


def seen_through_a_mixed_use(x: Any) -> Any:
    v = jnp.log(x)  # -inf: hidden by max, kept by the product (which exp then hides)
    return jnp.maximum(v, -1.0).sum() + jnp.exp(v * 2.0).sum()


PROGRAMS: dict[str, Callable[[Any], Any]] = {
    f.__name__: f
    for f in (
        hidden_by_where,
        hidden_by_max,
        hidden_by_exp,
        hidden_by_a_divisor,
        hidden_by_a_slice,
        hidden_by_a_cast,
        hidden_by_a_comparison,
        seen_through_a_mixed_use,
    )
}


def _batches() -> list[Any]:
    rng = np.random.default_rng(0)
    good = [jnp.asarray(rng.uniform(0.5, 2.0, 64).astype(np.float32)) for _ in range(2)]
    bad = rng.uniform(0.5, 2.0, 64).astype(np.float32)
    bad[0] = 0.0  # log(0) = -inf, 1 / 0 = inf
    return [*good, jnp.asarray(bad)]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_hidden_inf_is_seen_and_its_call_recorded_in_full(name: str, tmp_path: Path) -> None:
    fn = PROGRAMS[name]
    batches = _batches()
    truth = [evaluate(fn, x) for x in batches]
    assert [t.first is not None for t in truth] == [False, False, True]
    # The result is finite: the program hid what it made.
    assert all(np.isfinite(np.asarray(t.outputs[0])).all() for t in truth)
    step = jax.jit(fn)
    plain = [float(step(x)) for x in batches]
    with nanscope.enable_dump_debug_info(
        tmp_path, framework="jax", circular_buffer_size=-1, tensor_debug_mode="FULL_HEALTH"
    ) as session:
        results = []
        for i, x in enumerate(batches):
            session.set_step(i)  # a function without gradients ends no step of its own
            results.append(float(step(x)))
    assert results == plain  # recording changes nothing the program computes
    with DumpReader(tmp_path) as reader:
        traces = [reader.trace(i) for i in range(reader.num_graph_execution_traces())]
    calls: list[list[Any]] = [[], [], []]
    for tr in traces:
        calls[tr.step].append(tr)
    bad = [any(t.health.nan or t.health.neg_inf or t.health.pos_inf for t in c) for c in calls]
    assert bad == [False, False, True]
    assert {t.op_name for t in calls[0]} == {t.op_name for t in calls[1]}
    assert {t.op_name for t in calls[0]} < {t.op_name for t in calls[2]}  # replayed in full
    report = analyze_dump(tmp_path)
    first = truth[2].first
    assert first is not None
    assert report["origin"]["op_type"] == first.primitive
    assert report["origin"]["source"]["line"] == first.line
    counts = report["origin"]["counts"]
    assert (counts["neg_inf"], counts["pos_inf"], counts["nan"]) == (
        first.counts.neg_inf, first.counts.pos_inf, first.counts.nan,
    )  # fmt: skip


def analyze_dump(logdir: Path) -> dict[str, Any]:
    with DumpReader(logdir) as reader:
        return report_json(analyze(reader))


def moment_step(w: Any, x: Any) -> Any:
    """An optimizer-like step whose state (a result) is also used to update the weights:
    the state's Inf shows in the weights (and only there while the state is not counted)."""
    loss, g = jax.value_and_grad(lambda w: jnp.sum(w * x))(w)
    moment = 0.9 * w + 1.0 / g  # +inf where x is 0
    return w - 0.01 * moment, moment, loss


def _moment_batches() -> list[Any]:
    w = jnp.ones(16, jnp.float32)
    good = jnp.linspace(0.5, 2.0, 16, dtype=jnp.float32)
    return [(w, good), (w, good * 2.0), (w, good.at[3].set(0.0))]


def _producer(fn: Callable[..., Any], args: Any, output: int) -> str:
    """The primitive of the equation that makes ``fn``'s flat output ``output``."""
    closed = jax.make_jaxpr(fn)(*args)
    var = closed.jaxpr.outvars[output]
    return str(next(e.primitive.name for e in closed.jaxpr.eqns if var in e.outvars))


def test_a_result_used_inside_is_seen_through_what_it_makes(tmp_path: Path) -> None:
    batches = _moment_batches()
    truth = [evaluate(moment_step, *b) for b in batches]
    assert [t.first is not None for t in truth] == [False, False, True]
    first = truth[2].first
    assert first is not None and first.primitive == "div"
    step = jax.jit(moment_step)
    with nanscope.enable_dump_debug_info(
        tmp_path, framework="jax", circular_buffer_size=-1, tensor_debug_mode="FULL_HEALTH"
    ):
        for b in batches:
            jax.block_until_ready(step(*b))
    with DumpReader(tmp_path) as reader:
        traces = [reader.trace(i) for i in range(reader.num_graph_execution_traces())]
        runs = [reader.execution(i) for i in range(reader.num_executions())]
        runs = [e for e in runs if e.graph_id]
    by_step: dict[int, set[str]] = {}
    for tr in traces:
        by_step.setdefault(tr.step, set()).add(tr.op_name)
    # The moment (output 1) is used to make the weights (output 0): a healthy call counts
    # the weights only; the bad call is replayed in full and holds the moment's Inf.
    assert len(runs) == 3
    healthy, bad = runs[1], runs[2]
    weights, moment = healthy.output_health[0], healthy.output_health[1]
    assert weights is not None and weights.size == 16 and not weights.nonfinite
    assert moment is None  # not counted at a healthy call
    assert by_step[1] < by_step[2]
    moment = bad.output_health[1]
    assert moment is not None and moment.pos_inf == first.counts.pos_inf == 1
    report = analyze_dump(tmp_path)
    assert report["origin"]["op_type"] == first.primitive
    assert report["origin"]["source"]["line"] == first.line
    # check_numerics raises at the Inf the step returns: its moment, born at the division.
    nanscope.enable_check_numerics(framework="jax")
    try:
        with pytest.raises(nanscope.NonFiniteError) as raised:
            for b in batches:
                jax.block_until_ready(step(*b))
    finally:
        nanscope.disable_check_numerics()
    error = raised.value
    assert error.reason == "gradient"
    assert error.op_type == _producer(moment_step, batches[2], 1)
    assert error.birth is not None and error.birth.op_type == first.primitive
    assert error.birth.source is not None and error.birth.source[1] == first.line
