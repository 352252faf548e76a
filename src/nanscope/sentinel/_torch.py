"""The PyTorch sentinel: a fused check per training step, and the replay of the step gone bad.

Per step (docs/SENTINEL.md, "What it costs"):

- before each optimizer step, the gradients' total 2-norm (``torch._foreach_norm``)
  and the loss's finiteness, read with one host sync: the update is dropped there
  (gradients set to ``None``) when either is not finite, so the parameters stay as
  the step began;
- after it, the parameters' total 2-norm, kept on the device and read at
  :meth:`Sentinel.end_step` together with the loss;
- every ``detail_every`` steps also the largest ``|x|`` of the gradients, the
  parameters, the optimizer state and each module's forward outputs.

Nothing is recorded per op. When a step goes bad, :meth:`Sentinel.replay` runs it
again from the state it began with, recorded in full (``FULL_HEALTH``, every event
kept) into ``<logdir>/replay-step-<N>``, a normal dump.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from nanscope import api as _api
from nanscope.backends.torch.suspension import not_recorded
from nanscope.sentinel import _checks
from nanscope.sentinel._errors import SentinelTripped, error_words
from nanscope.sentinel._history import Header, HistoryWriter, StepRecord, Trip
from nanscope.sentinel._ranges import ModuleRanges
from nanscope.sentinel._replay import NOT_REPRODUCED, analyse_replay, replay_dir_name
from nanscope.sentinel._snapshot import Now, StateCopy, StepStart

ON_NAN = ("stop", "skip")
_NOTHING = contextlib.nullcontext()  # reusable: it holds no state
MARK_THE_STEP = "mark the step with nanscope.sentinel.step(fn, batch) to replay it"
HELD_AT_START = (
    "the parameters held Inf/NaN when the step began: an earlier optimizer step wrote it "
    "(checked only every detail_every steps); Sentinel(snapshot_state=True) checks the "
    "parameters after every update and replays the step that wrote it"
)
BORN_IN_OPTIMIZER = (
    "the Inf/NaN was born in the optimizer step, after the gradients were checked; "
    "Sentinel(snapshot_state=True) keeps the parameters and optimizer state from before "
    "each optimizer step, so that such a step can be replayed (and skipped)"
)


def _find_loss(result: Any) -> torch.Tensor | None:
    """The loss in what a step function returned: a tensor, ``(loss, ...)``, ``{"loss": ...}``,
    or an object with a ``loss`` attribute (a Hugging Face model output)."""
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, dict):
        value = result.get("loss")
        return value if isinstance(value, torch.Tensor) else None
    if isinstance(result, (tuple, list)):
        for item in result:
            if isinstance(item, torch.Tensor) and item.numel() == 1:
                return item
        return None
    value = getattr(result, "loss", None)
    return value if isinstance(value, torch.Tensor) else None


def _finite(x: float | None) -> bool:
    return x is None or math.isfinite(x)


def _scaler_in_charge(optimizer: torch.optim.Optimizer, kwargs: dict[str, Any] | None) -> bool:
    """A GradScaler hands this step to a fused optimizer that skips it on the device when
    ``found_inf``: its gradients are scaled and may hold the Inf the scaler handles."""
    if kwargs and ("found_inf" in kwargs or "grad_scaler" in kwargs):
        return True
    return getattr(optimizer, "grad_scale", None) is not None


class Sentinel:
    """Check every training step for Inf/NaN cheaply; replay the step that went bad.

    **Arguments**

    - ``logdir``: where the history (``sentinel.jsonl``) and the replays' dumps go.
    - ``model``: the module trained (optional): its buffers (BatchNorm statistics)
      are restored for a replay, its modules' output ranges are measured.
    - ``optimizer``: one or a list. Not given: the optimizers are found as they
      step (``torch.optim``'s global step hooks).
    - ``on_nan``: ``"stop"`` raises :class:`SentinelTripped` after the replay;
      ``"skip"`` drops the step's update and goes on from the state it began with.
    - ``snapshot_state``: copy the parameters and optimizer state before each
      optimizer step, so that an Inf/NaN born *in* the optimizer step (a learning
      rate spike) can be replayed and skipped too. Costs a copy of both per step
      and their memory once more.
    - ``module_ranges``: measure the largest ``|x|`` of each module's outputs (on
      the steps that measure details).
    - ``replay``: replay the bad step (``False``: only record the trip).
    - ``run_id``: the history's run id (default: a fresh one).
    - ``flush_every``: write the history every this many steps (and at each trip).
    - ``detail_every``: measure the largest ``|x|`` of gradients, parameters,
      optimizer state and module outputs every this many steps.
    - ``numpy_rng``: also restore numpy's global random state for a replay (for a
      step function that draws from ``np.random``; ~50 µs a step on a CPU). The
      PyTorch (CPU and CUDA) and Python ``random`` states are always restored.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        on_nan: str = "stop",
        snapshot_state: bool = False,
        module_ranges: bool = True,
        replay: bool = True,
        run_id: str | None = None,
        flush_every: int = 50,
        detail_every: int = 50,
        numpy_rng: bool = False,
    ) -> None:
        if on_nan not in ON_NAN:
            raise ValueError(f'on_nan must be "stop" or "skip", not {on_nan!r}')
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizers = [optimizer]
        elif isinstance(optimizer, (list, tuple)):
            optimizers = list(optimizer)
        elif optimizer is None:
            optimizers = []
        else:
            optimizers = [cast(Any, optimizer)]  # named in the error below
        for opt in optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(
                    f"optimizer must be a torch.optim.Optimizer or a list of them, "
                    f"not {type(opt).__name__}"
                )
        if int(detail_every) < 1:
            raise ValueError(f"detail_every must be 1 or more, not {detail_every}")
        self.logdir = Path(logdir)
        self.model = model
        self.optimizers: list[torch.optim.Optimizer] = optimizers
        self.on_nan = on_nan
        self.snapshot_state = bool(snapshot_state)
        self.replay_enabled = bool(replay)
        self.detail_every = int(detail_every)
        self.trips: list[Trip] = []
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self._ranges = ModuleRanges(model if module_ranges else None)
        self._params = _checks.ParameterLists()
        self._start = StepStart(model, numpy_rng=numpy_rng)
        self._state = StateCopy()
        self._writer: HistoryWriter | None = HistoryWriter(
            self.logdir,
            Header(
                run_id=self.run_id,
                framework="torch",
                started=time.time(),
                modules=self._ranges.names,
                settings={
                    "on_nan": on_nan,
                    "snapshot_state": self.snapshot_state,
                    "module_ranges": bool(module_ranges),
                    "replay": self.replay_enabled,
                    "detail_every": self.detail_every,
                    "numpy_rng": bool(numpy_rng),
                },
            ),
            flush_every=flush_every,
        )
        self._next = 0  # the number of the next step
        self._step: int | None = None  # the step under way
        self._implicit = False  # steps are the optimizer steps (nanscope.sentinel.start)
        self._in_step = False  # inside step(fn): the optimizer hooks check
        self._replaying: dict[str, bool] | None = None  # inside a replay: what it saw
        self._batch: Any = None
        self._reset_step()
        # The optimizers' hooks act only inside step(fn), in a replay, and for a sentinel
        # that owns the steps (start()); a trainer's callback calls the methods itself.
        if optimizers:
            self._hooks = [h for opt in optimizers for h in self._hook(opt)]
        else:
            self._hooks = [
                register_optimizer_step_pre_hook(self._pre_hook),
                register_optimizer_step_post_hook(self._post_hook),
            ]

    def _hook(self, opt: torch.optim.Optimizer) -> list[Any]:
        return [
            opt.register_step_pre_hook(self._pre_hook),
            opt.register_step_post_hook(self._post_hook),
        ]

    @property
    def batch(self) -> Any:
        """The ``batch`` given to the last :meth:`begin_step` (for a trainer's replay)."""
        return self._batch

    def _reset_step(self) -> None:
        self._losses: list[torch.Tensor] = []
        self._grad_sq = 0.0  # squared 2-norms of the optimizers' gradients, summed
        self._grad_norm: float | None = None
        self._grad_amax: float | None = None
        self._after: list[
            tuple[torch.optim.Optimizer, torch.Tensor, torch.Tensor | None, torch.Tensor | None]
        ] = []
        self._bad: list[str] = []
        self._applied = False  # an optimizer step updated the parameters
        self._snapshot = False  # the state copy holds this step's start
        self._detail = False

    # -- the steps -------------------------------------------------------------------------------

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as one training step, checked; returns what it returns.

        ``fn`` does the whole step (``zero_grad``, forward, backward,
        ``optimizer.step()``) and returns the loss, or something holding it (a tuple
        starting with it, a dict or an object with a ``loss``). When the step goes
        bad it is replayed, recorded in full, by calling ``fn`` again with the same
        arguments (so ``fn`` should take the batch as an argument, not draw it); then
        :class:`SentinelTripped` is raised (``on_nan="stop"``) or the step is skipped.
        """
        if self._implicit:
            self._step = None  # the step the optimizer hooks opened: this one replaces it
        self.begin_step()  # the arguments are the batch: at hand for the replay below
        self._in_step = True
        try:
            result = fn(*args, **kwargs)
        finally:
            self._in_step = False
        loss = _find_loss(result)
        if loss is not None:
            self.observe_loss(loss)
        record = self.end_step()
        if record.bad:
            if self.replay_enabled:
                trip = self.replay(fn, *args, **kwargs)
            else:
                trip = self.trip_without_replay("replay=False")
            if trip.action == "stop":
                raise SentinelTripped(trip, self.logdir)
        return result

    def begin_step(self, step: int | None = None, *, batch: Any = None) -> None:
        """A step starts: keep what a replay restores (RNG states, buffers, hyperparameters).

        ``step``: its number (``None``: one more than the last); ``batch``: kept for
        the caller's replay (a reference, not a copy).
        """
        if self._step is not None:
            self.end_step()  # the previous step was never ended
        self._reset_step()
        self._step = self._next if step is None else int(step)
        self._batch = batch
        self._detail = self._step % self.detail_every == 0
        self._start.save(self.optimizers)
        if self._detail:
            self._ranges.start()

    def observe_loss(self, loss: Any) -> None:
        """Note the step's loss: kept as it is, read at the next host sync (none here)."""
        if isinstance(loss, torch.Tensor) and self._step is not None:
            self._losses.append(loss)

    def _quiet(self) -> Any:
        """``not_recorded()`` where nanscope records or checks ops (a replay, a dump), else
        nothing: entering it costs a few microseconds per step for nothing."""
        if self._replaying is None and _api._active is None and _api._checking is None:
            return _NOTHING
        return not_recorded()

    def _loss_figure(self) -> torch.Tensor | None:
        """The losses seen so far as one 0-d float32 (a sum: Inf/NaN stay visible)."""
        if not self._losses:
            return None
        if len(self._losses) == 1 and self._losses[0].dtype == torch.float32:
            only = self._losses[0].detach()
            return only.reshape(()) if only.numel() == 1 else only.sum()
        parts = [t.detach().float().sum() for t in self._losses]
        self._losses = [parts[0] if len(parts) == 1 else torch.stack(parts).sum()]
        return self._losses[0]

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Check the gradients (and the loss seen so far) before ``optimizer`` updates.

        One host sync. Returns ``True`` when they hold Inf/NaN; their gradients are
        then set to ``None``, so the update does nothing and the parameters stay as
        the step began.
        """
        return self._before(optimizer, None)

    def _before(self, optimizer: torch.optim.Optimizer, kwargs: dict[str, Any] | None) -> bool:
        if optimizer not in self.optimizers:
            self.optimizers.append(optimizer)
        scaled = _scaler_in_charge(optimizer, kwargs)
        grads = [] if scaled else self._params.gradients(optimizer)
        detail = self._detail or self._replaying is not None
        with self._quiet():  # gradients need no torch.no_grad (they require no grad)
            device = grads[0].device if grads else None
            figures = [_checks.total_norm(grads, device)]
            if detail:
                figures.append(_checks.largest_abs(grads, device))
            loss = self._loss_figure()
            if loss is not None:  # a trainer's callback saw the loss before backward
                figures.append(loss.to(figures[0].device))
            # The one host sync before the update.
            host = [figures[0].item()] if len(figures) == 1 else torch.stack(figures).tolist()
            norm = host[0]
            amax = host[1] if detail else None
            loss_bad = loss is not None and not math.isfinite(host[-1])
            if not math.isfinite(norm) and amax is None:
                # A 2-norm overflows on huge finite values too: the largest |x| decides.
                amax = float(_checks.largest_abs(grads, device))
        grads_bad = amax is not None and not math.isfinite(amax)
        if not scaled:
            self._grad_sq += norm * norm
            self._grad_norm = math.sqrt(self._grad_sq)
            if amax is not None:
                self._grad_amax = amax if self._grad_amax is None else max(self._grad_amax, amax)
        if self._replaying is not None:
            self._replaying["bad"] = self._replaying["bad"] or grads_bad or loss_bad
            return False  # a replay runs the update as the run did
        if grads_bad and "gradients" not in self._bad:
            self._bad.append("gradients")
        if loss_bad and "loss" not in self._bad:
            self._bad.append("loss")
        if grads_bad or loss_bad:
            for group in optimizer.param_groups:  # skip the update
                for p in group["params"]:
                    p.grad = None
            return True
        if self.snapshot_state and not self._snapshot and not self._applied:
            with not_recorded():
                self._state.take(_checks.parameters(self.optimizers), self.optimizers)
            self._snapshot = True
        self._applied = True
        return False

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Measure the parameters (and, on detail steps, the optimizer state) on the device.

        Every step with ``snapshot_state`` (an Inf/NaN the update wrote is replayed
        from the snapshot), else on detail steps only: an Inf/NaN in the parameters
        shows in the next step's loss or gradients, and the trip then says that the
        parameters held it when that step began.
        """
        replaying = self._replaying is not None
        if not replaying and not self._applied:
            return  # the update was dropped: nothing changed
        detail = self._detail or replaying
        if not (detail or self.snapshot_state):
            return
        with not_recorded(), torch.no_grad():
            params = self._params.floating(optimizer)
            device = params[0].device if params else None
            norm = _checks.total_norm(params, device)
            amax = state = None
            if detail:
                amax = _checks.largest_abs(params, device)
                state = _checks.largest_abs(_checks.state_tensors(optimizer), device)
        self._after.append((optimizer, norm, amax, state))

    def end_step(self) -> StepRecord:
        """The step ends: one host sync reads what was measured; the history gets its record."""
        step = self._next if self._step is None else self._step
        peaks = self._ranges.stop() if self._ranges.measuring else []
        losses = self._losses
        loss_figure: torch.Tensor | None
        if len(losses) == 1 and losses[0].numel() == 1 and not self._after and not peaks:
            # Most steps: the loss alone, read as it is (one op, the host sync).
            loss_figure = losses[0]
            host = [loss_figure.item()]
        else:
            with self._quiet():  # detached values: no torch.no_grad needed
                figures: list[torch.Tensor] = []
                loss_figure = self._loss_figure()
                if loss_figure is not None:
                    figures.append(loss_figure)
                for _, norm, amax, state in self._after:
                    figures += [norm] + [x for x in (amax, state) if x is not None]
                figures += [p for p in peaks if p is not None]
                if len(figures) == 1:
                    host = [figures[0].item()]
                elif figures:
                    host = torch.stack([f.float().to(figures[0].device) for f in figures]).tolist()
                else:
                    host = []
        it = iter(host)
        loss = next(it) if loss_figure is not None else None
        sq = 0.0
        param_amax = state_amax = None
        for _, _, amax, state in self._after:
            sq += next(it) ** 2
            if amax is not None:
                a = next(it)
                param_amax = a if param_amax is None else max(param_amax, a)
            if state is not None:
                s = next(it)
                state_amax = s if state_amax is None else max(state_amax, s)
        param_norm = math.sqrt(sq) if self._after else None
        module_amax = tuple(None if p is None else next(it) for p in peaks)
        bad = list(self._bad)
        if not _finite(loss) and "loss" not in bad:
            bad.append("loss")
        if param_norm is not None and not math.isfinite(param_norm):
            if param_amax is None:  # an overflowing 2-norm, or Inf/NaN: the largest |x| says
                with not_recorded(), torch.no_grad():
                    params = _checks.floating(_checks.parameters(self.optimizers))
                    param_amax = float(_checks.largest_abs(params))
            if not math.isfinite(param_amax):
                bad.append("parameters")
        if state_amax is not None and not math.isfinite(state_amax):
            bad.append("optimizer_state")
        order = ("loss", "gradients", "parameters", "optimizer_state")
        record = StepRecord(
            step=step,
            time=time.time(),
            loss=loss,
            grad_norm=self._grad_norm,
            grad_amax=self._grad_amax,
            param_amax=param_amax,
            state_amax=state_amax,
            module_amax=module_amax,
            bad=tuple(c for c in order if c in bad),
            param_norm=param_norm,
        )
        if self._replaying is not None:
            self._replaying["bad"] = self._replaying["bad"] or bool(record.bad)
        else:
            self._bad = list(record.bad)
            if self._writer is not None:
                self._writer.step(record)
            self._next = step + 1
        self._step = None
        self._losses = []
        self._after = []
        return record

    # -- trips -----------------------------------------------------------------------------------

    def _replayable(self) -> str | None:
        """Why the step cannot be replayed from its start, or ``None`` when it can."""
        if self._applied and not self._snapshot:
            return (
                BORN_IN_OPTIMIZER
                if set(self._bad) - {"loss"}
                else (
                    "the loss was not finite but its update was applied (the loss is checked "
                    "after the step); snapshot_state=True keeps the state to replay from"
                )
            )
        return None

    def replay(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Trip:
        """Run the bad step again from its start state, recorded in full; returns the trip.

        Restores the RNG states, the buffers, the hyperparameters and (when the update
        was applied and ``snapshot_state`` kept them) the parameters and optimizer
        state, then calls ``fn(*args, **kwargs)`` under
        ``nanscope.enable_dump_debug_info(<logdir>/replay-step-<N>, "FULL_HEALTH", -1)``
        and analyses that dump. Afterwards the state is the step's start again (the
        step skipped), with the RNG states as they were before the replay.
        """
        step = self._next - 1
        where = tuple(self._bad) or ("loss",)
        why_not = self._replayable()
        if why_not is not None:
            return self.trip_without_replay(why_not)
        if not self._applied and self._params_bad():
            return self.trip_without_replay("")
        import nanscope

        optimizers = self.optimizers
        now = Now(optimizers)
        params = _checks.parameters(optimizers)
        if not params and self.model is not None:
            params = list(self.model.parameters())
        if self._snapshot:
            start = self._state
            start.restore(optimizers)
        else:  # the parameters are the step's start (its update was dropped): keep them
            start = StateCopy()
            with not_recorded():
                start.take(params, optimizers)
        for p in params:
            p.grad = None
        self._start.restore(optimizers)
        name = replay_dir_name(step)
        dump = self.logdir / name
        reason: str | None = None
        seen = {"bad": False}
        try:
            session = nanscope.enable_dump_debug_info(dump, "FULL_HEALTH", -1, framework="torch")
        except Exception as exc:  # another dump is recording: no replay
            self._put_back(start, now, params)
            return self.trip_without_replay(f"no replay: {exc}")
        detail, self._detail = self._detail, True
        try:
            session.set_step(step)
            self._replaying = seen
            self._reset_step()
            self._step = step
            self._detail = True
            result = fn(*args, **kwargs)
            loss = _find_loss(result)
            if loss is not None:
                self.observe_loss(loss)
            self.end_step()
        except Exception as exc:
            reason = f"the replay raised {type(exc).__name__}: {exc}"
        finally:
            self._replaying = None
            self._step = None
            self._detail = detail
            session.close()
        try:
            cause, harmful = analyse_replay(dump)
        except Exception as exc:  # a debugging aid must not end the run by itself
            cause, harmful = None, False
            reason = f"the replay's dump could not be analysed ({type(exc).__name__}: {exc})"
        reproduced = seen["bad"] or harmful
        if not reproduced and reason is None:
            reason = NOT_REPRODUCED
        self._put_back(start, now, params)
        trip = Trip(
            step=step,
            where=where,
            action=self.on_nan,
            replay=name,
            reproduced=reproduced,
            reason=reason,
            cause=cause,
        )
        self._record(trip)
        return trip

    def _params_bad(self) -> bool:
        """Whether any parameter holds Inf/NaN now (the rare path of a trip: exact)."""
        with not_recorded(), torch.no_grad():
            params = [p for opt in self.optimizers for p in self._params.floating(opt)]
            if not params and self.model is not None:
                params = _checks.floating(self.model.parameters())
            return bool(params) and not math.isfinite(float(_checks.largest_abs(params)))

    def _put_back(self, start: StateCopy, now: Now, params: list[torch.Tensor]) -> None:
        """The step's start state again (skipped), the RNG as the run left it."""
        start.restore(self.optimizers)
        self._start.buffers.restore()
        for p in params:
            p.grad = None
        now.restore(self.optimizers)

    def trip_without_replay(self, reason: str | None) -> Trip:
        """Record a trip of the last step that is not replayed, saying why.

        With ``on_nan="skip"``, the step's start state is put back where it can be
        (the buffers; the parameters when their update was dropped or snapshotted);
        when it cannot (an Inf/NaN born in the optimizer step without
        ``snapshot_state``), the trip's action is ``stop``.
        """
        step = self._next - 1
        reasons = [reason] if reason else []
        if not self._applied and "parameters" not in self._bad and self._params_bad():
            self._bad = ["parameters"]
            reasons.append(HELD_AT_START)
        action = self.on_nan
        cannot = self._replayable()
        if cannot is not None and cannot not in reasons:
            reasons.append(cannot)
        if "parameters" in self._bad and not self._snapshot:
            action = "stop"  # the parameters hold the Inf/NaN: going on would hide it
        if action == "skip":
            if self._snapshot:
                self._state.restore(self.optimizers)
            self._start.buffers.restore()
        reason = "; ".join(reasons) or None
        trip = Trip(step=step, where=tuple(self._bad) or ("loss",), action=action, reason=reason)
        self._record(trip)
        return trip

    def _record(self, trip: Trip) -> None:
        self.trips.append(trip)
        if self._writer is not None:
            self._writer.trip(trip)

    # -- the optimizers' hooks -------------------------------------------------------------------

    def _pre_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._replaying is not None:
            self._before(optimizer, kwargs)
            return
        if self._in_step:
            self._before(optimizer, kwargs)
            return
        if not self._implicit:
            return
        if self._step is None:
            self.begin_step()
        if self._before(optimizer, kwargs) and self.on_nan == "stop":
            self.end_step()
            raise SentinelTripped(self.trip_without_replay(MARK_THE_STEP), self.logdir)

    def _post_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._replaying is not None or self._in_step:
            self.after_optimizer_step(optimizer)
            return
        if not self._implicit or self._step is None:
            return
        self.after_optimizer_step(optimizer)
        record = self.end_step()
        if record.bad:
            trip = self.trip_without_replay(MARK_THE_STEP)
            if trip.action == "stop":
                raise SentinelTripped(trip, self.logdir)
        # The next step starts now, so that its RNG states and ranges cover its forward pass.
        self.begin_step()

    # -- the end ---------------------------------------------------------------------------------

    def close(self, error: str | None = None) -> None:
        """Stop checking: remove the hooks, write the history's end record. Idempotent.

        ``error``: the exception ending the program, in words, when one is (the history
        then says that the steps after the last one were never checked).
        """
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._ranges.stop()
        if self._writer is not None:
            self._writer.close(error)
            self._writer = None

    def __enter__(self) -> Sentinel:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self.close(error_words(exc))
