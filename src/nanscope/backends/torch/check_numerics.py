"""``enable_check_numerics`` for PyTorch: raise at the first NaN or the first harmful Inf.

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
import enum
import functools
import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch._C._autograd import _get_sequence_nr
from torch.utils._python_dispatch import _disable_current_modes

from nanscope._paths import is_library_file, is_nanscope_file
from nanscope.analysis._aliases import is_row_softmax
from nanscope.backends.torch.context import RunContext, subclasses
from nanscope.backends.torch.dispatch import DynamoFreeMode, InstalledMode
from nanscope.backends.torch.ops import OpCache, OpInfo, tensors_of
from nanscope.backends.torch.recompute import recomputing
from nanscope.backends.torch.summaries import (
    FLOAT_DTYPES,
    host_parts,
    tensor_all_finite,
    tensor_counts,
)
from nanscope.errors import Birth, Frame, NonFiniteError
from nanscope.events import Phase

# GradScaler's ops: its inf check (which also unscales) and its scale update.
_UNSCALE = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
_UPDATE_SCALE = torch.ops.aten._amp_update_scale_.default
# Lineages named on one tensor at most (the preferred ones: see _preference).
_MAX_LINEAGES = 4
# Inputs remembered (weakly) per op that wrote Inf/NaN, to describe them in an error.
_MAX_INPUTS = 8

# -- the user's frame and source line ---------------------------------------------------------

_USER_CODE: dict[CodeType, bool] = {}


def is_user_code(code: CodeType) -> bool:
    """Whether code is the user's own (not a library's, not nanscope's); remembered."""
    known = _USER_CODE
    user = known.get(code)
    if user is None:
        if len(known) > 1 << 16:
            known.clear()
        path = code.co_filename
        user = known[code] = not is_library_file(path) and not is_nanscope_file(path)
    return user


def user_frame(frame: FrameType | None) -> Frame | None:
    """The innermost frame of the user's own code (not a library, not nanscope)."""
    f = frame
    while f is not None:
        code = f.f_code
        if is_user_code(code):
            return (code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return None


def _source_line(frame: Frame | None) -> str:
    if frame is None:
        return ""
    try:
        with open(frame[0], encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh, 1):
                if i == frame[1]:
                    return line.strip()
    except OSError:
        pass
    return ""


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu() if t.device.type != "cpu" else t


def describe_tensor(t: torch.Tensor) -> str:
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    head = f"{str(t.dtype).replace('torch.', '')}[{shape}] on {t.device}"
    if t.dtype not in FLOAT_DTYPES:
        return head
    ni, pi, nn, neg, zero, pos = tensor_counts(_host(t))
    nonfinite = _counted(ni, pi, nn)
    finite = f"{neg} negative, {zero} zero, {pos} positive"
    return f"{head}: {nonfinite + '; ' if nonfinite else ''}{finite}"


def _nonfinite_counts(t: torch.Tensor) -> tuple[int, int, int]:
    ni, pi, nn, _, _, _ = tensor_counts(_host(t))
    return ni, pi, nn


def _kinds(ni: int, pi: int, nn: int) -> list[str]:
    return [k for n, k in ((ni, "-inf"), (pi, "+inf"), (nn, "NaN")) if n]


def _counted(ni: int, pi: int, nn: int) -> str:
    """``2 -inf, 1 NaN``."""
    return ", ".join(f"{n} {k}" for n, k in ((ni, "-inf"), (pi, "+inf"), (nn, "NaN")) if n)


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


# -- what is remembered about Inf/NaN ---------------------------------------------------------


class _Where(NamedTuple):
    module_path: str
    phase: Phase
    step: int
    source: Frame | None
    forward: tuple[str, Frame | None] | None  # a backward op's forward op and its line


@dataclass(eq=False)
class _Ctx:
    """What was running when an op ran (taken at the op: it may be looked at later)."""

    where: _Where
    backward: bool  # run by the autograd engine
    deferring: bool  # in a GradScaler-scaled backward, or inside GradScaler.scale()
    stepping: tuple[Any, ...]  # the optimizers whose step() is running


class _State(enum.Enum):
    ACTIVE = "active"  # its values may still do harm
    DEFERRED = "deferred"  # made in a scaled backward: up to GradScaler's inf check
    HANDLED = "handled"  # GradScaler found them and skipped the step


@dataclass(eq=False)
class _Wrote:
    """An op that wrote Inf/NaN: what an error needs to name it later."""

    op: str
    index: int  # the output (or written argument) that holds them
    ctx: _Ctx
    inputs: list[tuple[weakref.ref[torch.Tensor], int]]  # weakly, with their versions
    more_inputs: int = 0
    counts: tuple[int, int, int, int] | None = None  # (-inf, +inf, nan, size); births only
    dtype: str = ""


@dataclass(eq=False)
class _Lineage:
    seq: int  # births in order
    birth: _Wrote
    deliberate: bool  # an Inf/NaN constant among the birth's arguments: a mask
    entered: bool  # the birth's inputs already held Inf/NaN that no checked op made
    state: _State


@dataclass(eq=False)
class _Held:
    """What a storage holding Inf/NaN holds."""

    storage: weakref.ref[Any]
    lineages: tuple[_Lineage, ...]
    by: _Wrote  # the op that last wrote Inf/NaN into it


def _masked_row(op: _Op, bad: list[int], ins: list[torch.Tensor]) -> bool:
    """Whether a softmax wrote NaN while the Inf/NaN it read were -inf alone."""
    if not is_row_softmax(op.info.name) or not any(_has_nan(op.outs[i]) for i in bad):
        return False
    held = [x for x in ins if x.dtype in FLOAT_DTYPES and x.numel() and not _all_finite(x)]
    return bool(held) and all(
        not bool(torch.isnan(x).any() or torch.isposinf(x).any()) for x in held
    )


def _preference(lineage: _Lineage) -> tuple[bool, bool, int]:
    """The order in which an error names the lineages that reached it.

    Lineages that may still do harm first, then those that are not an Inf/NaN constant
    (a mask) by intent, then the earliest born.
    """
    return (lineage.state is not _State.ACTIVE, lineage.deliberate, lineage.seq)


@dataclass(eq=False)
class _Op:
    """One op's call: checked at once (CPU) or queued for the device's answers."""

    func: Any
    info: OpInfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any] | None
    outs: list[torch.Tensor]
    # (output, all finite): a device tensor, or the answer already known for a CPU output
    flags: list[tuple[int, torch.Tensor | bool]] = field(default_factory=list)
    ctx: _Ctx | None = None


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
        self._queue: list[_Op] = []
        self._last_step = 0
        self._write_spots: dict[Any, tuple[tuple[int, str], ...]] = {}
        # Storages holding Inf/NaN, by address; those not read since.
        self._holds: dict[int, _Held] = {}
        self._unread: dict[int, _Held] = {}
        self._freed_unread: list[_Held] = []
        self._births = 0
        # GradScaler: an iteration is open from scale() to update().
        self._scaler_open = False
        self._found_inf = False
        self._window: dict[int, _Lineage] = {}  # lineages seen in its scaled backward
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
        self, func: Any, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
        outs: list[torch.Tensor], bad: list[int] | None,
        flags: list[tuple[int, torch.Tensor | bool]] | None, node: Any, frame: FrameType | None,
    ) -> None:  # fmt: skip
        """Follow an op that ran: ``bad`` outputs hold Inf/NaN, device ``flags`` are queued."""
        if flags or self._queue:
            # Ops are looked at in order: while one is queued, every op is.
            op = _Op(func, info, args, kwargs, outs, flags or [])
            op.flags += [(i, False) for i in bad or ()]
            if op.flags:
                op.ctx = self._ctx(node, frame)
            self._queue.append(op)
        else:
            if self._unread and not info.view:
                self._mark_read(args, kwargs)
            if bad is not None:
                op = _Op(func, info, args, kwargs, outs, ctx=self._ctx(node, frame))
                self._process(op, bad, now=True)
            elif self._holds and info.inplace:
                self._clear(outs)
        if self._scaler_open:
            if func is _UNSCALE:
                self.check_queue()
                found_inf = args[1] if len(args) > 1 else (kwargs or {})["found_inf"]
                self._found_inf = self._found_inf or bool(found_inf.item() > 0)
            elif func is _UPDATE_SCALE:
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

    def _facts(self, node: Any, frame: FrameType | None) -> _Where:
        link = self._links.get(node._sequence_nr()) if node is not None else None
        module_path = link[2] if link is not None else self.context.module_path()
        forward = (link[0], link[1]) if link is not None else None
        return _Where(
            module_path, self.context.phase(), self.context.step, user_frame(frame), forward
        )

    def _ctx(self, node: Any, frame: FrameType | None) -> _Ctx:
        # Activation checkpointing's rerun of the forward (backends/torch/recompute.py) runs
        # in the backward pass, but its ops are forward ops: a mask's -inf is no gradient.
        if node is not None and recomputing(frame):
            node = None
        return _Ctx(
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

    def _held(self, t: torch.Tensor) -> _Held | None:
        s = _storage(t)
        if s is None:
            return None
        held = self._holds.get(s[0])
        return held if held is not None and held.storage() is s[1] else None

    def _hold(self, t: torch.Tensor, lineages: tuple[_Lineage, ...], by: _Wrote) -> None:
        s = _storage(t)
        if s is None:
            return
        ptr, storage = s
        old = self._holds.get(ptr)
        if old is not None and old.storage() is storage and not _covers(t, storage):
            # Part of the storage was written: the rest still holds what it held.
            lineages = _merge(lineages, old.lineages)
        held = _Held(weakref.ref(storage, functools.partial(self._freed, ptr)), lineages, by)
        self._holds[ptr] = held
        if _active(lineages):
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
            if len(self._freed_unread) < 16 and _active(held.lineages):
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

    def _process(self, op: _Op, bad: list[int], now: bool, late: int = 0) -> None:
        """Follow the lineages an op's Inf/NaN come from; raise if they matter here."""
        ctx = op.ctx
        assert ctx is not None
        ins = tensors_of(op.args, [])
        if op.kwargs:
            for v in op.kwargs.values():
                tensors_of(v, ins)
        found: dict[int, _Lineage] = {}
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
        wrote = _Wrote(
            op.info.name, bad[0], ctx,
            [(weakref.ref(x), x._version) for x in ins[:_MAX_INPUTS]],
            max(0, len(ins) - _MAX_INPUTS), dtype=str(op.outs[bad[0]].dtype).replace("torch.", ""),
        )  # fmt: skip
        tensors = [op.outs[i] for i in bad]
        if found:
            lineages = tuple(sorted(found.values(), key=_preference)[:_MAX_LINEAGES])
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
        if ctx.deferring or not _active(lineages):
            return
        for i, t in zip(bad, tensors, strict=True):
            if _has_nan(t):
                self._raise(op, i, "nan", lineages, wrote, late)
        if ctx.backward:
            self._raise(op, bad[0], "gradient", lineages, wrote, late)

    def _birth(
        self, op: _Op, wrote: _Wrote, tensors: list[torch.Tensor], ins: list[torch.Tensor],
        now: bool,
    ) -> _Lineage:  # fmt: skip
        ni = pi = nn = size = 0
        for t in tensors:
            a, b, c = _nonfinite_counts(t)
            ni, pi, nn, size = ni + a, pi + b, nn + c, size + t.numel()
        wrote.counts = (ni, pi, nn, size)
        entered = False
        if now:
            # Inputs it wrote into held whatever they held before: only the others are known.
            written = {id(t) for t in self._written(op.func, op.args, op.kwargs)}
            entered = any(
                x.dtype in FLOAT_DTYPES and x.numel() and id(x) not in written
                and x.device.type != "meta" and not _all_finite(x)
                for x in ins
            )  # fmt: skip
        self._births += 1
        state = _State.DEFERRED if wrote.ctx.deferring else _State.ACTIVE
        deliberate = _nonfinite_constant(op.args, op.kwargs)
        return _Lineage(self._births, wrote, deliberate, entered, state)

    def _state_written(self, op: _Op, bad: list[int], ctx: _Ctx) -> tuple[int, str] | None:
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
            if held is not None and not _active(held.lineages):
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
                lineage.state = _State.HANDLED
            return
        pending = sorted(
            (lin for lin in window.values() if lin.state is not _State.HANDLED), key=_preference
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
        pending: list[tuple[_Held, torch.Tensor | None]] = [
            (h, None) for h in self._freed_unread if _active(h.lineages)
        ]
        for held in list(self._unread.values()):
            storage = held.storage()
            if storage is None or not _active(held.lineages):
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
            first, tensor = min(pending, key=lambda p: _preference(p[0].lineages[0]))
            self._raise_held(first, tensor, "unread at the end", None)

    # -- errors ----------------------------------------------------------------------------------

    def _raise(
        self, op: _Op, index: int, reason: str, lineages: tuple[_Lineage, ...], wrote: _Wrote,
        late: int,
    ) -> None:  # fmt: skip
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
        self, held: _Held | None, t: torch.Tensor | None, reason: str, call: Frame | None
    ) -> None:
        """Raise about Inf/NaN found in a tensor after the op that wrote them returned."""
        if held is None:
            assert t is not None
            where = _Where(self.context.module_path(), self.context.phase(), self.context.step,
                           call, None)  # fmt: skip
            ctx = _Ctx(where, backward=False, deferring=False, stepping=())
            wrote = _Wrote("", 0, ctx, [])
            self._births += 1
            lineage = _Lineage(self._births, wrote, False, True, _State.ACTIVE)
            lineage.birth.counts = (*_nonfinite_counts(t), t.numel())
            raise self._error("", 0, t, [], ctx, reason, (lineage,), wrote, 0, call)
        by = held.by
        raise self._error(
            by.op, by.index, t, _describe_inputs(by), by.ctx, reason, held.lineages, by, 0, call
        )

    @_outside_modes
    def _raise_birth(self, lineage: _Lineage, lineages: tuple[_Lineage, ...], reason: str) -> None:
        by = lineage.birth
        raise self._error(
            by.op, by.index, None, _describe_inputs(by), by.ctx, reason, lineages, by, 0
        )

    def _error(
        self, op: str, index: int, t: torch.Tensor | None, inputs: list[str], ctx: _Ctx,
        reason: str, lineages: tuple[_Lineage, ...], wrote: _Wrote, late: int,
        call: Frame | None = None,
    ) -> NonFiniteError:  # fmt: skip
        # The Inf/NaN involved are explained by this error: the end need not report them.
        self._unread = {}
        self._freed_unread = []
        # Raised inside optimizer.step(), the error ends the step: its post hook will not run.
        self._stepping = []
        module_path, phase, step, source, forward = ctx.where
        if t is not None:
            host = _host(t)
            ni, pi, nn = _nonfinite_counts(host)
            size = int(t.numel())
            output = f"  output {index}: {describe_tensor(host)}"
        else:
            ni, pi, nn, size = wrote.counts or (0, 0, 0, 0)
            output = (
                f"  output {index} ({wrote.dtype}) as written: {_counted(ni, pi, nn) or 'Inf/NaN'}"
            )
        where = f"{phase.name.lower()} pass, step {step}" + (
            f", module {module_path}" if module_path else ""
        )
        kinds = " and ".join(_kinds(ni, pi, nn)) or "Inf/NaN"
        if op:
            lines = [f"{op} produced {kinds} in output {index} ({where})"]
        else:
            lines = [f"a tensor that no checked op wrote holds {kinds} ({where})"]
        why = _WHY.get(reason)
        if why:
            lines.append(f"  {why}")
        if call is not None and reason == "loss":
            lines.append(f"  backward() called at {call[0]}:{call[1]} in {call[2]}")
        if op:
            lines.append(output)
            lines += inputs
        lines += _at(source, forward)
        if late:
            lines.append(f"  (found on the device {late} ops later)")
        birth = lineages[0]
        if birth.birth is not wrote or (birth.entered and op):
            lines += _born(birth)
        for other in lineages[1:3]:
            lines += [f"  also carrying {line.strip()}" if i == 0 else line
                      for i, line in enumerate(_born(other, inputs=False))]  # fmt: skip
        forward_op, forward_source = forward if forward is not None else ("", None)
        return NonFiniteError(
            "\n".join(lines),
            op_type=op,
            module_path=module_path,
            phase=phase.name.lower(),
            step=step,
            counts={"neg_inf": ni, "pos_inf": pi, "nan": nn, "size": size},
            source=source,
            forward_op=forward_op,
            forward_source=forward_source,
            reason=reason,
            birth=_birth_of(birth),
        )


_WHY = {
    "loss": "backward() was called on it: the loss is not finite",
    "parameter": "it wrote them into a parameter",
    "optimizer state": "it wrote them into the optimizer's state",
    "unchecked scaled gradient": (
        "in a backward scaled by GradScaler, whose inf check found no Inf/NaN that iteration"
    ),
    "unread at the end": "no op read them before checking ended",
}
_DTYPES = {str(d).replace("torch.", ""): d for d in FLOAT_DTYPES}


def _active(lineages: tuple[_Lineage, ...]) -> bool:
    return any(lineage.state is _State.ACTIVE for lineage in lineages)


def _merge(a: tuple[_Lineage, ...], b: tuple[_Lineage, ...]) -> tuple[_Lineage, ...]:
    seen = {lineage.seq: lineage for lineage in (*a, *b)}
    return tuple(sorted(seen.values(), key=_preference)[:_MAX_LINEAGES])


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


def _describe_inputs(wrote: _Wrote) -> list[str]:
    lines = []
    for i, (ref, version) in enumerate(wrote.inputs):
        x = ref()
        if x is None:
            lines.append(f"  input {i}: no longer held")
            continue
        with _disable_current_modes():
            text = describe_tensor(x)
        changed = " (written since)" if x._version != version else ""
        lines.append(f"  input {i}: {text}{changed}")
    if wrote.more_inputs:
        lines.append(f"  ({wrote.more_inputs} more inputs)")
    return lines


def _at(source: Frame | None, forward: tuple[str, Frame | None] | None) -> list[str]:
    lines = []
    if source is not None:
        lines.append(f"  at {source[0]}:{source[1]} in {source[2]}")
        code = _source_line(source)
        if code:
            lines.append(f"      {code}")
    forward_op, forward_source = forward if forward is not None else ("", None)
    if forward_op:
        lines.append(f"  backward of {forward_op}" + (
            f", created at {forward_source[0]}:{forward_source[1]} in {forward_source[2]}"
            if forward_source else ""
        ))  # fmt: skip
        code = _source_line(forward_source)
        if code:
            lines.append(f"      {code}")
    return lines


def _born(lineage: _Lineage, inputs: bool = True) -> list[str]:
    """``born at <op> (<module>) <file>:<line> in step N, <phase> pass: <counts>``."""
    b = lineage.birth
    module_path, phase, step, source, forward = b.ctx.where
    ni, pi, nn, size = b.counts or (0, 0, 0, 0)
    what = f"{_counted(ni, pi, nn)} of {size} {b.dtype}".strip()
    head = f"  born at {b.op or 'a tensor no checked op wrote'}"
    if module_path:
        head += f" ({module_path})"
    if source is not None:
        head += f" {source[0]}:{source[1]}"
    head += f" in step {step}, {phase.name.lower()} pass: {what}"
    lines = [head]
    code = _source_line(source)
    if code:
        lines.append(f"      {code}")
    if forward is not None and forward[0]:
        fs = forward[1]
        lines.append(
            f"    backward of {forward[0]}" + (f", created at {fs[0]}:{fs[1]}" if fs else "")
        )
    if lineage.entered and b.op:
        lines.append("    (its inputs already held Inf/NaN that no checked op had made)")
    if inputs:
        lines += ["  " + line for line in _describe_inputs(b)]
    return lines


def _birth_of(lineage: _Lineage) -> Birth:
    b = lineage.birth
    module_path, phase, step, source, forward = b.ctx.where
    ni, pi, nn, size = b.counts or (0, 0, 0, 0)
    return Birth(
        op_type=b.op,
        module_path=module_path,
        phase=phase.name.lower(),
        step=step,
        counts={"neg_inf": ni, "pos_inf": pi, "nan": nn, "size": size},
        source=source,
        forward_op=forward[0] if forward is not None else "",
        forward_source=forward[1] if forward is not None else None,
        entered=lineage.entered,
    )


# -- the session -------------------------------------------------------------------------------


class TorchCheckNumerics:
    """The session object behind :func:`nanscope.enable_check_numerics` for PyTorch."""

    framework = "torch"

    def __init__(self, sync_every: int = 64, queue_cpu: bool = False) -> None:
        from nanscope.backends.torch.session import native_library

        self.context = RunContext()
        # The native checker unless NANSCOPE_TORCH_RECORDER=python or no compiler
        # (queue_cpu, for tests of the device queue, is the Python mode's).
        lib = None if queue_cpu else native_library()
        self.native = lib is not None
        self.context.install()
        self._undo: list[Callable[[], None]] = []
        self._installed: InstalledMode | Any
        self.mode: CheckNumericsMode
        if lib is not None:
            from nanscope.backends.torch.check_native import (
                NativeChecking,
                NativeCheckNumericsMode,
            )
            from nanscope.backends.torch.compiled.checks import GraphChecks

            native = NativeCheckNumericsMode(self.context, lib, sync_every)
            self.mode = native
            self._hook_in()
            self._installed = NativeChecking(native)
            # Inductor's kernels bypass the dispatcher: compiled graphs count their own values.
            graphs = GraphChecks(native)
            graphs.install()
            self._undo.append(graphs.uninstall)
        else:
            self.mode = CheckNumericsMode(self.context, sync_every, queue_cpu)
            self._hook_in()
            self._installed = InstalledMode(self.mode)
        self._closed = False

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        checking = make(original)
        session = self

        # Wrapped again by someone else (the recorder's context) and not undone when checking
        # ends, the patch must pass calls on from then on.
        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            return (original if session._closed else checking)(*args, **kwargs)

        setattr(owner, name, patched)

        def undo() -> None:
            if (
                owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
            ) is patched:
                setattr(owner, name, original)

        self._undo.append(undo)

    def _hook_in(self) -> None:
        from torch.optim import optimizer as optim

        mode = self.mode
        handles = [
            optim.register_optimizer_step_pre_hook(lambda opt, a, k: mode.before_step(opt)),
            optim.register_optimizer_step_post_hook(lambda opt, a, k: mode.after_step(opt)),
        ]
        self._undo += [h.remove for h in handles]

        def backward(real: Any) -> Any:
            @functools.wraps(real)
            def checked(tensors: Any, *args: Any, **kwargs: Any) -> Any:
                if not mode.before_backward(tensors):
                    return real(tensors, *args, **kwargs)
                mode.scaled_backward(1)
                try:
                    return real(tensors, *args, **kwargs)
                finally:
                    mode.scaled_backward(-1)

            return checked

        # Tensor.backward() calls torch.autograd.backward.
        self._patch(torch.autograd, "backward", backward)

        def scale(real: Any) -> Any:
            @functools.wraps(real)
            def checked(scaler: Any, outputs: Any) -> Any:
                mode.scaling(1)
                try:
                    result = real(scaler, outputs)
                finally:
                    mode.scaling(-1, opened=bool(scaler.is_enabled()))
                return result

            return checked

        def update(real: Any) -> Any:
            @functools.wraps(real)
            def checked(scaler: Any, *args: Any, **kwargs: Any) -> Any:
                result = real(scaler, *args, **kwargs)
                mode._close_scaler_iteration()
                return result

            return checked

        for cls in (torch.amp.GradScaler, *subclasses(torch.amp.GradScaler)):
            if "scale" in cls.__dict__:
                self._patch(cls, "scale", scale)
            if "update" in cls.__dict__:
                self._patch(cls, "update", update)

    def flush(self) -> None:
        self.mode.check_queue()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.mode.finish()
        finally:
            self._installed.remove()
            for undo in reversed(self._undo):
                undo()
            self.context.uninstall()
            self.mode._holds.clear()
