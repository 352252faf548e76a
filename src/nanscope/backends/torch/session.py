"""Turning PyTorch recording on and off."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _push_mode

from nanscope.backends.torch.compiled import CompiledRecorder
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.dumping import DumpingMode, dtype_filter_from
from nanscope.backends.torch.native_recorder import NativeRecorder
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
        lib = native_library()
        self.writer = DumpWriter(
            logdir,
            tensor_debug_mode,
            circular_buffer_size,
            framework=f"torch {torch.__version__}",
            thread_init=lib.exclude_this_thread if lib is not None else None,
            **writer_options,
        )
        self.context = RunContext()
        self.mode: DumpingMode | NativeRecorder
        self._installed: InstalledMode | None = None
        if lib is not None:
            self.context.install()
            self.mode = NativeRecorder(lib, self.writer, self.context, pattern, dtype_filter)
        else:
            self.mode = DumpingMode(self.writer, self.context, pattern, dtype_filter)
            self._installed = InstalledMode(self.mode, self.context)
        # torch.compile'd code: graphs recorded, summaries computed inside them.
        self.compiled = CompiledRecorder(
            self.mode, self.writer, self.context, pattern, dtype_filter
        )
        self.compiled.install()
        self._closed = False

    @property
    def recorder(self) -> str:
        """``"native"`` or ``"python"``: which recorder this session uses."""
        return "native" if isinstance(self.mode, NativeRecorder) else "python"

    def flush(self) -> None:
        if isinstance(self.mode, NativeRecorder):
            self.mode.flush()
        else:
            self.mode.device_buffer.submit()
        self.writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.compiled.uninstall()
        if isinstance(self.mode, NativeRecorder):
            self.mode.close()
            self.context.uninstall()
        else:
            if self._installed is not None:
                self._installed.remove()
            self.mode.device_buffer.submit()
        self.writer.close()


RECORDER_ENV = "NANSCOPE_TORCH_RECORDER"


def native_library() -> ModuleType | None:
    """The native recorder's extension, unless ``NANSCOPE_TORCH_RECORDER=python``.

    ``auto`` (the default) falls back to the Python dispatch mode, with one
    line on stderr, when the extension cannot be built; ``native`` makes
    that an error.
    """
    choice = os.environ.get(RECORDER_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "native", "python"):
        raise ValueError(f"{RECORDER_ENV}={choice!r}: use auto, native or python")
    if choice == "python":
        return None
    from nanscope.backends.torch import native

    lib = native.load()
    if lib is None:
        if choice == "native":
            raise RuntimeError(
                f"{RECORDER_ENV}=native, but the native recorder could not be built "
                f"({native.failure()}); install a C++ compiler or set {RECORDER_ENV}=python"
            )
        global _told
        if not _told:
            _told = True
            print(
                f"nanscope: recording with the Python dispatch mode (slower); the native "
                f"recorder could not be built: {native.failure()}",
                file=sys.stderr,
            )
    return lib


_told = False
