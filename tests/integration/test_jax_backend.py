"""The JAX backend on real programs, checked against an independent oracle.

Each program of ``tests/jax_programs.py`` (an MLP and a causal Transformer trained with
optax, and a dozen known bugs) is trained under ``nanscope.enable_dump_debug_info``; the
same calls are then evaluated equation by equation with numpy by ``tests/jax_oracle.py``,
which shares no code with nanscope. The report's origin (the first Inf/NaN), its first NaN,
their primitive, line, phase, loop iteration and counts must be the oracle's; healthy
programs (intended -inf masks included) must raise no harmful verdict. check_numerics must
raise at the oracle's first NaN, naming its primitive and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("flax")

import nanscope  # noqa: E402
from nanscope.analysis import analyze  # noqa: E402
from nanscope.reader import DumpReader  # noqa: E402
from nanscope.report import report_json  # noqa: E402
from tests.jax_oracle import Event, Result, evaluate_calls  # noqa: E402
from tests.jax_programs import PROGRAMS, Training  # noqa: E402

BUGGY = [name for name, p in PROGRAMS.items() if not p.healthy]
# The oracle's first Inf of these is the -inf literal of jnp.where's mask, converted inside
# jnp.where's own jit: computed from constants alone, which nanscope does not summarise
# (XLA folds it at compile time). Their first NaN is compared.
MASKED = {"transformer_empty_sequence"}


def _record(
    name: str, logdir: Path, jit: bool = True, steps: int = 1, mode: str = "FULL_HEALTH"
) -> tuple[Training, Any]:
    training = PROGRAMS[name].build(steps=steps)
    with nanscope.enable_dump_debug_info(
        logdir, framework="jax", circular_buffer_size=-1, tensor_debug_mode=mode
    ):
        run = training.run(jit=jit)
    return training, run


def _oracle(training: Training, run: Any) -> tuple[Result, int]:
    results = evaluate_calls(training.train_step, run.calls)
    return results[-1], len(results) - 1


def _check_event(view: dict[str, Any], event: Event, step: int) -> None:
    """A report event (JSON) is the oracle's event: primitive, line, phase, iteration, counts."""
    assert view["op_type"] == event.primitive, (view["op_name"], event)
    assert view["source"] is not None and view["source"]["line"] == event.line, (view, event)
    assert view["step"] == step
    assert (view["phase"] == "backward") == event.backward, (view["phase"], event.name_stack)
    if event.loops:
        assert view["iteration"] == event.iteration, (view["iteration"], event.loops)
    else:
        assert view["iteration"] is None
    counts, truth = view["counts"], event.counts
    assert (counts["size"], counts["neg_inf"], counts["pos_inf"], counts["nan"]) == (
        truth.size, truth.neg_inf, truth.pos_inf, truth.nan,
    )  # fmt: skip
    assert (counts["neg"], counts["zero"], counts["pos"]) == (
        truth.negative, truth.zero, truth.positive,
    )  # fmt: skip


def _report(logdir: Path) -> dict[str, Any]:
    with DumpReader(logdir) as reader:
        return report_json(analyze(reader))


@pytest.mark.parametrize("name", BUGGY)
def test_the_report_names_the_oracles_origin_and_first_nan(name: str, tmp_path: Path) -> None:
    training, run = _record(name, tmp_path)
    truth, step = _oracle(training, run)
    assert truth.first is not None, "the program's bug did not show"
    report = _report(tmp_path)
    assert report["found_nonfinite"]
    origin = report["origin"]
    assert origin["kind"] == "graph_execution_trace"
    if truth.nonfinite_inputs:
        # The data came in with NaN: the origin is the argument, and says so; the first
        # equation to output NaN is the oracle's.
        assert origin["op_type"] == "Placeholder"
        assert report["origin_kind"] == "entered"
        assert "already in this argument" in origin["explanation"]
        assert truth.first_nan is not None
        first = _first_computed_nan(tmp_path)
        assert (first.op_type, first.health.nan) == (
            truth.first_nan.primitive, truth.first_nan.counts.nan,
        )  # fmt: skip
    else:
        if name not in MASKED:
            _check_event(origin, truth.first, step)
            assert report["origin_kind"] == "born"
        if truth.first_nan is not None:
            _check_event(report["first_nan"], truth.first_nan, step)
    assert report["found_harmful"]


def _first_computed_nan(logdir: Path) -> Any:
    """The first trace with NaN of an equation (not an argument)."""
    with DumpReader(logdir) as reader:
        for i in range(reader.num_graph_execution_traces()):
            tr = reader.trace(i)
            if tr.health.nan and tr.op_type not in ("Placeholder", "Const"):
                return tr
    raise AssertionError("no equation output with NaN was recorded")


def test_the_seeds_log_of_zero_is_explained(tmp_path: Path) -> None:
    _record("mlp_unscaled_pixels", tmp_path)
    report = _report(tmp_path)
    assert report["origin"]["explanation"].startswith("log of zero")
    assert "0 * inf" in report["first_nan"]["explanation"]


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_healthy_programs_raise_no_alarm(name: str, tmp_path: Path) -> None:
    training, run = _record(name, tmp_path, steps=2)
    truth, _ = _oracle(training, run)
    report = _report(tmp_path)
    assert not report["found_harmful"], report["lineages"]
    if truth.first is None:
        assert not report["found_nonfinite"]
    else:  # the causal mask's -inf, absorbed by the softmax
        assert report["lineages"] and all(g["kind"] == "benign" for g in report["lineages"])
        # The mask's -inf was in the guards at both steps: the first call was replayed
        # (every value), the second, with the same pattern, was not (its guards only).
        by_step = _traces_by_step(tmp_path)
        assert _nonfinite(by_step[0]) and _nonfinite(by_step[1])
        assert {t.op_name for t in by_step[1]} < {t.op_name for t in by_step[0]}
    assert report["steps"] == [0, 1]  # each jitted training step ends a step


def test_eager_programs_are_recorded_op_by_op(tmp_path: Path) -> None:
    training, run = _record("mlp_unscaled_pixels", tmp_path, jit=False, steps=1)
    truth, _ = _oracle(training, run)
    assert truth.first is not None
    report = _report(tmp_path)
    origin = report["origin"]
    assert origin["op_type"] == "log"
    assert origin["source"]["line"] == truth.first.line
    assert origin["explanation"].startswith("log of zero")
    assert (origin["counts"]["neg_inf"], origin["counts"]["zero"]) == (
        truth.first.counts.neg_inf, truth.first.counts.zero,
    )  # fmt: skip


def test_graphs_and_ops_are_written_once_per_function(tmp_path: Path) -> None:
    training, run = _record("mlp", tmp_path, steps=5, mode="NO_TENSOR")
    closed = jax.make_jaxpr(training.train_step)(*run.calls[-1])
    # JAX traces the step once per argument signature: the zero biases start weakly typed,
    # so its first calls trace it anew (JAX compiles each); one graph per signature.
    signatures = {
        tuple(
            (a.shape, a.dtype, a.weak_type)
            for a in jax.make_jaxpr(training.train_step)(*c).in_avals
        )
        for c in run.calls
    }
    with DumpReader(tmp_path) as reader:
        graphs = [g for g in reader.graphs().values() if g.name == "train_step"]
        assert len(graphs) == len(signatures) < len(run.calls)
        ops = graphs[-1].ops
        executions = [reader.execution(i) for i in range(reader.num_executions())]
    ids = {g.graph_id for g in graphs}
    steps = [e for e in executions if e.graph_id in ids]
    assert [e.step for e in steps] == [0, 1, 2, 3, 4]  # each call of the training step ends one
    # Every primitive of the program is an op (nested jits inlined), arguments are Placeholders.
    prims = {op.op_type for op in ops.values()}
    inner = _primitives(closed.jaxpr)
    assert inner - {"jit", "pjit", "custom_jvp_call", "custom_vjp_call"} <= prims
    placeholders = [op for op in ops.values() if op.op_type == "Placeholder"]
    assert len(placeholders) == len(jax.tree_util.tree_leaves(run.calls[0]))


def _primitives(jaxpr: Any) -> set[str]:
    found = set()
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for p in eqn.params.values():
            sub = getattr(p, "jaxpr", None)
            if sub is not None and hasattr(sub, "eqns"):
                found |= _primitives(sub)
    return found


def _under_check_numerics(training: Training) -> Any:
    """Train jitted under ``enable_check_numerics``; the run."""
    nanscope.enable_check_numerics(framework="jax")
    try:
        return training.run(jit=True)
    finally:
        nanscope.disable_check_numerics()


def _check_numerics_error(training: Training) -> nanscope.NonFiniteError:
    """What check_numerics raised while training (it must raise)."""
    with pytest.raises(nanscope.NonFiniteError) as raised:
        _under_check_numerics(training)
    return raised.value


@pytest.mark.parametrize(
    "name", ["mlp_unscaled_pixels", "scan_nan_at_3", "custom_vjp_fwd", "where_gradient_trap"]
)
def test_check_numerics_raises_at_the_oracles_first_nan(name: str) -> None:
    training = PROGRAMS[name].build(steps=1)
    error = _check_numerics_error(training)
    truth = evaluate_calls(training.train_step, [training.first_call()])[-1]
    assert truth.first_nan is not None
    assert error.reason == "nan"
    assert error.op_type == truth.first_nan.primitive
    assert error.source is not None and error.source[1] == truth.first_nan.line
    assert error.counts["nan"] == truth.first_nan.counts.nan
    assert error.phase == ("backward" if truth.first_nan.backward else "forward")
    if truth.first_nan.loops:
        assert f"iteration {truth.first_nan.iteration}" in str(error)


def test_check_numerics_lets_intended_masks_pass() -> None:
    training = PROGRAMS["transformer"].build(steps=2)
    run = _under_check_numerics(training)
    assert all(loss == loss for loss in run.losses)


def test_check_numerics_raises_at_an_inf_a_training_step_returns() -> None:
    training = PROGRAMS["fp16_overflow"].build(steps=1)
    error = _check_numerics_error(training)
    assert error.reason == "gradient"
    assert error.birth is not None and error.birth.op_type == "integer_pow"


# -- Guards and replays (docs/JAX.md): counted values at healthy calls, everything at bad ones --


def _traces_by_step(logdir: Path) -> dict[int, list[Any]]:
    with DumpReader(logdir) as reader:
        traces = [reader.trace(i) for i in range(reader.num_graph_execution_traces())]
    by_step: dict[int, list[Any]] = {}
    for tr in traces:
        by_step.setdefault(tr.step, []).append(tr)
    return by_step


def _nonfinite(traces: list[Any]) -> bool:
    return any(tr.health.nan or tr.health.neg_inf or tr.health.pos_inf for tr in traces)


def _late_log_of_zero(steps: int = 5, bad: int = 3) -> Training:
    """The seed's MLP whose batch ``bad`` forgets to scale the pixels: healthy steps, then
    log of zero."""
    training = PROGRAMS["mlp"].build(steps=steps)
    x, y = training.batches[bad]
    unscaled = jax.numpy.asarray(np.asarray(x) * 255.0)  # made as the others were
    training.batches = [*training.batches[:bad], (unscaled, y), *training.batches[bad + 1 :]]
    return training


@pytest.mark.parametrize("donate", [False, True])
def test_a_nan_after_healthy_steps_is_recorded_in_full(donate: bool, tmp_path: Path) -> None:
    training = _late_log_of_zero()
    plain = training.run(jit=True)  # without nanscope: the oracle's calls
    results = evaluate_calls(training.train_step, plain.calls, stop_at_first=False)
    bad = [i for i, r in enumerate(results) if r.first is not None or r.nonfinite_inputs]
    assert bad == [3, 4], "the unscaled batch did not make log of zero at step 3"
    # donate: the usual memory saving, the step's buffers reused for its results.
    step = jax.jit(training.train_step, donate_argnums=(0, 1) if donate else ())
    losses = []
    with nanscope.enable_dump_debug_info(
        tmp_path, framework="jax", circular_buffer_size=-1, tensor_debug_mode="FULL_HEALTH"
    ):
        params, opt_state = training.params, training.opt_state
        for batch in training.batches:
            params, opt_state, loss = step(params, opt_state, *batch)
            losses.append(float(loss))
    # Recording changes nothing the program computes.
    np.testing.assert_array_equal(losses, plain.losses)
    by_step = _traces_by_step(tmp_path)
    # Steps whose dump holds Inf/NaN are the steps where the oracle saw one anywhere.
    assert [s for s in sorted(by_step) if _nonfinite(by_step[s])] == bad
    # A healthy step: the guards only; the first bad step: every summarised value. (Steps 2
    # and 3 run the same graph: the first calls' weakly typed zeros make graphs of their own.)
    assert {tr.graph_id for tr in by_step[2]} == {tr.graph_id for tr in by_step[3]}
    guards = {tr.op_name for tr in by_step[2]}
    everything = {tr.op_name for tr in by_step[3]}
    assert guards < everything
    assert not any(tr.op_type == "Placeholder" for tr in by_step[2])
    assert any(tr.op_type == "Placeholder" for tr in by_step[3])
    report = _report(tmp_path)
    assert results[3].first is not None
    _check_event(report["origin"], results[3].first, 3)
    assert report["origin"]["explanation"].startswith("log of zero")
    assert results[3].first_nan is not None
    _check_event(report["first_nan"], results[3].first_nan, 3)


def test_every_value_is_counted_without_guards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANSCOPE_JAX_GUARDS", "0")
    _record("mlp", tmp_path, steps=4)
    by_step = _traces_by_step(tmp_path)
    # A healthy step has every value (its arguments too) when guards are off.
    assert {tr.graph_id for tr in by_step[2]} == {tr.graph_id for tr in by_step[3]}
    with DumpReader(tmp_path) as reader:
        ops = reader.graphs()[by_step[3][0].graph_id].ops
    # Every floating-point argument (Adam's step count is an integer).
    placeholders = {
        name for name, op in ops.items() if op.op_type == "Placeholder" and "count" not in name
    }
    assert len(placeholders) > 10
    assert placeholders <= {tr.op_name for tr in by_step[3]}


def test_check_numerics_raises_at_a_later_step() -> None:
    training = _late_log_of_zero()
    plain = training.run(jit=True)
    error = _check_numerics_error(training)
    truth = evaluate_calls(training.train_step, [plain.calls[3]])[-1]
    assert truth.first_nan is not None
    assert error.step == 3
    assert error.op_type == truth.first_nan.primitive
    assert error.source is not None and error.source[1] == truth.first_nan.line
    assert error.counts["nan"] == truth.first_nan.counts.nan
    assert error.birth is not None and error.birth.op_type == "log"
