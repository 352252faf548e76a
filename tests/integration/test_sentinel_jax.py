"""The JAX sentinel (issue 32, "JAX's jitted steps get the same mode on their guards and
replays"), on real flax programs, held against oracles that share no code with it.

* ``tests/programs/real/jax_flax_late.py``: a flax.linen classifier, AdamW, a jitted step; a
  blank image in batch 300 makes 0/0 = NaN in a hand-written standardisation. The step
  oracle is the plain program (no nanscope) run alone: its first step whose outputs are not
  finite. The cause oracle is ``tests/jax_oracle.py``: that step's jaxpr evaluated with NumPy
  on the same arguments, its first non-finite equation output (primitive and line).
  ``on_nan="skip"`` must end with the parameters of a plain run that leaves the bad batch
  out; ``on_nan="stop"`` must raise at that step.
* ``tests/programs/real/jax_lm_eager_mask.py``: a healthy flax LM whose -inf causal mask is
  an argument of every step and is absorbed by the softmax inside it: no trip, and the
  history's losses are the plain run's.
* Crafted steps: a transient fault the replay does not meet again (reproduced False), a
  donating step (refused with a message), NaN and Inf in every place a reduction could drop
  them (the figures against NumPy's), the output shapes the sentinel reads.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("flax")
optax = pytest.importorskip("optax")

from nanscope.sentinel import JaxSentinel, SentinelHistory, SentinelTripped, read_history  # noqa: E402
from nanscope.sentinel._jax_checks import layout_of  # noqa: E402
from nanscope.sentinel._replay import NOT_REPRODUCED  # noqa: E402
from tests.jax_oracle import evaluate  # noqa: E402

pytestmark = [pytest.mark.jax, pytest.mark.slow]

PROGRAMS = Path(__file__).resolve().parents[1] / "programs" / "real"
STEPS = 320  # the blank image is in batch 300
DETAIL = 7  # the largest |x| every 7 steps: not at step 300, but for its trip


def load(name: str) -> ModuleType:
    module_name = f"sentinel_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, PROGRAMS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def marked_line(name: str, label: str) -> int:
    lines = (PROGRAMS / f"{name}.py").read_text().splitlines()
    found = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# <- {label}")]
    assert len(found) == 1
    return found[0]


def finite(tree: Any) -> bool:
    return all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree_util.tree_leaves(tree))


# -- the flax program, plain and under the sentinel ---------------------------------------------


@dataclass
class Plain:
    first_bad: int  # the first step whose outputs are not all finite
    bad_args: tuple[Any, ...]  # that step's arguments
    skipped_params: Any  # the parameters at the end when that step's batch is left out


@pytest.fixture(scope="module")
def late() -> ModuleType:
    return load("jax_flax_late")


@pytest.fixture(scope="module")
def plain(late: ModuleType) -> Plain:
    params, opt_state = late.init()
    batches = late.batches(STEPS)
    first_bad = None
    bad_args: tuple[Any, ...] = ()
    for step, (images, labels) in enumerate(batches):
        args = (params, opt_state, images, labels)
        out = late.train_step(*args)
        if first_bad is None and not finite(out):
            first_bad, bad_args = step, args
            continue  # the bad batch left out: what skipping it should give
        params, opt_state = out["params"], out["opt_state"]
    assert first_bad is not None, "the program did not diverge"
    return Plain(first_bad, bad_args, params)


@dataclass
class Sentinelled:
    history: SentinelHistory
    params: Any
    losses: list[float]


@pytest.fixture(scope="module")
def skipped(late: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Sentinelled:
    logdir = tmp_path_factory.mktemp("skip")
    params, opt_state = late.init()
    losses = []
    with JaxSentinel(logdir, on_nan="skip", detail_every=DETAIL) as sentinel:
        for images, labels in late.batches(STEPS):
            out = sentinel.step(late.train_step, params, opt_state, images, labels)
            params, opt_state = out["params"], out["opt_state"]
            losses.append(float(out["loss"]))
    return Sentinelled(read_history(logdir), params, losses)


def test_late_divergence_is_caught_at_the_plain_runs_first_bad_step(
    skipped: Sentinelled, plain: Plain
) -> None:
    history = skipped.history
    assert [t.step for t in history.trips] == [plain.first_bad] == [300]
    assert history.complete and history.last_step == STEPS - 1
    assert [s.step for s in history.steps] == list(range(STEPS))
    bad = [s for s in history.steps if s.bad]
    assert [s.step for s in bad] == [plain.first_bad]
    assert set(bad[0].bad) == {"loss", "gradients", "parameters", "optimizer_state"}
    assert math.isnan(bad[0].loss or 0.0) and math.isnan(bad[0].param_amax or 0.0)
    assert bad[0].module_amax and all(math.isnan(m or 0.0) for m in bad[0].module_amax)
    assert all(s.grad_norm is not None and s.param_norm is not None for s in history.steps)
    detailed = [s.step for s in history.steps if s.grad_amax is not None]
    assert detailed == sorted({*range(0, STEPS, DETAIL), plain.first_bad})
    assert history.header.framework == "jax"
    assert history.header.modules == ("Dense_0", "Dense_1")


def test_replay_names_the_cause_the_oracle_finds(
    skipped: Sentinelled, plain: Plain, late: ModuleType
) -> None:
    oracle = evaluate(late.train_step, *plain.bad_args).first
    assert oracle is not None
    trip = skipped.history.trips[0]
    assert trip.reproduced is True and trip.reason is None
    assert trip.replay == f"replay-step-{plain.first_bad}"
    replay = skipped.history.replay_dir(trip)
    assert replay is not None and any(replay.iterdir())
    assert trip.cause is not None
    assert (trip.cause.op_type, trip.cause.line) == (oracle.primitive, oracle.line)
    assert trip.cause.line == marked_line("jax_flax_late", "late.div")
    assert Path(trip.cause.file or "").resolve() == (PROGRAMS / "jax_flax_late.py").resolve()
    assert trip.cause.step == plain.first_bad  # the replay's dump numbers the step
    assert "div" in trip.cause.headline


def test_skip_goes_on_to_the_end_as_if_the_bad_batch_were_left_out(
    skipped: Sentinelled, plain: Plain
) -> None:
    assert finite(skipped.params)
    assert all(math.isfinite(v) for i, v in enumerate(skipped.losses) if i != plain.first_bad)
    expected = jax.tree_util.tree_leaves(plain.skipped_params)
    got = jax.tree_util.tree_leaves(skipped.params)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6, atol=1e-7)
    trip = skipped.history.trips[0]
    assert trip.action == "skip"


def test_stop_raises_at_the_bad_step_and_closes_the_history(
    late: ModuleType, plain: Plain, tmp_path: Path
) -> None:
    params, opt_state = late.init()
    sentinel = JaxSentinel(tmp_path, replay=False)
    with pytest.raises(SentinelTripped, match=f"step {plain.first_bad}: Inf/NaN in loss") as raised:
        for images, labels in late.batches(STEPS):
            out = sentinel.step(late.train_step, params, opt_state, images, labels)
            params, opt_state = out["params"], out["opt_state"]
    trip = raised.value.trip
    assert (trip.step, trip.action, trip.replay) == (plain.first_bad, "stop", None)
    assert trip.reason is not None and "replay=False" in trip.reason
    assert finite(params)  # the loop kept the last good state
    history = read_history(tmp_path)
    assert history.complete and history.last_step == plain.first_bad
    with pytest.raises(RuntimeError, match="closed"):
        sentinel.step(late.train_step, params, opt_state, images, labels)


def test_checks_inside_the_step_measure_what_checks_after_it_do(
    late: ModuleType, tmp_path: Path
) -> None:
    """A plain jax.jit step gets the norms computed inside its own program (fuse=True, the
    default); any other function, a separate program after it: the same figures."""
    histories = []
    for fuse in (True, False):
        params, opt_state = late.init()
        with JaxSentinel(tmp_path / str(fuse), fuse=fuse, detail_every=3) as sentinel:
            for images, labels in late.batches(12):
                out = sentinel.step(late.train_step, params, opt_state, images, labels)
                params, opt_state = out["params"], out["opt_state"]
        histories.append(read_history(tmp_path / str(fuse)).steps)
    fused, separate = histories
    assert len(fused) == len(separate) == 12
    for a, b in zip(fused, separate, strict=True):
        assert a.loss == pytest.approx(b.loss, rel=1e-6) and a.bad == b.bad == ()
        for name in ("grad_norm", "param_norm", "grad_amax", "param_amax", "state_amax"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None) == (a.step % 3 != 0 and "amax" in name), name
            assert x is None or x == pytest.approx(y, rel=1e-5), name
        assert a.module_amax == pytest.approx(b.module_amax, rel=1e-6)


# -- a healthy run with an intended -inf mask ---------------------------------------------------


def test_an_intended_mask_never_trips(tmp_path: Path) -> None:
    lm = load("jax_lm_eager_mask")
    steps = 40
    bias = lm.causal_bias(lm.SEQ)  # as the program's init() makes it, eagerly
    assert not finite(bias)  # the mask's -inf goes into every step
    tokens0 = jnp.zeros((1, lm.SEQ), jnp.int32)
    initial = jax.jit(lm.model.init)(jax.random.PRNGKey(0), tokens0, bias)["params"]
    batches = [jnp.asarray(t) for t in lm.batches(steps)]
    params, opt_state = initial, lm.optimizer.init(initial)
    plain_losses = []
    for tokens in batches:  # the oracle: the plain loop
        params, opt_state, loss = lm.train_step(params, opt_state, tokens, bias)
        plain_losses.append(float(loss))
    params, opt_state = initial, lm.optimizer.init(initial)
    losses = []
    with JaxSentinel(tmp_path, detail_every=1) as sentinel:  # every figure at every step
        for tokens in batches:
            params, opt_state, loss = sentinel.step(lm.train_step, params, opt_state, tokens, bias)
            losses.append(float(loss))
    history = read_history(tmp_path)
    assert history.complete and not history.trips
    assert not any(s.bad for s in history.steps) and len(history.steps) == steps
    assert [s.loss for s in history.steps] == losses == pytest.approx(plain_losses, rel=1e-6)
    last = max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree_util.tree_leaves(params))
    assert history.steps[-1].param_amax == pytest.approx(last, rel=1e-6)
    norm = math.sqrt(sum(float(np.sum(np.square(x))) for x in jax.tree_util.tree_leaves(params)))
    assert history.steps[-1].param_norm == pytest.approx(norm, rel=1e-5)
    assert history.steps[-1].grad_norm is None  # the step returns no gradients
    assert history.header.modules == tuple(sorted(params))


# -- crafted steps --------------------------------------------------------------------------------


def _sgd_step(params: Any, x: Any) -> dict[str, Any]:
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((x @ p["w"]) ** 2))(params)
    return {"params": {"w": params["w"] - 0.01 * grads["w"]}, "loss": loss, "grads": grads}


def test_a_transient_fault_is_not_reproduced(tmp_path: Path) -> None:
    jitted = jax.jit(_sgd_step)
    calls = 0

    def flaky(params: Any, x: Any) -> Any:
        nonlocal calls
        calls += 1
        out = jitted(params, x)
        if calls == 4:  # a fault in the first run of step 3 only
            out = {**out, "loss": out["loss"] * jnp.nan}
        return out

    params = {"w": jnp.ones((3, 2))}
    x = jnp.arange(6.0).reshape(2, 3) / 10
    with JaxSentinel(tmp_path, on_nan="skip") as sentinel:
        for _ in range(6):
            params = sentinel.step(flaky, params, x)["params"]
    (trip,) = read_history(tmp_path).trips
    assert (trip.step, trip.where, trip.reproduced) == (3, ("loss",), False)
    assert trip.reason == NOT_REPRODUCED
    assert finite(params)


def test_a_donating_step_is_refused_unless_nothing_needs_its_arguments(tmp_path: Path) -> None:
    donating = jax.jit(_sgd_step, donate_argnums=0)
    x = jnp.ones((2, 3))
    params = {"w": jnp.ones((3, 2))}
    with pytest.raises(ValueError, match=r"donates .* cannot replay"):
        JaxSentinel(tmp_path / "a").step(donating, params, x)
    assert not params["w"].is_deleted()  # refused before the step ran
    with JaxSentinel(tmp_path / "b", replay=False) as sentinel:
        for _ in range(3):
            params = sentinel.step(donating, params, x)["params"]
    assert len(read_history(tmp_path / "b").steps) == 3

    def wrapped(p: Any, x: Any) -> Any:  # a donating jit inside a plain function
        return donating(p, x)

    with pytest.raises(ValueError, match="donates some"):
        JaxSentinel(tmp_path / "c", on_nan="skip").step(wrapped, params, x)


CASES = {
    "finite": np.array([[1.5, -7.0], [0.0, 2.0]], np.float32),
    "one NaN": np.array([1.0, np.nan, 3.0] * 400, np.float32),
    "all NaN": np.full((196, 64), np.nan, np.float32),
    "-inf": np.array([1.0, -np.inf, 2.0], np.float32),
    "NaN and inf": np.array([np.inf, 1.0, np.nan], np.float32),
    "huge": np.array([3e38, -3.2e38], np.float32),
}


def _numpy_amax(a: np.ndarray) -> float:
    return float("nan") if np.isnan(a).any() else float(np.max(np.abs(a)))


@pytest.mark.parametrize("case", list(CASES))
def test_figures_keep_every_nan_and_inf(case: str, tmp_path: Path) -> None:
    """XLA's max-reductions on the CPU drop NaN: the figures must not (a false all-clear)."""
    value = CASES[case]
    calm = np.full((5,), 0.5, np.float32)
    outputs = {
        "params": {"a": {"w": jnp.asarray(value)}, "b": {"w": jnp.asarray(calm)}},
        "grads": {"a": jnp.asarray(value), "b": jnp.asarray(calm)},
        "opt_state": (jnp.asarray(calm), jnp.asarray(value)),
        "loss": jnp.float32(0.25),
        "accuracy": jnp.float32(np.nan),  # not a check
    }
    with JaxSentinel(tmp_path, on_nan="skip", replay=False) as sentinel:
        sentinel.step(lambda state: state, outputs)  # the state, handed back as it came
    (step,) = read_history(tmp_path).steps
    expected = _numpy_amax(np.concatenate([value.ravel(), calm]))
    for got in (step.param_amax, step.grad_amax, step.state_amax, step.module_amax[0]):
        assert got == pytest.approx(expected, nan_ok=True)
    assert step.module_amax[1] == pytest.approx(0.5)
    bad = not np.isfinite(value).all()
    assert set(step.bad) == ({"gradients", "parameters", "optimizer_state"} if bad else set())
    squares = float(np.sum(np.square(value.astype(np.float64)))) + 5 * 0.25
    norm = math.inf if squares > float(np.finfo(np.float32).max) else math.sqrt(squares)
    assert step.grad_norm == pytest.approx(norm, nan_ok=True, rel=1e-5)


def tiny_train_state() -> Any:
    from flax.training import train_state

    return train_state.TrainState.create(  # type: ignore[no-untyped-call]
        apply_fn=lambda p, x: x @ p["w"], params={"w": jnp.ones((3, 2))}, tx=optax.adam(1e-2)
    )


def _train_state_update(state: Any, x: Any) -> tuple[Any, dict[str, Any]]:
    loss, grads = jax.value_and_grad(lambda p: jnp.mean(state.apply_fn(p, x) ** 2))(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss, "accuracy": jnp.float32(0.5)}


_train_state_step = jax.jit(_train_state_update)


def test_output_shapes_the_sentinel_reads(tmp_path: Path) -> None:
    params = {"Dense_0": {"kernel": jnp.ones((3, 2))}, "Dense_1": {"bias": jnp.ones(2)}}
    opt_state = optax.adam(1e-3).init(params)
    x = jnp.ones((4, 3))

    # (params, opt_state, loss): by structure and by optax's types.
    layout = layout_of((params, opt_state, jnp.float32(1.0)), (params, opt_state, x), {}, False)
    assert layout.loss == len(jax.tree_util.tree_leaves((params, opt_state)))
    assert len(layout.groups["parameters"]) == 2 and len(layout.groups["optimizer_state"]) == 4
    assert layout.modules == ("Dense_0", "Dense_1")
    assert layout.state_items == ((0, 0), (1, 1))

    # (TrainState, metrics): by name; the state rolls back whole.
    state = tiny_train_state()
    out = (state, {"loss": jnp.float32(1.0), "accuracy": jnp.float32(0.5)})
    layout = layout_of(out, (state, x), {}, False)
    assert layout.loss is not None
    assert len(layout.groups["parameters"]) == 1 and len(layout.groups["optimizer_state"]) == 2
    assert layout.state_items == ((0, 0),)
    # ... and a skipped step hands back the state it was given.
    with JaxSentinel(tmp_path, on_nan="skip", replay=False) as sentinel:
        for poisoned in (False, True, False):
            given = state
            state, metrics = sentinel.step(
                _train_state_step, state, x * (jnp.nan if poisoned else 1)
            )
            assert (state is given) == poisoned and finite(state.params)
            assert math.isnan(metrics["loss"]) == poisoned
    assert [t.step for t in read_history(tmp_path).trips] == [1]

    # Nothing named, nothing shaped like an argument: refused with what to do.
    with pytest.raises(ValueError, match=r"nothing to check.*loss=lambda"):
        JaxSentinel("/nonexistent/never-written").step(lambda a: [a.sum(0), a.sum(1)], x)
