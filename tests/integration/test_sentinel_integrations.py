"""The sentinel where the loop is owned: ``NanscopeCallback(logdir, sentinel=True)`` for the
Hugging Face ``Trainer`` and for Lightning (issue 32), on real programs that diverge late.

The programs (``tests/programs/real/``):

* ``gpt2_trainer_late.py``: a GPT-2 regressor from a tiny config under the ``Trainer``
  with its defaults; one label of the shuffled data set is 3.4e38, met a couple of
  hundred steps in;
* ``lightning_late.py``: a LightningModule taking the log of its features; one row of
  the shuffled data has a 0, met a couple of hundred steps in.

Oracles, computed here: the bad step is the first step whose loss or gradients are not
finite in a plain run of the same seed (no nanscope); the cause is the one a full
recording of the same run names (the callback's default mode, FULL_HEALTH, every event
kept). The sentinel must trip at that step, its replay must name that cause (op type,
file and line), ``on_nan="skip"`` must let training finish with finite parameters, and
healthy runs (an intended mask's -inf, a GradScaler's handled overflow) never trip.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from nanscope import open_dump  # noqa: E402
from nanscope.sentinel import read_history  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

PROGRAMS = Path(__file__).parents[1] / "programs"


def load(path: Path) -> Any:
    """A program as a module (programs are scripts, not a package's modules)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Oracle:
    """The first bad step of a plain run, and the cause a full recording names."""

    step: int
    op_type: str
    file: str
    line: int


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def finite(module: Any) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


def ops_in(dump: Path) -> list[str]:
    with open_dump(dump) as reader:
        return [reader.execution(i).op_type for i in range(reader.num_executions())]


def check_history(logdir: Path, bad_step: int, last_step: int, action: str) -> None:
    """The history on disk: complete, every step to ``last_step``, one trip at ``bad_step``."""
    history = read_history(logdir)
    assert history.complete, history.problems
    assert [s.step for s in history.steps] == list(range(last_step + 1))
    assert [s.step for s in history.steps if s.bad] == [bad_step]
    assert [(t.step, t.action, t.replay) for t in history.trips] == [
        (bad_step, action, f"replay-step-{bad_step}")
    ]
    assert (logdir / f"replay-step-{bad_step}").is_dir()


# -- the Hugging Face Trainer --------------------------------------------------------------------

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import TrainerCallback  # noqa: E402

from nanscope.integrations.transformers import NanscopeCallback as HFCallback  # noqa: E402
from nanscope.integrations.transformers import attach  # noqa: E402

gpt2_late = load(PROGRAMS / "real" / "gpt2_trainer_late.py")


def train(trainer: Any) -> None:
    """Every Trainer run of this module starts here: the causes' user frame is this line."""
    trainer.train()


class FirstNonFiniteHF(TrainerCallback):
    """A plain run's oracle: the first step whose loss or gradients are not finite (the
    loss through the Trainer's ``training_step``); training stops there."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.trainer: Any = None

    def watch(self, trainer: Any) -> None:
        original = trainer.training_step

        def training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            loss = original(model, inputs, *args, **kwargs)
            if self.step is None and not bool(torch.isfinite(loss).all()):
                self.step = trainer.state.global_step
            return loss

        trainer.training_step = training_step
        trainer.add_callback(self)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        grads = [p.grad for p in kw["model"].parameters() if p.grad is not None]
        if self.step is None and not all(bool(torch.isfinite(g).all()) for g in grads):
            self.step = state.global_step
        if self.step is not None:
            control.should_training_stop = True


@pytest.fixture(scope="module")
def hf_oracle(tmp_path_factory: pytest.TempPathFactory) -> Oracle:
    out = tmp_path_factory.mktemp("hf-oracle")
    plain = gpt2_late.make_trainer(out / "plain")
    first = FirstNonFiniteHF()
    first.watch(plain)
    train(plain)
    assert first.step is not None and first.step >= 150  # late: a couple of hundred steps in

    full = gpt2_late.make_trainer(out / "full")
    recorded = attach(full, out / "dump", circular_buffer_size=-1, stop_on_harmful=True)
    train(full)
    cause = recorded.analysis.cause
    assert cause is not None and cause.source is not None, recorded.headline
    assert cause.step == first.step  # the full recording agrees with the plain run
    return Oracle(first.step, cause.op_type, cause.source.file, cause.source.line)


def test_trainer_sentinel_stops_at_the_bad_step_with_the_full_recordings_cause(
    hf_oracle: Oracle, tmp_path: Path
) -> None:
    callback = HFCallback(tmp_path / "sentinel", sentinel=True)  # finds its Trainer itself
    trainer = gpt2_late.make_trainer(tmp_path / "out", callbacks=[callback])
    train(trainer)

    k = hf_oracle.step
    (trip,) = callback.trips
    assert (trip.step, trip.action, trip.reproduced) == (k, "stop", True)
    assert {"loss", "gradients"} & set(trip.where)
    assert trip.cause is not None
    assert (trip.cause.op_type, trip.cause.file, trip.cause.line, trip.cause.step) == (
        hf_oracle.op_type, hf_oracle.file, hf_oracle.line, k,
    )  # fmt: skip
    assert callback.headline == trip.cause.headline and callback.harmful_step == k
    # The bad step was the last; its update was dropped: the weights are the step's start.
    assert trainer.state.global_step == k + 1
    assert finite(trainer.model)
    check_history(tmp_path / "sentinel", k, k, "stop")
    assert "training_step" not in trainer.__dict__  # the Trainer's own is back


def test_trainer_sentinel_skip_finishes_with_finite_weights(
    hf_oracle: Oracle, tmp_path: Path
) -> None:
    trainer = gpt2_late.make_trainer(tmp_path / "out")
    callback = attach(trainer, tmp_path / "sentinel", sentinel=True, on_nan="skip")
    train(trainer)

    assert trainer.state.global_step == gpt2_late.STEPS
    assert [(t.step, t.action, t.reproduced) for t in callback.trips] == [
        (hf_oracle.step, "skip", True)
    ]
    assert callback.trips[0].cause is not None
    assert callback.trips[0].cause.op_type == hf_oracle.op_type
    assert finite(trainer.model)
    check_history(tmp_path / "sentinel", hf_oracle.step, gpt2_late.STEPS - 1, "skip")


def test_trainer_replay_runs_every_micro_batch_of_the_step(tmp_path: Path) -> None:
    """With gradient accumulation a step is two micro-batches: the replay runs both."""
    steps = gpt2_late.STEPS // 2
    plain = gpt2_late.make_trainer(tmp_path / "plain", steps=steps, gradient_accumulation_steps=2)
    first = FirstNonFiniteHF()
    first.watch(plain)
    train(plain)
    assert first.step is not None

    trainer = gpt2_late.make_trainer(tmp_path / "out", steps=steps, gradient_accumulation_steps=2)
    callback = attach(trainer, tmp_path / "sentinel", sentinel=True)
    train(trainer)
    (trip,) = callback.trips
    assert (trip.step, trip.reproduced) == (first.step, True)
    ops = ops_in(tmp_path / "sentinel" / f"replay-step-{first.step}")
    assert ops.count("aten.mse_loss.default") == 2  # one loss per micro-batch
    assert ops.count("aten.mse_loss_backward.default") == 2


class LearningRateSpike(TrainerCallback):
    """A schedule gone wrong: at step ``at`` the learning rate is inf (the Trainer's own
    schedule sets it back the step after)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at:
            for group in kw["optimizer"].param_groups:
                group["lr"] = math.inf


class FirstNonFiniteUpdateHF(TrainerCallback):
    """A plain run's oracle: the first step after whose update the weights are not finite."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.step is None and not finite(kw["model"]):
            self.step = state.global_step
            control.should_training_stop = True


@pytest.mark.parametrize("on_nan", ["stop", "skip"])
def test_trainer_update_born_nan_is_replayed_with_the_update(tmp_path: Path, on_nan: str) -> None:
    """Finite gradients, an inf learning rate: the fused AdamW writes Inf/NaN. With
    ``snapshot_state=True`` the replay runs the Trainer's update from the state before it."""
    steps, spike = 80, 50
    plain = gpt2_late.make_trainer(tmp_path / "plain", poisoned=False, steps=steps)
    first = FirstNonFiniteUpdateHF()
    plain.add_callback(LearningRateSpike(spike))
    plain.add_callback(first)
    train(plain)
    assert first.step == spike

    trainer = gpt2_late.make_trainer(tmp_path / "out", poisoned=False, steps=steps)
    trainer.add_callback(LearningRateSpike(spike))
    callback = attach(
        trainer, tmp_path / "sentinel", sentinel=True, on_nan=on_nan, snapshot_state=True
    )
    train(trainer)

    (trip,) = callback.trips
    assert (trip.step, trip.where, trip.action, trip.reproduced) == (
        spike, ("parameters",), on_nan, True,
    )  # fmt: skip
    # The update that the Trainer's default optimizer runs, in the replay's dump.
    assert trainer.args.optim == "adamw_torch_fused"
    assert trip.cause is not None and trip.cause.op_type == "aten._fused_adamw_.default"
    assert "aten._fused_adamw_.default" in ops_in(tmp_path / "sentinel" / f"replay-step-{spike}")
    assert finite(trainer.model)  # the snapshot was put back
    assert trainer.state.global_step == (spike + 1 if on_nan == "stop" else steps)


def test_healthy_trainer_run_never_trips(tmp_path: Path) -> None:
    """GPT-2's causal attention and a clean data set: every step checked, none replayed."""
    trainer = gpt2_late.make_trainer(tmp_path / "out", poisoned=False)
    callback = attach(trainer, tmp_path / "sentinel", sentinel=True)
    train(trainer)

    assert trainer.state.global_step == gpt2_late.STEPS and callback.trips == []
    history = read_history(tmp_path / "sentinel")
    assert history.complete and not history.trips
    assert len(history.steps) == gpt2_late.STEPS and not any(s.bad for s in history.steps)
    assert all(s.loss is not None and math.isfinite(s.loss) for s in history.steps)
    assert not list((tmp_path / "sentinel").glob("replay-step-*"))


def test_trainer_grad_scaler_overflow_is_handled_not_a_trip(tmp_path: Path) -> None:
    """fp16 training's GradScaler, in Accelerate's path (its scaler, the Trainer's unscaling
    in clipping): a scale far too large overflows the gradients, the scaler skips those
    steps and lowers the scale. Handled: the sentinel does not trip."""
    steps, scale = 30, 2.0**125
    trainer = gpt2_late.make_trainer(tmp_path / "out", poisoned=False, steps=steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    trainer.accelerator.scaler = scaler  # what fp16=True sets up on a GPU
    callback = attach(trainer, tmp_path / "sentinel", sentinel=True)
    train(trainer)

    assert trainer.optimizer.scaler is scaler
    assert scaler.get_scale() < scale  # the overflow happened (and was handled)
    assert trainer.state.global_step == steps and callback.trips == []
    assert finite(trainer.model)


# -- Lightning -----------------------------------------------------------------------------------

pytest.importorskip("lightning")

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

from nanscope.integrations.lightning import NanscopeCallback as PLCallback  # noqa: E402

lightning_late = load(PROGRAMS / "real" / "lightning_late.py")
lightning_mlp = load(PROGRAMS / "lightning_mlp.py")
LATE_FILE = str(PROGRAMS / "real" / "lightning_late.py")


class FirstNonFinitePL(pl.Callback):
    """A plain fit's oracle: the first step whose loss or gradients are not finite."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.step is None and not bool(torch.isfinite(loss).all()):
            self.step = trainer.global_step

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if self.step is None and not all(bool(torch.isfinite(g).all()) for g in grads):
            self.step = trainer.global_step
        if self.step is not None:
            trainer.should_stop = True


def fit_late(
    callback: Any, *, poisoned: bool = True, spike_at: int | None = None, **options: Any
) -> tuple[Any, Any]:
    """Every Lightning fit of this module starts here (a cause in the optimizer's code is
    reported at its user frame: this function's ``fit`` line)."""
    torch.manual_seed(0)
    model = lightning_late.LogFeatures(spike_at=spike_at)
    trainer = lightning_late.make_trainer([callback], **options)
    trainer.fit(model, lightning_late.data(poisoned=poisoned))
    return trainer, model


@pytest.fixture(scope="module")
def pl_oracle(tmp_path_factory: pytest.TempPathFactory) -> Oracle:
    first = FirstNonFinitePL()
    fit_late(first)
    assert first.step is not None and first.step >= 150  # late

    recorded = PLCallback(
        tmp_path_factory.mktemp("pl-full"), circular_buffer_size=-1, stop_on_harmful=True
    )
    fit_late(recorded)
    assert recorded.analysis is not None
    cause = recorded.analysis.cause
    assert cause is not None and cause.source is not None, recorded.headline
    assert cause.step == first.step  # the full recording agrees with the plain run
    return Oracle(first.step, cause.op_type, cause.source.file, cause.source.line)


def test_lightning_sentinel_stops_at_the_bad_step_with_the_full_recordings_cause(
    pl_oracle: Oracle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = PLCallback(tmp_path, sentinel=True)
    with caplog.at_level(logging.INFO):
        trainer, model = fit_late(callback)

    k = pl_oracle.step
    (trip,) = callback.trips
    assert (trip.step, trip.action, trip.reproduced) == (k, "stop", True)
    assert trip.cause is not None
    assert (trip.cause.op_type, trip.cause.file, trip.cause.line, trip.cause.step) == (
        pl_oracle.op_type, pl_oracle.file, pl_oracle.line, k,
    )  # fmt: skip
    # The program's own line: the log of the poisoned feature.
    assert (trip.cause.file, trip.cause.op_type) == (LATE_FILE, "aten.log.default")
    assert callback.stopped_at == k and trainer.should_stop
    assert trainer.global_step == k + 1 and finite(model)
    assert callback.headline == trip.cause.headline
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("nanscope:")]
    assert said == [
        f"nanscope: Inf/NaN in the {' and '.join(trip.where)} at step {k}: training stops",
        f"nanscope: the replay of step {k}: {trip.cause.headline}",
        f"nanscope: the whole story: `nanscope report {tmp_path / 'fit-0'}`",
    ]
    check_history(tmp_path / "fit-0", k, k, "stop")
    # Nothing recorded per op: the history and the replay's dump alone.
    assert callback.analysis is None
    assert sorted(p.name for p in (tmp_path / "fit-0").iterdir()) == [
        f"replay-step-{k}", "sentinel.jsonl",
    ]  # fmt: skip


def test_lightning_sentinel_skip_finishes_with_finite_weights(
    pl_oracle: Oracle, tmp_path: Path
) -> None:
    callback = PLCallback(tmp_path, sentinel=True, on_nan="skip")
    trainer, model = fit_late(callback)

    assert trainer.global_step == lightning_late.ROWS // lightning_late.BATCH
    assert [(t.step, t.action, t.reproduced) for t in callback.trips] == [
        (pl_oracle.step, "skip", True)
    ]
    assert callback.stopped_at is None and finite(model)
    check_history(tmp_path / "fit-0", pl_oracle.step, trainer.global_step - 1, "skip")


SPIKE = 120  # the step whose learning rate is inf (lightning_late.py --spike-at)


class FirstNonFiniteUpdate(pl.Callback):
    """A plain fit's oracle: the first step after whose update the weights are not finite."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if self.step is None and not finite(pl_module):
            self.step = trainer.global_step - 1  # the step that just updated
            trainer.should_stop = True


@pytest.fixture(scope="module")
def spike_oracle(tmp_path_factory: pytest.TempPathFactory) -> Oracle:
    first = FirstNonFiniteUpdate()
    fit_late(first, poisoned=False, spike_at=SPIKE)
    assert first.step == SPIKE

    recorded = PLCallback(
        tmp_path_factory.mktemp("spike-full"), circular_buffer_size=-1, stop_on_harmful=True
    )
    fit_late(recorded, poisoned=False, spike_at=SPIKE)
    assert recorded.analysis is not None
    cause = recorded.analysis.cause
    assert cause is not None and cause.source is not None, recorded.headline
    assert cause.step == first.step
    return Oracle(first.step, cause.op_type, cause.source.file, cause.source.line)


@pytest.mark.parametrize("on_nan", ["stop", "skip"])
def test_lightning_update_born_nan_is_replayed_from_the_snapshot(
    spike_oracle: Oracle, tmp_path: Path, on_nan: str
) -> None:
    """A learning rate of inf: finite gradients, an update that writes Inf/NaN. With
    ``snapshot_state=True`` the replay runs the update from the state before it, and names
    the full recording's cause; ``skip`` puts the snapshot back and trains on."""
    callback = PLCallback(tmp_path, sentinel=True, on_nan=on_nan, snapshot_state=True)
    trainer, model = fit_late(callback, poisoned=False, spike_at=SPIKE)

    (trip,) = callback.trips
    assert (trip.step, trip.where, trip.action, trip.reproduced) == (
        SPIKE, ("parameters",), on_nan, True,
    )  # fmt: skip
    assert trip.cause is not None
    assert (trip.cause.op_type, trip.cause.file, trip.cause.line, trip.cause.step) == (
        spike_oracle.op_type, spike_oracle.file, spike_oracle.line, SPIKE,
    )  # fmt: skip
    assert finite(model)  # the step's start was put back
    steps = lightning_late.ROWS // lightning_late.BATCH
    assert trainer.global_step == (SPIKE + 1 if on_nan == "stop" else steps)


def test_lightning_update_born_nan_without_snapshot_stops_and_says_why(tmp_path: Path) -> None:
    """Without a snapshot there is no state to replay the update from, nor to skip back to:
    the trip says so and training stops, though ``skip`` was asked."""
    callback = PLCallback(tmp_path, sentinel=True, on_nan="skip")
    trainer, _ = fit_late(callback, poisoned=False, spike_at=SPIKE)

    (trip,) = callback.trips
    assert trip.action == "stop" and trip.replay is None and trip.cause is None
    assert trip.step in (SPIKE, SPIKE + 1)  # the update's step, or the next one that reads it
    assert trip.reason is not None and "snapshot_state=True" in trip.reason
    assert callback.stopped_at == trip.step and trainer.global_step == trip.step + 1


def test_lightning_mask_never_trips(tmp_path: Path) -> None:
    """An attention-style -inf mask that softmax absorbs, every step: never a trip."""
    callback = PLCallback(tmp_path, sentinel=True)
    torch.manual_seed(0)
    trainer = lightning_mlp.trainer([callback], max_steps=12)
    trainer.fit(lightning_mlp.LogMLP(masked=True), lightning_mlp.data())
    assert trainer.global_step == 12 and callback.trips == [] and callback.stopped_at is None
    history = read_history(tmp_path / "fit-0")
    assert history.complete and len(history.steps) == 12 and not history.trips


def test_lightning_grad_scaler_overflow_is_handled_not_a_trip(tmp_path: Path) -> None:
    """precision "16-mixed" with a GradScaler whose first scale overflows the gradients:
    the scaler skips those steps and lowers the scale. Handled: no trip."""
    scale = 2.0**24
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    callback = PLCallback(tmp_path, sentinel=True)
    plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    trainer, model = fit_late(callback, poisoned=False, plugins=[plugin], max_steps=40)
    assert scaler.get_scale() < scale  # the overflow happened (and was handled)
    assert trainer.global_step == 40 and callback.trips == [] and finite(model)


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("callback", [HFCallback, PLCallback])
def test_settings_that_contradict_each_other_are_refused(callback: Any) -> None:
    with pytest.raises(ValueError, match="on_nan='halt': use 'stop' or 'skip'"):
        callback("logdir", sentinel=True, on_nan="halt")
    with pytest.raises(ValueError, match="pass sentinel=True"):
        callback("logdir", on_nan="skip")
    with pytest.raises(ValueError, match="pass sentinel=True"):
        callback("logdir", snapshot_state=True)
    with pytest.raises(ValueError, match="with sentinel=True use on_nan='stop'"):
        callback("logdir", stop_on_harmful=True, sentinel=True)
