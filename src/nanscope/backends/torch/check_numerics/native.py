"""``enable_check_numerics`` with the native checker (``native/checker.cpp``).

The checker runs every op in C++ and counts its CPU float outputs there; the
Python side here is called only for what is rare (an output holding Inf/NaN,
a device output, GradScaler's ops, a new op or stack, and the ops that may
read or overwrite Inf/NaN already written). It is the Python dispatch mode's
logic (:class:`~nanscope.backends.torch.check_numerics.rule.CheckNumericsMode`),
fed by the checker instead of by ``__torch_dispatch__``, so both raise the
same errors. The forward op of a backward op (its line and module) is looked
up in the checker's links.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from types import CodeType, ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from nanscope.backends.torch.check_numerics.report import is_user_code
from nanscope.backends.torch.check_numerics.rule import UNSCALE, UPDATE_SCALE, CheckNumericsMode
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.dispatch import on_new_threads
from nanscope.errors import Frame


class _Mirror:
    """The run context's per-thread module and phase, given to the checker
    (``RunContext.mirror``)."""

    def __init__(self, lib: ModuleType) -> None:
        self.set_module = lib.check_set_module
        self.set_optimizer = lib.check_set_optimizer

    def set_step(self, step: int) -> None:
        pass


class _Frames:
    """The checker's module frames, as ``RunContext.follow_frames`` asks for them."""

    def __init__(self, lib: ModuleType) -> None:
        self.set_module_frames = lib.set_module_frames
        self.forget_modules = lib.check_forget_modules
        self.current_module = lib.check_current_module


class _Links:
    """The checker's forward links, as the Python mode keeps them."""

    def __init__(self, mode: NativeCheckNumericsMode) -> None:
        self._mode = mode

    def get(self, seq: int, /) -> tuple[str, Frame | None, str] | None:
        mode = self._mode
        link = mode.lib.check_link(seq)
        if link is None:
            return None
        op, stack, module = link
        names = mode.context.module_names
        return (
            mode.op_names[op] if 0 <= op < len(mode.op_names) else "",
            mode.frames[stack] if 0 <= stack < len(mode.frames) else None,
            names[module] if 0 <= module < len(names) else "",
        )


class NativeCheckNumericsMode(CheckNumericsMode):
    """The checking logic, called by the native checker (never pushed as a mode)."""

    def __init__(self, context: RunContext, lib: ModuleType, sync_every: int = 64) -> None:
        super().__init__(context, sync_every)
        self.lib = lib
        self._funcs: list[tuple[Any, Any]] = []
        self.op_names: list[str] = []
        self.frames: list[Frame | None] = []
        self._links = _Links(self)
        self._watching: tuple[bool, tuple[int, ...], tuple[int, ...]] = (False, (), ())

    @contextlib.contextmanager
    def outside(self) -> Iterator[None]:
        self.lib.check_pause(1)
        try:
            with _disable_current_modes():
                yield
        finally:
            self.lib.check_pause(-1)

    # -- called by checker.cpp (with the GIL, the checker off on this thread) ----------------

    def describe(self, name: str, overload: str) -> tuple[int, bool, bool]:
        """``(index, pass, special)`` for an op seen for the first time."""
        namespace, _, op = name.partition("::")
        func: Any = None
        with contextlib.suppress(AttributeError, RuntimeError):
            func = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        if func is None:
            return -1, True, False
        info = self._ops[func]
        self._funcs.append((func, info))
        self.op_names.append(info.name)
        passes = info.skip or info.same_elements or not info.record_values
        return len(self._funcs) - 1, passes, func is UNSCALE or func is UPDATE_SCALE

    def module_index(self, modules: list[torch.nn.Module]) -> int:
        """The path index of modules running (outermost first): see RunContext.follow_frames."""
        return self.context.module_index_of(modules)

    def forward_began(self) -> None:
        """An op ran inside modules called since ``backward()`` returned (module frames)."""
        self.context.forward_began()

    def new_stack(self, frames: Sequence[tuple[CodeType, int]]) -> int:
        """An id for a stack (innermost frame first): its user frame, kept for errors."""
        found = next(
            ((code.co_filename, line, code.co_name) for code, line in frames if is_user_code(code)),
            None,
        )
        self.frames.append(found)
        return len(self.frames) - 1

    def op(
        self, index: int, args: list[Any], outs: list[torch.Tensor], bad: list[int] | None
    ) -> None:
        """An op that ran: ``bad`` outputs hold Inf/NaN (``None``: some are on a device)."""
        func, info = self._funcs[index]
        node = torch._C._current_autograd_node()
        flags = None
        if bad is None:
            bad, flags = self._look(outs)
        try:
            self.after_op(
                func, info, tuple(args), None, outs, bad or None, flags, node, sys._getframe(1)
            )
        finally:
            self._rewatch()

    # -- what the checker shows Python ---------------------------------------------------------

    def _rewatch(self) -> None:
        """Tell the checker which ops Python must see although they write no Inf/NaN."""
        watch = (bool(self._queue), tuple(self._unread), tuple(self._holds))
        if watch != self._watching:
            self._watching = watch
            self.lib.check_watch(*watch)

    def _freed(self, ptr: int, ref: Any) -> None:
        super()._freed(ptr, ref)
        self._rewatch()

    def check_queue(self) -> None:
        try:
            super().check_queue()
        finally:
            self._rewatch()


class NativeChecking:
    """The checker on: on this thread, on threads started later, and in the autograd
    engine's threads (which take the key set of the thread that called backward)."""

    def __init__(self, mode: NativeCheckNumericsMode) -> None:
        self.lib = mode.lib
        self.context = mode.context
        mode.context.mirror = _Mirror(self.lib)
        self.lib.check_start(mode)
        # Module paths from frames (no hook in module calls) where the checker can.
        mode.context.follow_frames(_Frames(self.lib))
        mode.context.sync_mirror()
        self._unfollow = on_new_threads(lambda: self.lib.check_thread(True))

    def remove(self) -> None:
        self._unfollow()
        # Threads started meanwhile keep the key, which only passes their ops on from now.
        self.lib.check_stop()
        self.lib.check_set_optimizer(0, -1)  # this thread's copy: not into a later session
        self.context.unfollow_frames()
