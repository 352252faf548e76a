"""Guards (docs/JAX.md, "Guards and replays"): an Inf/NaN that the program hides before its
results is still seen, and the call that held it is recorded in full.

Each program below makes an Inf or NaN and hides it from its result, through each kind of
operation that can: a ``jnp.where`` (``select_n``), ``max``, ``exp(-inf)``, a divisor
(``x / inf``), a slice, a cast to an integer, a comparison. Each runs jitted, twice on finite
data and then once on data that makes the hidden value, under a FULL_HEALTH dump. The numpy
oracle (``tests/jax_oracle.py``) says which call held a non-finite value and which equation
made it first: the dump must hold Inf/NaN at exactly that call, every value of that call
(a replay), and the report's origin must be the oracle's.
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
        return analyze(reader).to_json()
