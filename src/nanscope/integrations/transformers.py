"""Record a Hugging Face ``Trainer`` run: :class:`NanscopeCallback` and :func:`attach`.

    from nanscope.integrations.transformers import NanscopeCallback

    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[NanscopeCallback("/tmp/nanscope-dump")])
    trainer.train()   # at the end: "nanscope: aten.log.default produced -inf at step 37: ..."

The callback turns recording on when training begins and off when it ends, numbers the
dump's steps with the Trainer's global step, and at the end analyses the dump on the main
process and writes the headline to the Trainer's log. With ``stop_on_harmful=True`` it
also stops training at the first step whose gradients are not finite (see
:class:`NanscopeCallback`). With ``sentinel=True`` nothing is recorded per op: a
:class:`nanscope.sentinel.Sentinel` checks each step, and the step that goes bad is run
again, with the Trainer's own ``training_step`` on the same inputs, with everything
recorded. docs/integrations/transformers.md describes it.

``transformers`` is imported here, not by ``nanscope``: importing ``nanscope`` never
imports it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from nanscope.api import DebugSession, enable_dump_debug_info
from nanscope.integrations._checks import all_finite, check_sentinel_options, trip_lines

if TYPE_CHECKING:
    from nanscope.sentinel import Sentinel, Trip

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
    - ``sentinel=True``: no per-op recording. A :class:`nanscope.sentinel.Sentinel` writes
      ``<logdir>/sentinel.jsonl`` and checks every optimizer step (the loss, the gradients
      after the Trainer's clipping, the parameters and optimizer state after the update);
      the callback keeps each step's inputs (every micro-batch, by wrapping the Trainer's
      ``training_step``). At a step that holds Inf/NaN the update is dropped and the step
      is run again from the state it began with, on the same inputs, with the Trainer's
      own ``training_step`` and clipping, recorded into ``<logdir>/replay-step-<K>``; then
      training stops (``on_nan="stop"``: ``control.should_training_stop``) or goes on
      without that update (``"skip"``). ``snapshot_state=True`` copies the parameters and
      optimizer state before each update, so that an Inf/NaN born in the update itself is
      replayed, with the update, and undone. :attr:`trips` holds the trips; the callback
      needs the Trainer: found from the hook's caller, or given by :func:`attach`.

    Nothing this callback does raises into training: an error is logged as a warning and
    recording stops.
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
        check_sentinel_options(sentinel, on_nan, snapshot_state, stop_on_harmful)
        self.logdir = os.fspath(logdir)
        self.tensor_debug_mode = tensor_debug_mode
        self.circular_buffer_size = circular_buffer_size
        self.stop_on_harmful = stop_on_harmful
        self.sentinel = sentinel
        self.on_nan = on_nan
        self.snapshot_state = snapshot_state
        self.trips: list[Trip] = []  # sentinel=True: where it tripped and what the replays found
        self._trainer: Any = None  # the Trainer (set by attach, or found at on_train_begin)
        self._guard: Sentinel | None = None
        self._step_open = False  # between on_step_begin and the step's end
        self._inputs: list[tuple[Any, Any, Any]] = []  # the step's (model, inputs, num_items)
        self._wrapped: tuple[Any, Any] | None = None  # (the training_step replaced, the old one)
        self._original_step: Any = None  # the Trainer's training_step that the wrapper calls
        self._bad_loss: Any = None  # under a GradScaler: the losses' finiteness, on the device
        self._replaying = False
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
        if self.sentinel:
            self._start_sentinel(kw.get("model"), kw.get("optimizer"))
            return
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
        if self._guard is not None:
            self._guard.begin_step(state.global_step)
            self._step_open, self._inputs, self._bad_loss = True, [], None

    @_guarded
    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, optimizer = kw.get("model"), kw.get("optimizer")
        if self._guard is not None:
            if self._step_open:
                self._check_gradients(args, state, control, model, optimizer)
            return
        if not self.stop_on_harmful or model is None or _has_scaler(optimizer):
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self._check(state, control, "gradient", grads)

    @_guarded
    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, optimizer = kw.get("model"), kw.get("optimizer")
        if self._guard is not None:
            if self._step_open:
                self._end_step(args, state, control, model, optimizer, updated=True)
            return
        if not self.stop_on_harmful or model is None or not _has_scaler(optimizer):
            return
        # The GradScaler skipped any step whose gradients were not finite: only an Inf/NaN
        # that got past it into the weights is harmful.
        self._check(state, control, "parameter", [p.detach() for p in model.parameters()])

    @_guarded
    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.sentinel:
            if self._guard is not None and not self.trips:
                _say(f"nanscope: the sentinel saw no Inf/NaN (nanscope report {self.logdir})")
            self._close()
            return
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
        self._stop_sentinel()

    # -- sentinel=True --------------------------------------------------------------------------

    def _start_sentinel(self, model: Any, optimizer: Any) -> None:
        """A sentinel for this run, and the Trainer's ``training_step`` wrapped to keep inputs."""
        from nanscope.sentinel import Sentinel

        trainer = self._trainer if self._trainer is not None else _find_trainer(self)
        if trainer is None:
            raise RuntimeError(
                "sentinel=True needs the Trainer and could not find it: add the callback "
                "with nanscope.integrations.transformers.attach(trainer, logdir, sentinel=True)"
            )
        self._trainer = trainer
        self.trips, self.headline = [], None
        self._guard = Sentinel(
            self.logdir,
            model=model,
            optimizer=_torch_optimizer(optimizer),
            on_nan=self.on_nan,
            snapshot_state=self.snapshot_state,
        )
        old = trainer.__dict__.get("training_step")
        original = trainer.training_step

        def training_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            keep = self._guard is not None and self._step_open and not self._replaying
            if keep:  # a shallow copy: the Trainer's preparation builds dicts of its own
                kept = dict(inputs) if isinstance(inputs, Mapping) else inputs
                self._inputs.append((model, kept, (args, kwargs)))
            loss = original(model, inputs, *args, **kwargs)
            if keep and self._guard is not None:
                self._observe_loss(loss)
            return loss

        trainer.training_step = training_step
        self._wrapped = (training_step, old)
        self._original_step = original

    def _stop_sentinel(self) -> None:
        """Put the Trainer's ``training_step`` back and close the history (never raises)."""
        wrapped, self._wrapped = self._wrapped, None
        if wrapped is not None and self._trainer is not None:
            ours, old = wrapped
            if self._trainer.__dict__.get("training_step") is ours:
                if old is None:
                    del self._trainer.training_step
                else:
                    self._trainer.training_step = old
        guard, self._guard = self._guard, None
        self._step_open, self._inputs, self._bad_loss = False, [], None
        if guard is not None:
            try:
                guard.close()
            except Exception as exc:
                logger.warning("nanscope: closing the sentinel failed (%s)", _first_line(exc))

    def _observe_loss(self, loss: Any) -> None:
        assert self._guard is not None
        self._guard.observe_loss(loss)
        import torch

        from nanscope.backends.torch.suspension import not_recorded

        if isinstance(loss, torch.Tensor) and self._scaled():
            with not_recorded():  # read only when a GradScaler finds an overflow
                bad = ~torch.isfinite(loss.detach()).all()
                self._bad_loss = bad if self._bad_loss is None else self._bad_loss | bad

    def _scaled(self) -> bool:
        return self._trainer is not None and _has_scaler(getattr(self._trainer, "optimizer", None))

    def _check_gradients(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any,
        optimizer: Any,
    ) -> None:
        """Before the update: a bad step's update is dropped and the step replayed now."""
        assert self._guard is not None
        raw = _torch_optimizer(optimizer)
        if _has_scaler(optimizer):
            # Unscale now (the GradScaler does it in its step otherwise, and refuses twice):
            # the gradients are read as they are, and the scaler's step skips an overflow.
            with contextlib.suppress(RuntimeError):  # the Trainer's clipping unscaled them
                optimizer.scaler.unscale_(raw)
            grads = [p.grad for g in raw.param_groups for p in g["params"] if p.grad is not None]
            if not all_finite(grads):
                # An overflow: the scaler skips this update (handled); a loss that is not
                # finite is still harm.
                bad_loss, self._bad_loss = self._bad_loss, None
                if bad_loss is not None and bool(bad_loss):
                    self._end_step(args, state, control, model, optimizer, updated=False)
                return
        if self._guard.before_optimizer_step(raw):  # the update is dropped
            self._end_step(args, state, control, model, optimizer, updated=False)

    def _end_step(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any,
        optimizer: Any,
        updated: bool,
    ) -> None:
        assert self._guard is not None
        inputs = self._inputs
        self._step_open, self._inputs, self._bad_loss = False, [], None
        self._guard.after_optimizer_step(_torch_optimizer(optimizer))
        record = self._guard.end_step()
        if not record.bad:
            return
        # An Inf/NaN born in the update is replayed with it (the sentinel replays such a
        # step only from a snapshot: snapshot_state=True); under a GradScaler, the scaler's
        # state belongs to the run: the replay is the forward and backward passes.
        scaled = _has_scaler(optimizer)
        with_update = updated and self.snapshot_state and not scaled
        trainer, step = self._trainer, self._original_step

        def again() -> Any:
            return _run_step_again(trainer, step, args, inputs, optimizer, not scaled, with_update)

        self._replaying = True
        try:
            trip = self._guard.replay(again)
        finally:
            self._replaying = False
        self.trips.append(trip)
        if self.headline is None and trip.cause is not None:
            self.headline = trip.cause.headline
        for line in trip_lines(trip, self.logdir):
            _say(line)
        if trip.action == "stop":
            self.harmful_step = state.global_step
            control.should_training_stop = True

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


def _say(text: str) -> None:
    logger.info(text)
    print(text, file=sys.stderr, flush=True)


def _find_trainer(callback: NanscopeCallback) -> Any:
    """The ``Trainer`` whose hook is calling: the nearest caller's ``self`` that holds
    ``callback`` (a ``TrainerCallback`` is given no reference to its Trainer)."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and callback in candidate.callback_handler.callbacks:
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _torch_optimizer(optimizer: Any) -> Any:
    """The ``torch.optim`` optimizer inside Accelerate's wrapper (its hooks run on that one)."""
    return getattr(optimizer, "optimizer", optimizer)


def _run_step_again(
    trainer: Any,
    step: Callable[..., Any],
    args: TrainingArguments,
    inputs: list[tuple[Any, Any, Any]],
    optimizer: Any,
    clip: bool,
    with_update: bool,
) -> Any:
    """The step as the Trainer runs it: its ``training_step`` on each micro-batch's inputs,
    then (``clip``) its gradient clipping and (``with_update``) the optimizer step. Returns
    the step's loss (the sum of the micro-batches')."""
    total = None
    for model, batch, (rest, kwargs) in inputs:
        loss = step(model, batch, *rest, **kwargs)
        total = loss if total is None else total + loss
    model = inputs[0][0] if inputs else trainer.model
    if clip and args.max_grad_norm is not None and args.max_grad_norm > 0:
        clip_grad_norm = getattr(trainer, "_clip_grad_norm", None)
        if clip_grad_norm is not None:
            clip_grad_norm(model)
        else:  # transformers before 5
            trainer.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
    if with_update:
        optimizer.step()
    return total


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
    *,
    sentinel: bool = False,
    on_nan: str = "stop",
    snapshot_state: bool = False,
) -> NanscopeCallback:
    """Add a :class:`NanscopeCallback` to ``trainer`` (``trainer.add_callback``); returns it.

    Unlike ``Trainer(callbacks=[...])``, this also finds the Trainer's
    ``TensorBoardCallback`` (``report_to="tensorboard"``), whose writer then gets the
    headline as text, and gives the callback the Trainer (``sentinel=True`` replays the
    Trainer's steps).
    """
    callback = NanscopeCallback(
        logdir,
        tensor_debug_mode,
        circular_buffer_size,
        stop_on_harmful,
        sentinel=sentinel,
        on_nan=on_nan,
        snapshot_state=snapshot_state,
    )
    callback._trainer = trainer
    trainer.add_callback(callback)
    for other in trainer.callback_handler.callbacks:
        if type(other).__name__ == "TensorBoardCallback":
            callback._tensorboard = other
    return callback
