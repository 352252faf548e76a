"""Record a Hugging Face ``Trainer`` run: :class:`NanscopeCallback` and :func:`attach`.

    from nanscope.integrations.transformers import NanscopeCallback

    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[NanscopeCallback("/tmp/nanscope-dump")])
    trainer.train()   # at the end: "nanscope: aten.log.default produced -inf at step 37: ..."

The callback turns recording on when training begins and off when it ends, numbers the
dump's steps with the Trainer's global step, and at the end analyses the dump on the main
process and writes the headline to the Trainer's log. With ``stop_on_harmful=True`` it
also stops training at the first step whose gradients are not finite (see
:class:`NanscopeCallback`). docs/integrations/transformers.md describes it.

``transformers`` is imported here, not by ``nanscope``: importing ``nanscope`` never
imports it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nanscope.api import DebugSession, enable_dump_debug_info
from nanscope.integrations._checks import all_finite

__all__ = ["NanscopeCallback", "attach"]

logger = logging.getLogger("nanscope.integrations.transformers")

_Hook = TypeVar("_Hook", bound=Callable[..., Any])


def _guarded(hook: _Hook) -> _Hook:
    """Run a hook so that nothing it raises reaches the training loop.

    A debugger that stops a healthy training run is worse than none: on an error the
    callback says so once, stops recording and does nothing more.
    """

    @functools.wraps(hook)
    def run(self: NanscopeCallback, *args: Any, **kwargs: Any) -> Any:
        if self._failed:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as exc:
            self._failed = True
            logger.warning(
                "nanscope: %s failed (%s); recording stops here", hook.__name__, _first_line(exc)
            )
            self._close()
            return None

    return run  # type: ignore[return-value]


class NanscopeCallback(TrainerCallback):
    """A ``TrainerCallback`` that records training into a tfdbg2 dump and explains its Inf/NaN.

    - ``on_train_begin``: :func:`nanscope.enable_dump_debug_info` (``logdir``,
      ``tensor_debug_mode``, ``circular_buffer_size``); ``on_train_end`` closes it. The
      Trainer has no hook for an exception: a run that raises is closed by nanscope's
      exit handler (the dump stays readable with ``nanscope report``).
    - ``on_step_begin``: the dump's step is ``state.global_step`` (the number of steps done
      before it, so 0 for the first step; a run resumed from ``checkpoint-N`` goes on at N).
      The Trainer logs a step's loss with ``global_step`` after it, one more.
    - At the end of training, on the main process: :func:`nanscope.analysis.analyze` of the
      dump; its headline goes to the ``logging`` logger ``nanscope.integrations.transformers``,
      to stdout and, when a ``TensorBoardCallback`` is known (see :func:`attach`), to
      TensorBoard as text. :attr:`analysis` and :attr:`headline` keep it.
    - ``stop_on_harmful=True``: sets ``control.should_training_stop`` at the first *harmful*
      Inf/NaN, which is, cheaply: a gradient of the model that is NaN or ±inf when the
      optimizer is about to step (after the Trainer's clipping). One fused norm over all
      gradients and one host sync per step. Inf/NaN that do not reach the gradients, such as
      the ``-inf`` of a causal attention mask that softmax absorbs, never stop training.
      Under fp16 mixed precision a GradScaler skips steps with non-finite gradients
      (handled, not harmful): there the check looks at the parameters after the optimizer
      step instead. The step that made the NaN completes (a callback cannot skip the
      Trainer's optimizer step); training stops after it, with ``state.global_step`` one
      past the dump's step. :attr:`harmful_step` is that dump step.

    Nothing this callback does raises into training: an error is logged as a warning and
    recording stops.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        tensor_debug_mode: str = "FULL_HEALTH",
        circular_buffer_size: int = 1000,
        stop_on_harmful: bool = False,
    ) -> None:
        self.logdir = os.fspath(logdir)
        self.tensor_debug_mode = tensor_debug_mode
        self.circular_buffer_size = circular_buffer_size
        self.stop_on_harmful = stop_on_harmful
        self.session: DebugSession | None = None
        self.analysis: Any = None  # nanscope.analysis.Analysis, after training
        self.headline: str | None = None  # the line written at the end of training
        self.harmful_step: int | None = None  # the dump step whose gradients were not finite
        self.tb_writer: Any = None  # the TensorBoard SummaryWriter, when attach() found one
        self._tensorboard: Any = None  # the Trainer's TensorBoardCallback (set by attach)
        self._failed = False

    # -- recording ------------------------------------------------------------------------------

    @_guarded
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.session = enable_dump_debug_info(
            self.logdir,
            tensor_debug_mode=self.tensor_debug_mode,
            circular_buffer_size=self.circular_buffer_size,
            framework="torch",
        )
        # The state is the checkpoint's already: what runs before the first step (skipping
        # the batches done) belongs with the step it resumes at, not with a step 0.
        self.session.set_step(state.global_step)
        if self._tensorboard is not None:
            # Its writer exists from its own on_train_begin (it runs before this one) and
            # is closed by its on_train_end, before ours: keep it to write to afterwards.
            self.tb_writer = getattr(self._tensorboard, "tb_writer", None)

    @_guarded
    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.session is not None:
            self.session.set_step(state.global_step)

    @_guarded
    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, optimizer = kw.get("model"), kw.get("optimizer")
        if not self.stop_on_harmful or model is None or _has_scaler(optimizer):
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self._check(state, control, "gradient", grads)

    @_guarded
    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, optimizer = kw.get("model"), kw.get("optimizer")
        if not self.stop_on_harmful or model is None or not _has_scaler(optimizer):
            return
        # The GradScaler skipped any step whose gradients were not finite: only an Inf/NaN
        # that got past it into the weights is harmful.
        self._check(state, control, "parameter", [p.detach() for p in model.parameters()])

    @_guarded
    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._close()
        _barrier()  # every rank's dump is complete before the main process reads them
        if state.is_world_process_zero:
            self._report(state)

    # -- helpers --------------------------------------------------------------------------------

    def _check(
        self, state: TrainerState, control: TrainerControl, what: str, tensors: list[Any]
    ) -> None:
        """Stop training when ``tensors`` are not all finite."""
        try:
            finite = all_finite(tensors)
        except Exception as exc:
            # A layout the fused check cannot read (sparse gradients, ...): only the check
            # goes, recording goes on.
            self.stop_on_harmful = False
            logger.warning(
                "nanscope: cannot check %ss (%s); stop_on_harmful is off", what, _first_line(exc)
            )
            return
        if finite:
            return
        if self.harmful_step is None:
            self.harmful_step = state.global_step
            logger.warning(
                "nanscope: a %s is NaN or Inf at step %d: stopping training (stop_on_harmful)",
                what,
                state.global_step,
            )
        control.should_training_stop = True

    def _close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()  # never raises

    def _report(self, state: TrainerState) -> None:
        from nanscope.analysis import analyze
        from nanscope.reader import open_dump
        from nanscope.report import headline as headline_of
        from nanscope.report import headroom_warnings

        self.analysis = analyze(open_dump(self.logdir))
        headline = headline_of(self.analysis)
        if headline is None:
            headline = (
                "harmful Inf/NaN, cause not found" if self.analysis.found_harmful else "no Inf/NaN"
            )
        self.headline = headline
        line = f"nanscope: {headline} (nanscope report {self.logdir})"
        warnings = [f"nanscope: {w}" for w in headroom_warnings(self.analysis)[:3]]
        for text in (line, *warnings):
            logger.info(text)
            print(text, file=sys.stderr, flush=True)
        if self.tb_writer is not None:
            # The Trainer's logs are numbers; TensorBoard takes the sentence as text.
            # A closed torch SummaryWriter opens its file again for this: close it after.
            self.tb_writer.add_text("nanscope/headline", headline, state.global_step)
            if warnings:
                self.tb_writer.add_text(
                    "nanscope/headroom", "\n\n".join(warnings), state.global_step
                )
            self.tb_writer.close()


def _first_line(exc: BaseException) -> str:
    """The exception in one line (PyTorch's dispatch errors go on for a page)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _has_scaler(optimizer: Any) -> bool:
    """Whether Accelerate's optimizer steps through a GradScaler (fp16 mixed precision)."""
    return getattr(optimizer, "scaler", None) is not None


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def attach(
    trainer: Any,
    logdir: str | os.PathLike[str],
    tensor_debug_mode: str = "FULL_HEALTH",
    circular_buffer_size: int = 1000,
    stop_on_harmful: bool = False,
) -> NanscopeCallback:
    """Add a :class:`NanscopeCallback` to ``trainer`` (``trainer.add_callback``); returns it.

    Unlike ``Trainer(callbacks=[...])``, this also finds the Trainer's
    ``TensorBoardCallback`` (``report_to="tensorboard"``), whose writer then gets the
    headline as text.
    """
    callback = NanscopeCallback(logdir, tensor_debug_mode, circular_buffer_size, stop_on_harmful)
    trainer.add_callback(callback)
    for other in trainer.callback_handler.callbacks:
        if type(other).__name__ == "TensorBoardCallback":
            callback._tensorboard = other
    return callback
