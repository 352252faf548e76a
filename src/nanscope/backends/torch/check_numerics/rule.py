"""check_numerics' rule for PyTorch: raise at the first NaN or the first harmful Inf.

The rule (docs/CHECK_NUMERICS.md states it with its limits):

* A *birth* is an op that wrote Inf/NaN while none of the tensors it read held
  Inf/NaN that are being followed. Its values form a *lineage*, followed along
  the data: an op that writes Inf/NaN and reads a tensor holding a lineage's
  values carries that lineage on. Tensors are told apart by their storage, so
  views and in-place writes follow; an in-place write that leaves the whole
  storage finite ends what it held.
* An error is raised when a lineage that no GradScaler handled makes a NaN; when
  ``backward()`` is called on a tensor holding its values (the loss); when a
  backward op writes them (a gradient); when any op writes Inf/NaN into a
  parameter (a leaf that requires grad) or, inside ``optimizer.step()``, into the
  optimizer's parameters or state; and, when checking ends, for values that no op
  ever read. Infinities that ops read and absorb (a ``-inf`` mask that softmax
  turns into zeros) raise nothing.
* Between ``GradScaler.scale()`` and ``GradScaler.update()`` a ``backward()`` is
  scaled: the Inf/NaN it makes are deferred. If the scaler's inf check finds
  Inf/NaN that iteration (it then skips the step), they were handled; if it
  finds none, the error is raised at ``update()``.
* The error names the op that noticed them and the birth of their lineage.

Costs: each floating-point output is still checked with one vectorised sum
(Inf and NaN propagate through it). Lineages are looked up only for outputs
that hold Inf/NaN, and inputs are looked at only while some Inf/NaN are
written and not read yet. On accelerators the checks are queued on the device
and looked at, in order, every ``sync_every`` ops, at each ``backward()``, at
the end of each optimizer step and at ``GradScaler.update()``; the error then
comes a few ops late but still names the right op.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Protocol

import numpy as np
import torch
from torch._C._autograd import _get_sequence_nr
from torch.utils._python_dispatch import _disable_current_modes

from nanscope.analysis._aliases import is_row_softmax
from nanscope.backends.torch.check_numerics.records import (
    MAX_LINEAGES,
    Held,
    Lineage,
    LineageState,
    OpCall,
    OpContext,
    Where,
    Wrote,
    any_active,
    merge,
    preference,
)
from nanscope.backends.torch.check_numerics.report import (
    describe_inputs,
    describe_tensor,
    non_finite_error,
    nonfinite_counts,
    user_frame,
)
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.dispatch import DynamoFreeMode
from nanscope.backends.torch.ops import OpCache, OpInfo, tensors_of
from nanscope.backends.torch.recompute import recomputing
from nanscope.backends.torch.summaries import FLOAT_DTYPES, host_parts, tensor_all_finite
from nanscope.errors import Frame, NonFiniteError

# GradScaler's ops: its inf check (which also unscales) and its scale update.
UNSCALE = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
UPDATE_SCALE = torch.ops.aten._amp_update_scale_.default
# Inputs remembered (weakly) per op that wrote Inf/NaN, to describe them in an error.
_MAX_INPUTS = 8


# -- tensors ---------------------------------------------------------------------------------


def _has_nan(t: torch.Tensor) -> bool:
    if t.device.type == "cpu":
        return any(bool(np.isnan(a).any()) for a in host_parts(t)[0])
    return bool(torch.isnan(t).any())


def _all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no Inf/NaN (True for a tensor whose values cannot be looked at)."""
    try:
        if t.device.type == "cpu":
            return tensor_all_finite(t)
        return bool(torch.isfinite(t).all())
    except (RuntimeError, TypeError, NotImplementedError):
        return True


def _storage(t: torch.Tensor) -> tuple[int, Any] | None:
    """``(address, storage)`` of a tensor's storage; ``None`` where it has none."""
    try:
        s = t.untyped_storage()
        ptr = s.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return (ptr, s) if ptr else None


def _covers(t: torch.Tensor, storage: Any) -> bool:
    """Whether ``t`` spans its whole storage (a write into it overwrites everything)."""
    return bool(t.numel() * t.element_size() >= storage.nbytes())


def _nonfinite_constant(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """Whether a Python number among the arguments is Inf/NaN (``masked_fill(m, -inf)``)."""
    values: Iterable[Any] = args if not kwargs else (*args, *kwargs.values())
    for a in values:
        if isinstance(a, float) and not math.isfinite(a):
            return True
        if isinstance(a, (list, tuple)) and any(
            isinstance(x, float) and not math.isfinite(x) for x in a
        ):
            return True
    return False


def _masked_row(op: OpCall, bad: list[int], ins: list[torch.Tensor]) -> bool:
    """Whether a softmax wrote NaN while the Inf/NaN it read were -inf alone."""
    if not is_row_softmax(op.info.name) or not any(_has_nan(op.outs[i]) for i in bad):
        return False
    held = [x for x in ins if x.dtype in FLOAT_DTYPES and x.numel() and not _all_finite(x)]
    return bool(held) and all(
        not bool(torch.isnan(x).any() or torch.isposinf(x).any()) for x in held
    )


def _outside_modes(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a method called from outside the mode with checking off: its own tensor
    work (finiteness checks, copies to the host) is not the program's."""

    @functools.wraps(method)
    def run(self: CheckNumericsMode, *args: Any, **kwargs: Any) -> Any:
        with self.outside():
            return method(self, *args, **kwargs)

    return run


class ForwardLinks(Protocol):
    """Autograd sequence number -> (forward op, its user frame, its module path)."""

    def get(self, seq: int, /) -> tuple[str, Frame | None, str] | None: ...


class _Local(threading.local):
    def __init__(self) -> None:
        self.last_seq_nr = -1


# -- the mode ---------------------------------------------------------------------------------


class CheckNumericsMode(DynamoFreeMode):
    """Raises :class:`NonFiniteError` at the first NaN or harmful Inf (see the module doc)."""

    def __init__(self, context: RunContext, sync_every: int = 64, queue_cpu: bool = False) -> None:
        super().__init__()
        self.context = context
        self.sync_every = sync_every
        # Tests only: look at CPU tensors the way accelerator tensors are looked at.
        self.queue_cpu = queue_cpu
        self._ops = OpCache(None)
        self._local = _Local()
        # autograd node sequence_nr -> (forward op, forward user frame, module path)
        self._forward: dict[int, tuple[str, Frame | None, str]] = {}
        self._links: ForwardLinks = self._forward  # the native checker keeps its own
        self._queue: list[OpCall] = []
        self._last_step = 0
        self._write_spots: dict[Any, tuple[tuple[int, str], ...]] = {}
        # Storages holding Inf/NaN, by address; those not read since.
        self._holds: dict[int, Held] = {}
        self._unread: dict[int, Held] = {}
        self._freed_unread: list[Held] = []
        self._births = 0
        # GradScaler: an iteration is open from scale() to update().
        self._scaler_open = False
        self._found_inf = False
        self._window: dict[int, Lineage] = {}  # lineages seen in its scaled backward
        self._scaled_backward = 0
        self._in_scale = 0
        # optimizer.step() calls running, and whether one wrote Inf/NaN.
        self._stepping: list[Any] = []
        self._step_wrote = False

    def outside(self) -> contextlib.AbstractContextManager[Any]:
        """Checking off on this thread while nanscope's own code runs ops."""
        return _disable_current_modes()

    # -- every op ----------------------------------------------------------------------------

    def handle(
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        info = self._ops[func]
        if info.skip or info.same_elements or not info.record_values:
            # Views of checked tensors hold nothing new; allocations hold garbage.
            return out
        outs = tensors_of(out, [])
        if info.inplace:
            # What it wrote and does not return: _foreach_add_, _fused_adamw_ and co. return
            # nothing; a batch norm does not return its running statistics.
            returned = len(outs)
            for t in self._written(func, args, kwargs):
                if not any(t is o for o in outs[:returned]):
                    outs.append(t)
        node = torch._C._current_autograd_node()
        bad, flags = self._look(outs)
        self.after_op(func, info, args, kwargs, outs, bad, flags, node, sys._getframe(1))
        if node is None and torch.is_grad_enabled():
            self._remember_forward(info, args, kwargs)
        return out

    def _look(
        self, outs: list[torch.Tensor]
    ) -> tuple[list[int] | None, list[tuple[int, torch.Tensor | bool]] | None]:
        """The CPU outputs that hold Inf/NaN, and device outputs' queued finiteness flags."""
        flags: list[tuple[int, torch.Tensor | bool]] | None = None
        bad: list[int] | None = None
        for i, t in enumerate(outs):
            if t.dtype not in FLOAT_DTYPES or t.numel() == 0:
                continue
            try:
                if t.device.type == "cpu" and not self.queue_cpu:
                    if not tensor_all_finite(t):
                        bad = [i] if bad is None else [*bad, i]
                elif t.device.type != "meta":
                    flag = torch.isfinite(t).all()
                    if flags is None:
                        flags = []
                    flags.append((i, flag))
            except (RuntimeError, TypeError):  # nested or sparse: no values to look at here
                continue
        return bad, flags

    def after_op(
        self,
        func: Any,
        info: OpInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        outs: list[torch.Tensor],
        bad: list[int] | None,
        flags: list[tuple[int, torch.Tensor | bool]] | None,
        node: Any,
        frame: FrameType | None,
    ) -> None:
        """Follow an op that ran: ``bad`` outputs hold Inf/NaN, device ``flags`` are queued."""
        if flags or self._queue:
            # Ops are looked at in order: while one is queued, every op is.
            op = OpCall(func, info, args, kwargs, outs, flags or [])
            op.flags += [(i, False) for i in bad or ()]
            if op.flags:
                op.ctx = self._ctx(node, frame)
            self._queue.append(op)
        else:
            if self._unread and not info.view:
                self._mark_read(args, kwargs)
            if bad is not None:
                op = OpCall(func, info, args, kwargs, outs, ctx=self._ctx(node, frame))
                self._process(op, bad, now=True)
            elif self._holds and info.inplace:
                self._clear(outs)
        if self._scaler_open:
            if func is UNSCALE:
                self.check_queue()
                found_inf = args[1] if len(args) > 1 else (kwargs or {})["found_inf"]
                self._found_inf = self._found_inf or bool(found_inf.item() > 0)
            elif func is UPDATE_SCALE:
                self._close_scaler_iteration()
        if self._queue and (
            len(self._queue) >= self.sync_every or self.context.step != self._last_step
        ):
            self._last_step = self.context.step
            self.check_queue()

    def _written(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> list[torch.Tensor]:
        """The tensors an op writes into, by its schema (``self`` of ``add_``, ``out=``)."""
        spots = self._write_spots.get(func)
        if spots is None:
            schema = getattr(func, "_schema", None)
            spots = self._write_spots[func] = tuple(
                (i, a.name)
                for i, a in enumerate(schema.arguments if schema is not None else ())
                if a.alias_info is not None and a.alias_info.is_write
            )
        written: list[torch.Tensor] = []
        for i, name in spots:
            tensors_of(args[i] if i < len(args) else (kwargs or {}).get(name), written)
        return written

    def _remember_forward(self, info: OpInfo, args: Any, kwargs: Any) -> None:
        cur = _get_sequence_nr()
        local = self._local
        if cur == local.last_seq_nr:
            return
        local.last_seq_nr = cur
        ins = tensors_of(args, [])
        if kwargs:
            for v in kwargs.values():
                tensors_of(v, ins)
        if any(t.requires_grad for t in ins):
            links = self._forward
            links[cur - 1] = (info.name, user_frame(sys._getframe(2)), self.context.module_path())
            if len(links) > 1 << 20:
                for k in list(links)[: 1 << 19]:
                    del links[k]

    def _facts(self, node: Any, frame: FrameType | None) -> Where:
        link = self._links.get(node._sequence_nr()) if node is not None else None
        module_path = link[2] if link is not None else self.context.module_path()
        forward = (link[0], link[1]) if link is not None else None
        return Where(
            module_path, self.context.phase(), self.context.step, user_frame(frame), forward
        )

    def _ctx(self, node: Any, frame: FrameType | None) -> OpContext:
        # Activation checkpointing's rerun of the forward (backends/torch/recompute.py) runs
        # in the backward pass, but its ops are forward ops: a mask's -inf is no gradient.
        if node is not None and recomputing(frame):
            node = None
        return OpContext(
            self._facts(node, frame),
            backward=node is not None,
            deferring=self._scaled_backward > 0 or self._in_scale > 0,
            stepping=tuple(self._stepping),
        )

    # -- the device queue ----------------------------------------------------------------------

    def check_queue(self) -> None:
        """Look at the queued ops, in order (one host sync for all of them)."""
        queue, self._queue = self._queue, []
        if not queue:
            return
        with _disable_current_modes():
            flags = [f for op in queue for _, f in op.flags if isinstance(f, torch.Tensor)]
            answers = iter(torch.stack(flags).cpu().tolist() if flags else ())
            for n, op in enumerate(queue):
                if self._unread and not op.info.view:
                    self._mark_read(op.args, op.kwargs)
                bad = sorted(
                    i
                    for i, f in op.flags
                    if not (next(answers) if isinstance(f, torch.Tensor) else f)
                )
                if bad:
                    self._process(op, bad, now=False, late=len(queue) - n - 1)
                elif self._holds and op.info.inplace:
                    self._clear(op.outs)

    # -- storages holding Inf/NaN ---------------------------------------------------------------

    def _held(self, t: torch.Tensor) -> Held | None:
        s = _storage(t)
        if s is None:
            return None
        held = self._holds.get(s[0])
        return held if held is not None and held.storage() is s[1] else None

    def _hold(self, t: torch.Tensor, lineages: tuple[Lineage, ...], by: Wrote) -> None:
        s = _storage(t)
        if s is None:
            return
        ptr, storage = s
        old = self._holds.get(ptr)
        if old is not None and old.storage() is storage and not _covers(t, storage):
            # Part of the storage was written: the rest still holds what it held.
            lineages = merge(lineages, old.lineages)
        held = Held(weakref.ref(storage, functools.partial(self._freed, ptr)), lineages, by)
        self._holds[ptr] = held
        if any_active(lineages):
            self._unread[ptr] = held  # deferred or handled Inf/NaN may stay unread
        else:
            self._unread.pop(ptr, None)

    def _freed(self, ptr: int, ref: weakref.ref[Any]) -> None:
        """A storage holding Inf/NaN was freed; if no op read them, remember it for the end."""
        held = self._holds.get(ptr)
        if held is None or held.storage is not ref:
            return
        del self._holds[ptr]
        if self._unread.get(ptr) is held:
            del self._unread[ptr]
            if len(self._freed_unread) < 16 and any_active(held.lineages):
                self._freed_unread.append(held)

    def _mark_read(self, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> None:
        ins = tensors_of(args, [])
        if kwargs:
            for v in kwargs.values():
                tensors_of(v, ins)
        unread = self._unread
        for x in ins:
            s = _storage(x)
            if s is not None:
                held = unread.get(s[0])
                if held is not None and held.storage() is s[1]:
                    del unread[s[0]]

    def _clear(self, outs: list[torch.Tensor]) -> None:
        """An in-place write left these finite: a storage written whole holds nothing now."""
        for t in outs:
            s = _storage(t)
            if s is None:
                continue
            held = self._holds.get(s[0])
            if held is not None and held.storage() is s[1] and _covers(t, s[1]):
                del self._holds[s[0]]
                self._unread.pop(s[0], None)

    # -- an op wrote Inf/NaN ---------------------------------------------------------------------

    def _process(self, op: OpCall, bad: list[int], now: bool, late: int = 0) -> None:
        """Follow the lineages an op's Inf/NaN come from; raise if they matter here."""
        ctx = op.ctx
        assert ctx is not None
        ins = tensors_of(op.args, [])
        if op.kwargs:
            for v in op.kwargs.values():
                tensors_of(v, ins)
        found: dict[int, Lineage] = {}
        for x in ins:
            if x.dtype in FLOAT_DTYPES:
                held = self._held(x)
                if held is not None:
                    for lineage in held.lineages:
                        found.setdefault(lineage.seq, lineage)
        if found and op.info.view:
            return  # a view (slice, expand...) of Inf/NaN already followed: nothing new
        masked_row = bool(found) and _masked_row(op, bad, ins)
        if masked_row:
            # A softmax over a row that was -inf throughout (a sequence with no unmasked
            # position) made this NaN: it is born here; the mask's -inf stays intended
            # (docs/ROOT_CAUSE.md, "Births and lineages").
            found = {}
        wrote = Wrote(
            op.info.name,
            bad[0],
            ctx,
            [(weakref.ref(x), x._version) for x in ins[:_MAX_INPUTS]],
            more_inputs=max(0, len(ins) - _MAX_INPUTS),
            dtype=str(op.outs[bad[0]].dtype).replace("torch.", ""),
        )
        tensors = [op.outs[i] for i in bad]
        if found:
            lineages = tuple(sorted(found.values(), key=preference)[:MAX_LINEAGES])
        else:
            lineages = (self._birth(op, wrote, tensors, ins, now and not masked_row),)
        if ctx.deferring:
            for lineage in lineages:
                self._window.setdefault(lineage.seq, lineage)
        for t in tensors:
            self._hold(t, lineages, wrote)
        if ctx.stepping:
            self._step_wrote = True

        state = self._state_written(op, bad, ctx)
        if state is not None:
            self._raise(op, state[0], state[1], lineages, wrote, late)
        if ctx.deferring or not any_active(lineages):
            return
        for i, t in zip(bad, tensors, strict=True):
            if _has_nan(t):
                self._raise(op, i, "nan", lineages, wrote, late)
        if ctx.backward:
            self._raise(op, bad[0], "gradient", lineages, wrote, late)

    def _birth(
        self,
        op: OpCall,
        wrote: Wrote,
        tensors: list[torch.Tensor],
        ins: list[torch.Tensor],
        now: bool,
    ) -> Lineage:
        ni = pi = nn = size = 0
        for t in tensors:
            a, b, c = nonfinite_counts(t)
            ni, pi, nn, size = ni + a, pi + b, nn + c, size + t.numel()
        wrote.counts = (ni, pi, nn, size)
        entered = False
        if now:
            # Inputs it wrote into held whatever they held before: only the others are known.
            written = {id(t) for t in self._written(op.func, op.args, op.kwargs)}
            entered = any(
                x.dtype in FLOAT_DTYPES
                and x.numel()
                and id(x) not in written
                and x.device.type != "meta"
                and not _all_finite(x)
                for x in ins
            )
        self._births += 1
        state = LineageState.DEFERRED if wrote.ctx.deferring else LineageState.ACTIVE
        deliberate = _nonfinite_constant(op.args, op.kwargs)
        return Lineage(self._births, wrote, deliberate, entered, state)

    def _state_written(self, op: OpCall, bad: list[int], ctx: OpContext) -> tuple[int, str] | None:
        """The output that wrote Inf/NaN into a parameter or optimizer state, and which."""
        if not op.info.inplace:
            return None
        written = {id(t) for t in self._written(op.func, op.args, op.kwargs)}
        state: dict[int, str] | None = None
        for i in bad:
            t = op.outs[i]
            if id(t) not in written:
                continue
            if t.requires_grad and t.is_leaf:
                return i, "parameter"
            if ctx.stepping:
                if state is None:
                    state = _optimizer_storages(ctx.stepping)
                s = _storage(t)
                if s is not None and s[0] in state:
                    return i, state[s[0]]
        return None

    # -- backward(), GradScaler, optimizer.step() -----------------------------------------------

    def before_backward(self, tensors: Any) -> bool:
        """Check the loss ``backward()`` was called on; True when the backward is scaled."""
        self.check_queue()
        roots = tensors_of(tensors, [])
        call = user_frame(sys._getframe(1))
        for t in roots:
            if t.dtype not in FLOAT_DTYPES or t.numel() == 0 or t.device.type == "meta":
                continue
            if t.device.type == "cpu":
                finite = _all_finite(t.detach())
            else:
                with _disable_current_modes():  # the check is not the program's op
                    finite = _all_finite(t)
            if finite:
                continue
            held = self._held(t)
            if held is not None and not any_active(held.lineages):
                continue  # a scaled loss that overflowed: GradScaler's to handle
            self._raise_held(held, t, "loss", call)
        return self._scaler_open

    def scaled_backward(self, delta: int) -> None:
        self._scaled_backward += delta

    def scaling(self, delta: int, opened: bool = False) -> None:
        self._in_scale += delta
        if opened:
            self._scaler_open = True

    def _close_scaler_iteration(self) -> None:
        """GradScaler's update(): its inf check's answer settles the deferred Inf/NaN."""
        if not self._scaler_open:
            return
        self.check_queue()
        self._scaler_open = False
        found, self._found_inf = self._found_inf, False
        window, self._window = self._window, {}
        if found:
            for lineage in window.values():
                lineage.state = LineageState.HANDLED
            return
        pending = sorted(
            (lin for lin in window.values() if lin.state is not LineageState.HANDLED),
            key=preference,
        )
        if pending:
            self._raise_birth(pending[0], tuple(pending), "unchecked scaled gradient")

    def before_step(self, optimizer: Any) -> None:
        self._stepping.append(optimizer)

    def after_step(self, optimizer: Any) -> None:
        if optimizer in self._stepping:
            self._stepping.remove(optimizer)
        self.check_queue()
        if self._step_wrote:
            self._step_wrote = bool(self._stepping)
            self._check_new_state(optimizer)

    @_outside_modes
    def _check_new_state(self, optimizer: Any) -> None:
        """Inf/NaN assigned as new optimizer state (not written in place) are found here."""
        for ptr, kind in _optimizer_storages((optimizer,)).items():
            held = self._holds.get(ptr)
            if held is None or held.storage() is None:
                continue
            t = _tensor_of_storage(optimizer, ptr)
            if t is not None and not _all_finite(t):
                self._raise_held(held, t, kind, None)

    @_outside_modes
    def finish(self) -> None:
        """Checking ends: Inf/NaN that no op read are reported.

        Not while an exception is on its way out (checking turned off in a ``finally``):
        a run that failed already did not reach its end.
        """
        self.check_queue()
        if sys.exc_info()[1] is not None:
            self._freed_unread, self._unread = [], {}
            return
        pending: list[tuple[Held, torch.Tensor | None]] = [
            (h, None) for h in self._freed_unread if any_active(h.lineages)
        ]
        for held in list(self._unread.values()):
            storage = held.storage()
            if storage is None or not any_active(held.lineages):
                continue
            n = storage.nbytes()
            dtype = _DTYPES.get(held.by.dtype)
            if dtype is None or not n:
                continue
            whole = torch.empty(0, dtype=dtype, device=storage.device)
            whole.set_(storage, 0, (n // whole.element_size(),), (1,))
            if not _all_finite(whole):
                pending.append((held, whole))
        self._freed_unread = []
        self._unread = {}
        if pending:
            first, tensor = min(pending, key=lambda p: preference(p[0].lineages[0]))
            self._raise_held(first, tensor, "unread at the end", None)

    # -- errors ----------------------------------------------------------------------------------

    def _raise(
        self,
        op: OpCall,
        index: int,
        reason: str,
        lineages: tuple[Lineage, ...],
        wrote: Wrote,
        late: int,
    ) -> None:
        assert op.ctx is not None
        ins = tensors_of(op.args, [])
        if op.kwargs:
            for v in op.kwargs.values():
                tensors_of(v, ins)
        inputs = [f"  input {i}: {describe_tensor(x)}" for i, x in enumerate(ins)]
        raise self._error(
            op.info.name, index, op.outs[index], inputs, op.ctx, reason, lineages, wrote, late
        )

    @_outside_modes
    def _raise_held(
        self, held: Held | None, t: torch.Tensor | None, reason: str, call: Frame | None
    ) -> None:
        """Raise about Inf/NaN found in a tensor after the op that wrote them returned."""
        if held is None:
            assert t is not None
            where = Where(
                self.context.module_path(), self.context.phase(), self.context.step, call, None
            )
            ctx = OpContext(where, backward=False, deferring=False, stepping=())
            wrote = Wrote("", 0, ctx, [])
            self._births += 1
            lineage = Lineage(self._births, wrote, False, True, LineageState.ACTIVE)
            lineage.birth.counts = (*nonfinite_counts(t), t.numel())
            raise self._error("", 0, t, [], ctx, reason, (lineage,), wrote, 0, call)
        by = held.by
        raise self._error(
            by.op, by.index, t, describe_inputs(by), by.ctx, reason, held.lineages, by, 0, call
        )

    @_outside_modes
    def _raise_birth(self, lineage: Lineage, lineages: tuple[Lineage, ...], reason: str) -> None:
        by = lineage.birth
        raise self._error(
            by.op, by.index, None, describe_inputs(by), by.ctx, reason, lineages, by, 0
        )

    def _error(
        self,
        op: str,
        index: int,
        t: torch.Tensor | None,
        inputs: list[str],
        ctx: OpContext,
        reason: str,
        lineages: tuple[Lineage, ...],
        wrote: Wrote,
        late: int,
        call: Frame | None = None,
    ) -> NonFiniteError:
        # The Inf/NaN involved are explained by this error: the end need not report them.
        self._unread = {}
        self._freed_unread = []
        # Raised inside optimizer.step(), the error ends the step: its post hook will not run.
        self._stepping = []
        return non_finite_error(op, index, t, inputs, ctx, reason, lineages, wrote, late, call)


_DTYPES = {str(d).replace("torch.", ""): d for d in FLOAT_DTYPES}


def _optimizer_storages(optimizers: tuple[Any, ...]) -> dict[int, str]:
    """Storage address -> "parameter" or "optimizer state", for these optimizers."""
    found: dict[int, str] = {}
    for opt in optimizers:
        for group in getattr(opt, "param_groups", ()):
            for p in group.get("params", ()):
                if isinstance(p, torch.Tensor) and (s := _storage(p)) is not None:
                    found[s[0]] = "parameter"
                for v in getattr(opt, "state", {}).get(p, {}).values():
                    if isinstance(v, torch.Tensor) and (s := _storage(v)) is not None:
                        found.setdefault(s[0], "optimizer state")
    return found


def _tensor_of_storage(optimizer: Any, ptr: int) -> torch.Tensor | None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            for t in (p, *optimizer.state.get(p, {}).values()):
                if isinstance(t, torch.Tensor) and (s := _storage(t)) is not None and s[0] == ptr:
                    return t
    return None
