"""PyTorch Lightning: :class:`NanscopeCallback` records a fit and reports where Inf/NaN was born.

``Trainer(callbacks=[NanscopeCallback("nanscope-dump")])`` records every op of
each ``fit`` (``enable_dump_debug_info``) into ``<logdir>/fit-<N>``, numbers the
dump's steps with the trainer's ``global_step``, and at the end of the fit
writes the root cause's headline to the trainer's loggers. Works with
``import lightning.pytorch`` and with the older ``pytorch_lightning`` package
(docs/integrations/lightning.md).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities import rank_zero_info
except ImportError:  # only the older package name is installed
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.utilities import rank_zero_info

import nanscope
from nanscope.backends.torch.suspension import not_recorded
from nanscope.integrations._checks import all_finite

if TYPE_CHECKING:
    from nanscope.analysis import Analysis

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

    After a fit, :attr:`analysis` holds the root cause
    (:func:`nanscope.analysis.analyze` of the fit's dump, on rank 0) and
    :attr:`headline` its one sentence; :attr:`stopped_at` is the step where
    ``stop_on_harmful`` stopped the fit, else ``None``.

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
    ) -> None:
        super().__init__()
        self.logdir = Path(logdir)
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

    @property
    def headline(self) -> str | None:
        """The root cause in one sentence, ``None`` when nothing was analysed or found."""
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

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._session is None:
            return
        self._close()
        trainer.strategy.barrier("nanscope")  # every rank's files are complete
        if trainer.is_global_zero:
            self._report(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self._session is None:
            return
        self._close()
        # No barrier on the way out (another rank may never come); one process: report.
        if trainer.world_size == 1:
            self._report(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
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
        if not self.stop_on_harmful:
            return
        with not_recorded():  # nanscope's check is not the user's computation
            bad = ~torch.isfinite(loss.detach()).all()  # no host sync yet
            self._bad_loss = bad if self._bad_loss is None else self._bad_loss | bad

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if not self.stop_on_harmful or self.stopped_at is not None:
            return
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        grads = [g._values() if g.is_sparse else g for g in grads]  # nn.Embedding(sparse=True)
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


def _scaler_handles_overflow(trainer: pl.Trainer) -> bool:
    """Mixed precision with a GradScaler: overflowing gradients are skipped steps, not harm."""
    return getattr(trainer.precision_plugin, "scaler", None) is not None
