"""Turning PyTorch recording on and off."""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _push_mode

from nanscope.backends.torch.compiled import CompiledRecorder
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.dumping import DumpingMode, dtype_filter_from
from nanscope.events import DumpWriter


def follow_new_threads(mode: TorchDispatchMode) -> Callable[[], None]:
    """Push ``mode`` in every thread started from now on; returns the undo.

    Dispatch modes are per thread. A thread started by the ``threading``
    module runs its profile hook first: that is where the mode is pushed, so a
    training loop or a ``backward()`` call on a new thread is recorded too.
    """
    previous = threading.getprofile()

    def start(frame: Any, event: Any, arg: Any) -> None:
        sys.setprofile(previous)  # once per thread; give any profiler back its hook
        with contextlib.suppress(Exception):
            _push_mode(mode)
        if previous is not None:
            previous(frame, event, arg)

    threading.setprofile(start)

    def undo() -> None:
        if threading.getprofile() is start:
            threading.setprofile(previous)

    return undo


class InstalledMode:
    """A dispatch mode with its run context, on this thread and on threads started later."""

    def __init__(self, mode: TorchDispatchMode, context: RunContext) -> None:
        self.mode = mode
        self.context = context
        context.install()
        mode.__enter__()
        self._unfollow = follow_new_threads(mode)

    def remove(self) -> None:
        self._unfollow()
        # Fails when popped on another thread, or already popped by the user.
        with contextlib.suppress(Exception):
            self.mode.__exit__(None, None, None)
        self.context.uninstall()


class TorchDumpSession:
    """A dispatch mode pushed on the calling thread, feeding a :class:`DumpWriter`.

    Backward ops are recorded whichever thread the autograd engine runs them
    on: the engine carries the calling thread's dispatch modes to its workers.
    Threads started after recording began record too; threads that were
    already running do not.
    """

    framework = "torch"

    def __init__(
        self,
        logdir: str,
        tensor_debug_mode: str | int,
        circular_buffer_size: int,
        op_regex: str | None,
        tensor_dtypes: Any,
        **writer_options: Any,
    ) -> None:
        pattern = re.compile(op_regex) if op_regex else None
        dtype_filter = dtype_filter_from(tensor_dtypes)
        self.writer = DumpWriter(
            logdir,
            tensor_debug_mode,
            circular_buffer_size,
            framework=f"torch {torch.__version__}",
            **writer_options,
        )
        self.context = RunContext()
        self.mode = DumpingMode(self.writer, self.context, pattern, dtype_filter)
        self._installed = InstalledMode(self.mode, self.context)
        # torch.compile'd code: graphs recorded, summaries computed inside them.
        self.compiled = CompiledRecorder(
            self.mode, self.writer, self.context, pattern, dtype_filter
        )
        self.compiled.install()
        self._closed = False

    def flush(self) -> None:
        self.mode.device_buffer.submit()
        self.writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.compiled.uninstall()
        self._installed.remove()
        self.mode.device_buffer.submit()
        self.writer.close()
