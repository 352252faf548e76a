"""Dispatch modes: kept from Dynamo without importing it, and installed on the calling
thread and on the threads started later."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode,
    _pop_mode,
    _push_mode,
)

_WITHOUT_DYNAMO: dict[Callable[..., Any], Callable[..., Any]] = {}


class DynamoFreeMode(TorchDispatchMode):
    """A dispatch mode whose handler Dynamo never traces, without importing Dynamo for it.

    PyTorch wraps every mode's ``__torch_dispatch__`` in ``torch._disable_dynamo``,
    which imports Dynamo (seconds) at the mode's first op, and then goes through
    Dynamo's disabling at every op. Dynamo can trace a frame only once it is
    imported: until then the handler runs as it is, afterwards with Dynamo
    disabled. Subclasses implement :meth:`handle`.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # PyTorch's wrapper: this class disables Dynamo itself, lazily

    def handle(
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> Any:
        """What ``__torch_dispatch__`` does."""
        raise NotImplementedError

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if "torch._dynamo" not in sys.modules:
            return self.handle(func, types, args, kwargs)
        handle = type(self).handle
        disabled = _WITHOUT_DYNAMO.get(handle)
        if disabled is None:
            import torch._dynamo

            disabled = _WITHOUT_DYNAMO[handle] = torch._dynamo.disable(
                handle, recursive=True, wrapping=False
            )
        return disabled(self, func, types, args, kwargs)


def on_new_threads(start_thread: Callable[[], None]) -> Callable[[], None]:
    """Call ``start_thread`` first in every thread started from now on; returns the undo.

    A thread started by the ``threading`` module runs its profile hook first:
    that is where per-thread state (a dispatch mode, a dispatch key) is set, so a
    training loop or a ``backward()`` call on a new thread is covered too.
    """
    previous = threading.getprofile()

    def start(frame: Any, event: Any, arg: Any) -> None:
        sys.setprofile(previous)  # once per thread; give any profiler back its hook
        with contextlib.suppress(Exception):
            start_thread()
        if previous is not None:
            previous(frame, event, arg)

    threading.setprofile(start)

    def undo() -> None:
        if threading.getprofile() is start:
            threading.setprofile(previous)

    return undo


class _PopAtThreadEnd:
    """Pops a mode off its thread's dispatch stack when the thread's Python part ends.

    A dispatch mode pushed on a thread is held by PyTorch's C++ thread-local
    state, which lets go of it (a Py_DECREF, under the GIL) only as the OS thread
    exits: after ``Thread.join()`` has returned. A thread that a program joins at
    exit (a ``ThreadPoolExecutor``'s, joined by ``concurrent.futures`` at
    shutdown) then takes the GIL while the interpreter is finalising, which ends
    the thread from inside a C++ destructor, and the process aborts ("terminate
    called without an active exception"). Popped here (``threading.local``'s
    per-thread values go while the thread is still Python's, GIL held), the C++
    state holds nothing by then.
    """

    __slots__ = ("mode",)

    def __init__(self, mode: TorchDispatchMode) -> None:
        self.mode = mode

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a mode the thread pushed over ours stays
            if _get_current_dispatch_mode() is self.mode:
                _pop_mode()


_thread_end = threading.local()


def follow_new_threads(mode: TorchDispatchMode) -> Callable[[], None]:
    """Push ``mode`` (dispatch modes are per thread) in every thread started from now on,
    popped again when that thread ends (see :class:`_PopAtThreadEnd`)."""

    def start() -> None:
        _push_mode(mode)
        pops = getattr(_thread_end, "pops", None)
        if pops is None:
            pops = _thread_end.pops = []
        pops.append(_PopAtThreadEnd(mode))  # a list goes last item first: the last pushed

    return on_new_threads(start)


class InstalledMode:
    """A dispatch mode, on this thread and on threads started later, until :meth:`remove`."""

    def __init__(self, mode: TorchDispatchMode) -> None:
        self.mode = mode
        mode.__enter__()
        self._unfollow = follow_new_threads(mode)

    def remove(self) -> None:
        self._unfollow()
        # Fails when popped on another thread, or already popped by the user.
        with contextlib.suppress(Exception):
            self.mode.__exit__(None, None, None)
