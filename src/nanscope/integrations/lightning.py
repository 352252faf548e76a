"""PyTorch Lightning: :class:`NanscopeCallback` records a fit and reports where Inf/NaN was born.

``Trainer(callbacks=[NanscopeCallback("nanscope-dump")])`` records every op of
each ``fit`` (``enable_dump_debug_info``) into ``<logdir>/fit-<N>``, numbers the
dump's steps with the trainer's ``global_step``, and at the end of the fit
writes the root cause's headline to the trainer's loggers. With
``sentinel=True`` nothing is recorded per op: a :class:`nanscope.sentinel.Sentinel`
checks each step, and the step that goes bad is run again with everything
recorded. Works with ``import lightning.pytorch`` and with the older
``pytorch_lightning`` package (docs/integrations/lightning.md).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
except ImportError:  # only the older package name is installed
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

import nanscope
from nanscope.backends.torch.suspension import not_recorded
from nanscope.integrations._checks import all_finite, check_sentinel_options, trip_lines

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from nanscope.analysis import Analysis
    from nanscope.sentinel import Sentinel, Trip

__all__ = ["NanscopeCallback"]


class NanscopeCallback(pl.Callback):
    """Record a Lightning fit with nanscope; optionally stop it at the first harmful Inf/NaN.

    **Arguments**

    - ``logdir``: the directory of the dumps; fit number N (counted across
      checkpoints: resuming with ``fit(ckpt_path=...)`` goes on counting) records
      into ``<logdir>/fit-<N>``, a dump of its own with a run id of its own.
    - ``tensor_debug_mode``, ``circular_buffer_size``: as in
      :func:`nanscope.enable_dump_debug_info`.
    - ``stop_on_harmful``: stop training (``trainer.should_stop``) at the first
      step whose loss is non-finite or whose gradients' total norm is
      non-finite (the definition of ``clip_grad_norm_(error_if_nonfinite=True)``);
      that step's update is skipped (its gradients are dropped), so the
      parameters stay finite. Inf/NaN that a mask absorbs before the loss never
      reach either, so they do not stop training. Under mixed precision with a
      ``GradScaler`` only the loss is checked (the scaler handles overflowing
      gradients). It costs one host synchronisation per optimizer step (and one
      small all-reduce under DDP, so that every rank stops at the same step).

    - ``sentinel=True``: no per-op recording. A :class:`nanscope.sentinel.Sentinel`
      writes ``<logdir>/fit-<N>/sentinel.jsonl`` and checks every optimizer step:
      the loss, the gradients before the optimizer steps, the parameters and the
      optimizer state after. At the first step that holds Inf/NaN it drops the
      step's gradients (the update is skipped) and runs the step again from the
      state it began with (the same batches, random states and buffers) with
      everything recorded into ``<logdir>/fit-<N>/replay-step-<K>``; then, as
      ``on_nan`` says, training stops (``"stop"``) or goes on without that update
      (``"skip"``). ``snapshot_state=True`` also copies the parameters and
      optimizer state before each optimizer step, so that an Inf/NaN born inside
      the optimizer's update is replayed too, and undone for ``"skip"``.
      ``tensor_debug_mode``, ``circular_buffer_size`` and ``stop_on_harmful`` are
      for the full recording; ``sentinel=True`` takes ``on_nan`` instead.

    After a fit, :attr:`analysis` holds the root cause
    (:func:`nanscope.analysis.analyze` of the fit's dump, on rank 0) and
    :attr:`headline` its one sentence; :attr:`stopped_at` is the step where
    ``stop_on_harmful`` (or the sentinel, with ``on_nan="stop"``) stopped the fit,
    else ``None``. With ``sentinel=True``, :attr:`trips` holds the sentinel's trips
    (:class:`nanscope.sentinel.Trip`: the step, what was not finite, the replay's
    dump and cause) and :attr:`headline` is the first replay's.

    Under DDP every rank records into the same ``<logdir>/fit-<N>`` (files are
    named per rank), with one run id broadcast from rank 0 and the trainer's
    global rank and world size; rank 0 analyses the dump once every rank closed
    its own.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        tensor_debug_mode: str = "FULL_HEALTH",
        circular_buffer_size: int = 1000,
        stop_on_harmful: bool = False,
        *,
        sentinel: bool = False,
        on_nan: str = "stop",
        snapshot_state: bool = False,
    ) -> None:
        super().__init__()
        check_sentinel_options(sentinel, on_nan, snapshot_state, stop_on_harmful)
        self.logdir = Path(logdir)
        self.sentinel = sentinel
        self.on_nan = on_nan
        self.snapshot_state = snapshot_state
        self.trips: list[Trip] = []
        self.tensor_debug_mode = tensor_debug_mode
        self.circular_buffer_size = circular_buffer_size
        self.stop_on_harmful = stop_on_harmful
        self.fits = 0  # fits started so far (carried by checkpoints)
        self.dump_dir: Path | None = None  # the dump of the current (or last) fit
        self.analysis: Analysis | None = None
        self.stopped_at: int | None = None
        self._session: nanscope.DebugSession | None = None
        self._bad_loss: torch.Tensor | None = None  # losses seen since the last optimizer step
        self._resumed_step: int | None = None  # the global step of the checkpoint resumed from
        self._guard: Sentinel | None = None  # sentinel=True: the fit's sentinel
        self._hooks: list[RemovableHandle] = []  # its optimizer step hooks
        self._step: int | None = None  # the global step the sentinel's open step began at
        self._batches: list[tuple[Any, int]] = []  # that step's batches (one per micro-batch)
        self._replaying = False
        self._trainer: Any = None  # the fit's trainer and module, for the optimizer step hook
        self._module: Any = None

    @property
    def headline(self) -> str | None:
        """The root cause in one sentence, ``None`` when nothing was analysed or found."""
        if self.sentinel:
            causes = [t.cause.headline for t in self.trips if t.cause is not None]
            return causes[0] if causes else None
        if self.analysis is None:
            return None
        from nanscope.report import headline

        return headline(self.analysis)

    # -- recording -------------------------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Here, not in setup(): callbacks' state is restored from a checkpoint before this
        # hook, so that a resumed fit knows its number. The process group exists already.
        self.analysis, self.stopped_at, self._bad_loss = None, None, None
        self.dump_dir = self.logdir / f"fit-{self.fits}"
        self.fits += 1
        if self.sentinel:
            self._start_sentinel(trainer, pl_module)
            return
        self._session = nanscope.enable_dump_debug_info(
            self.dump_dir,
            self.tensor_debug_mode,
            self.circular_buffer_size,
            framework="torch",
            run_id=self._run_id(trainer),
            # Lightning's launcher sets WORLD_SIZE but not RANK: say both.
            rank=trainer.global_rank if trainer.world_size > 1 else None,
            world_size=trainer.world_size if trainer.world_size > 1 else None,
        )
        # A resumed fit restores its global step only after this hook: what runs before
        # its first batch (restoring, the sanity check) gets the checkpoint's step.
        step, self._resumed_step = self._resumed_step, None
        self._session.set_step(trainer.global_step if step is None else step)

    @staticmethod
    def _run_id(trainer: pl.Trainer) -> str:
        """One id for this fit on every rank: the user's ``NANSCOPE_RUN_ID``, else rank 0's.

        A fresh one per fit (the master address and port that nanscope would
        derive one from stay the same for every fit of a process).
        """
        chosen = os.environ.get("NANSCOPE_RUN_ID") or uuid.uuid4().hex[:8]
        return str(trainer.strategy.broadcast(chosen, src=0))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._session is not None:  # the global step is restored by now
            self._session.set_step(trainer.global_step)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The trainer's step numbers the dump's: a resumed fit goes on with its numbers.
        if self._session is not None:
            self._session.set_step(trainer.global_step)
        if self._guard is not None and not self._replaying:
            self._begin_batch(trainer, batch, batch_idx)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # The optimizer step that the step hook did not see (a GradScaler skipped it, or
        # an optimizer without step hooks): the trainer counted it, close the step here.
        if self._guard is not None and self._step is not None and trainer.global_step != self._step:
            try:
                self._end_step(trainer, pl_module, None)
            except Exception as exc:
                self._give_up(exc)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._guard is not None:
            self._stop_sentinel()
            return
        if self._session is None:
            return
        self._close()
        trainer.strategy.barrier("nanscope")  # every rank's files are complete
        if trainer.is_global_zero:
            self._report(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        from nanscope.sentinel._errors import error_words

        # The history says the fit ended by this error: the steps after it were never checked.
        self._stop_sentinel(error_words(exception))
        if self._session is None:
            return
        self._close()
        # No barrier on the way out (another rank may never come); one process: report.
        if trainer.world_size == 1:
            self._report(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop_sentinel()
        self._close()

    def _close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()  # never raises

    def _report(self, trainer: pl.Trainer) -> None:
        """Analyse the fit's dump; its headline goes to the loggers and the console."""
        from nanscope.analysis import analyze
        from nanscope.report import headroom_warnings

        try:
            with nanscope.open_dump(self.dump_dir) as reader:  # type: ignore[arg-type]
                self.analysis = analyze(reader)
        except Exception as exc:  # a debugging aid must not fail the fit
            rank_zero_info(f"nanscope: could not analyse {self.dump_dir}: {exc}")
            return
        headline = self.headline
        if headline is None:
            headline = "harmful Inf/NaN" if self.analysis.found_harmful else "no Inf/NaN recorded"
        text = f"nanscope: {headline} (`nanscope report {self.dump_dir}`)"
        warnings = [f"nanscope: {w}" for w in headroom_warnings(self.analysis)[:3]]
        for line in (text, *warnings):
            rank_zero_info(line)
        for logger in trainer.loggers:
            experiment: Any = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_text"):  # TensorBoard's SummaryWriter
                experiment.add_text("nanscope", "\n\n".join((text, *warnings)), trainer.global_step)

    # -- stop_on_harmful -------------------------------------------------------------------------

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._guard is not None:
            if not self._replaying and self._step is not None:
                try:
                    self._observe_loss(trainer, loss)
                except Exception as exc:
                    self._give_up(exc)
            return
        if not self.stop_on_harmful:
            return
        with not_recorded():  # nanscope's check is not the user's computation
            bad = ~torch.isfinite(loss.detach()).all()  # no host sync yet
            self._bad_loss = bad if self._bad_loss is None else self._bad_loss | bad

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._guard is not None:
            if not self._replaying and self._step is not None:
                self._check_gradients(trainer, pl_module, optimizer)
            return
        if not self.stop_on_harmful or self.stopped_at is not None:
            return
        grads = _gradients(optimizer)
        with not_recorded():
            bad_loss, self._bad_loss = self._bad_loss, None
            found = bool(bad_loss) if bad_loss is not None else False
            # The same check as the Hugging Face callback's: a non-finite gradient value
            # (not a norm that overflows on finite values); under a GradScaler overflowing
            # gradients are skipped steps, not harm.
            if not found and not _scaler_handles_overflow(trainer):
                found = not all_finite(grads)
            if trainer.world_size > 1:  # every rank stops at the same step
                found = trainer.strategy.reduce_boolean_decision(found, all=False)
        if not found:
            return
        self.stopped_at = trainer.global_step
        for group in optimizer.param_groups:  # skip this update: the parameters stay finite
            for p in group["params"]:
                p.grad = None
        trainer.should_stop = True
        rank_zero_info(
            f"nanscope: harmful Inf/NaN at step {self.stopped_at} (a non-finite loss or "
            "gradient): training stops"
        )

    # -- sentinel=True -----------------------------------------------------------------------------

    def _start_sentinel(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A sentinel for this fit, and a hook after each optimizer step (the optimizers exist:
        the strategy set them up before ``on_fit_start``)."""
        from nanscope.sentinel import Sentinel

        self.trips = []
        optimizers = list(trainer.optimizers)
        logdir = self.dump_dir
        assert logdir is not None
        if trainer.world_size > 1:  # one history per rank
            logdir = logdir / f"rank-{trainer.global_rank}"
        self._trainer, self._module = trainer, pl_module
        try:
            self._guard = Sentinel(
                logdir,
                model=pl_module,
                optimizer=optimizers[0] if len(optimizers) == 1 else optimizers,
                on_nan=self.on_nan,
                snapshot_state=self.snapshot_state,
                run_id=self._run_id(trainer),
            )
            # After the update, before Lightning counts the step or steps a scheduler: the
            # step is closed, and replayed, with the trainer still at its global step.
            self._hooks = [opt.register_step_post_hook(self._after_update) for opt in optimizers]
        except Exception as exc:  # a debugging aid must not fail the fit
            self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        rank_zero_warn(f"nanscope: the sentinel failed ({_first_line(exc)}); it stops here")
        self._stop_sentinel()

    def _stop_sentinel(self, error: str | None = None) -> None:
        """Remove the hooks and close the history (never raises); ``error``: the exception
        ending the fit, in words, when one is."""
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook.remove()
        guard, self._guard = self._guard, None
        self._step, self._batches, self._bad_loss = None, [], None
        if guard is None:
            return
        try:
            guard.close(error)
        except Exception as exc:
            rank_zero_warn(f"nanscope: closing the sentinel failed ({_first_line(exc)})")
            return
        if not self.trips:
            rank_zero_info(
                f"nanscope: the sentinel saw no Inf/NaN (`nanscope report {self.dump_dir}`)"
            )

    def _begin_batch(self, trainer: pl.Trainer, batch: Any, batch_idx: int) -> None:
        """A step begins with its first batch (with gradient accumulation, several make it)."""
        assert self._guard is not None
        try:
            if self._step is None:
                self._step, self._batches, self._bad_loss = trainer.global_step, [], None
                self._guard.begin_step(trainer.global_step, batch=batch)
            self._batches.append((batch, batch_idx))
        except Exception as exc:
            self._give_up(exc)

    def _observe_loss(self, trainer: pl.Trainer, loss: torch.Tensor) -> None:
        assert self._guard is not None
        scale = getattr(getattr(trainer.precision_plugin, "scaler", None), "_scale", None)
        with not_recorded():
            if isinstance(scale, torch.Tensor):  # a GradScaler's loss is scaled
                loss = loss.detach() / scale
                bad = ~torch.isfinite(loss).all()  # read in on_before_optimizer_step
                self._bad_loss = bad if self._bad_loss is None else self._bad_loss | bad
        self._guard.observe_loss(loss)

    def _check_gradients(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Before the update: a bad step's gradients are dropped and the step replayed now."""
        assert self._guard is not None
        try:
            bad_loss, self._bad_loss = self._bad_loss, None
            if _scaler_handles_overflow(trainer) and not all_finite(_gradients(optimizer)):
                # Overflowing gradients are the GradScaler's to skip (it will): only a
                # non-finite loss is harm.
                with not_recorded():
                    bad = bad_loss is not None and bool(bad_loss)
            else:
                bad = self._guard.before_optimizer_step(optimizer)  # drops a bad update
            if bad:
                # The update is skipped: the parameters are the step's start, and the
                # replay runs with the trainer at this step, before any scheduler moves.
                self._end_step(trainer, pl_module, optimizer, updated=False)
        except Exception as exc:
            self._give_up(exc)

    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's step hook: close the step (parameters and state checked)."""
        if self._guard is None or self._replaying or self._step is None:
            return
        try:
            self._end_step(self._trainer, self._module, optimizer, updated=True)
        except Exception as exc:
            self._give_up(exc)

    def _end_step(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        optimizer: torch.optim.Optimizer | None,
        updated: bool = True,
    ) -> None:
        assert self._guard is not None
        step, batches = self._step, self._batches
        self._step, self._batches, self._bad_loss = None, [], None
        assert step is not None
        for opt in [optimizer] if optimizer is not None else trainer.optimizers:
            self._guard.after_optimizer_step(opt)
        if optimizer is None and trainer.optimizers:
            optimizer = trainer.optimizers[0]
        record = self._guard.end_step()
        if record.bad:
            self._trip(trainer, pl_module, optimizer, step, batches, updated)

    def _trip(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        optimizer: torch.optim.Optimizer | None,
        step: int,
        batches: list[tuple[Any, int]],
        updated: bool,
    ) -> None:
        """Replay the bad step with everything recorded, say what it found, stop or skip."""
        assert self._guard is not None
        # An Inf/NaN born in the update is replayed with the update (the sentinel replays
        # it only from a snapshot of the state before it: snapshot_state=True).
        with_update = updated and self.snapshot_state

        def again() -> torch.Tensor | None:
            return _run_step_again(trainer, pl_module, optimizer, batches, with_update)

        # The sentinel restores the step's start, runs it recorded, then puts the start
        # back with no gradients: the update stays skipped.
        self._replaying = True
        try:
            trip = self._guard.replay(again)
        finally:
            self._replaying = False
        self.trips.append(trip)
        for line in trip_lines(trip, self.dump_dir):
            rank_zero_info(line)
        if trip.action == "stop":
            self.stopped_at = step
            trainer.should_stop = True

    # -- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed fit needs: where the dumps go and how many fits came before."""
        return {"logdir": str(self.logdir), "fits": self.fits}

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Called before on_fit_start (for most strategies), with the whole checkpoint.
        self._resumed_step = int(checkpoint.get("global_step", 0))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # The logdir given to this callback wins (the checkpoint may come from elsewhere);
        # the count goes on, so that a resumed fit does not overwrite an earlier one.
        self.fits = max(self.fits, int(state_dict.get("fits", 0)))


def _run_step_again(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    optimizer: torch.optim.Optimizer | None,
    batches: list[tuple[Any, int]],
    with_update: bool,
) -> torch.Tensor | None:
    """One training step as the trainer runs it: ``training_step`` on each of its batches
    (under the precision plugin's autocast), the backward pass of each loss (divided by
    ``accumulate_grad_batches``, as Lightning does), then, with ``with_update``, the
    trainer's gradient clipping and the optimizer step. ``self.log`` does nothing meanwhile
    (the trainer logged this step already). Returns the step's loss, summed over batches."""
    automatic = pl_module.automatic_optimization
    total: torch.Tensor | None = None
    pl_module.zero_grad(set_to_none=True)
    quiet = ("log", "log_dict")
    for name in quiet:
        object.__setattr__(pl_module, name, _no_log)
    try:
        with torch.enable_grad():
            for batch, batch_idx in batches:
                with trainer.precision_plugin.train_step_context():
                    out = pl_module.training_step(batch, batch_idx)
                loss = out.get("loss") if isinstance(out, Mapping) else out
                if not isinstance(loss, torch.Tensor):
                    continue
                loss = loss / trainer.accumulate_grad_batches
                total = loss.detach() if total is None else total + loss.detach()
                if automatic:
                    loss.backward()
        if with_update and automatic and optimizer is not None:
            pl_module.configure_gradient_clipping(
                optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm
            )
            optimizer.step()
    finally:
        for name in quiet:
            object.__delattr__(pl_module, name)
    return total


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None


def _gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    return [g._values() if g.is_sparse else g for g in grads]  # nn.Embedding(sparse=True)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _scaler_handles_overflow(trainer: pl.Trainer) -> bool:
    """Mixed precision with a GradScaler: overflowing gradients are skipped steps, not harm."""
    return getattr(trainer.precision_plugin, "scaler", None) is not None
