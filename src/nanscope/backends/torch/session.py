"""Turning PyTorch recording on and off."""

from __future__ import annotations

import functools
import re
import sys
from types import ModuleType
from typing import Any

import torch

from nanscope.backends.torch import summaries
from nanscope.backends.torch.compiled.rewrite import GraphRewriter
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.native import native_library
from nanscope.backends.torch.recorders.base import Recorder, Setup, dtype_filter_from
from nanscope.backends.torch.recorders.native import NativeRecorder
from nanscope.backends.torch.recorders.python import PythonRecorder
from nanscope.backends.torch.suspension import never_record_this_thread
from nanscope.events import DumpWriter
from nanscope.format.modes import TensorDebugMode


class TorchDumpSession:
    """An eager-op recorder and the torch.compile recorder, feeding a :class:`DumpWriter`.

    Backward ops are recorded whichever thread the autograd engine runs them
    on: the engine carries the calling thread's dispatch modes to its workers.
    Threads started after recording began record too; threads that were
    already running do not (the native recorder records them as well).
    """

    framework = "torch"

    def __init__(
        self,
        logdir: str,
        mode: TensorDebugMode,
        circular_buffer_size: int,
        op_regex: str | None,
        tensor_dtypes: Any,
        statistics: bool = False,
        **writer_options: Any,
    ) -> None:
        pattern = re.compile(op_regex) if op_regex else None
        dtype_filter = dtype_filter_from(tensor_dtypes)
        lib = native_library()  # loaded before the writer's thread starts: see suspension
        self.writer = DumpWriter(
            logdir,
            mode,
            circular_buffer_size,
            framework=f"torch {torch.__version__}",
            thread_init=never_record_this_thread,
            **writer_options,
        )
        self.context = RunContext()
        self.context.install()
        self.ranks = RankWatch(self.writer)
        setup = Setup(self.writer, self.context, pattern, dtype_filter, statistics)
        self.eager: Recorder = self._recorder(lib, setup)
        # torch.compile'd code: graphs recorded, summaries computed inside them.
        self.compiled = GraphRewriter(self.eager, setup)
        self.compiled.install()
        self._closed = False

    @staticmethod
    def _recorder(lib: ModuleType | None, setup: Setup) -> Recorder:
        if lib is not None:
            try:
                return NativeRecorder(lib, setup)
            except RuntimeError as exc:
                # The previous session's last op is still being recorded on
                # another thread (a collective waiting for its peers?): its
                # tables are not free yet.
                print(f"nanscope: recording with the Python dispatch mode: {exc}", file=sys.stderr)
        return PythonRecorder(setup)

    @property
    def recorder(self) -> str:
        """``"native"`` or ``"python"``: which recorder this session uses."""
        return self.eager.kind

    def flush(self) -> None:
        self.eager.flush()
        self.writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.compiled.uninstall()
        self.eager.close()
        summaries.configure(statistics=False)  # what later sessions and checks start from
        self.context.uninstall()
        self.ranks.uninstall()
        self.writer.close()


class RankWatch:
    """Records the process's rank once ``torch.distributed`` knows it.

    Under torchrun the writer reads it from ``RANK`` at start. A worker that
    ``torch.multiprocessing.spawn`` (or a pool) started has no ``RANK``: its rank is
    what it passes to ``init_process_group``, so that call is wrapped while recording,
    and the writer appends the rank to its metadata once it returns
    (:meth:`DumpWriter.set_rank`). A process group set up before recording began is
    read at once.
    """

    def __init__(self, writer: DumpWriter) -> None:
        self.writer = writer
        self._original: Any = None
        self._wrapper: Any = None
        dist = _distributed()
        if dist is None:
            return
        if dist.is_initialized():
            self.record()
        original = dist.init_process_group

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            self.record()
            return result

        self._original, self._wrapper = original, init_process_group
        dist.init_process_group = init_process_group

    def record(self) -> None:
        dist = _distributed()
        try:
            if dist is not None and dist.is_initialized():
                self.writer.set_rank(int(dist.get_rank()), int(dist.get_world_size()))
        except Exception as exc:  # never take the program down
            print(f"nanscope: could not read this process's rank: {exc}", file=sys.stderr)

    def uninstall(self) -> None:
        dist = _distributed()
        if dist is not None and dist.init_process_group is self._wrapper is not None:
            dist.init_process_group = self._original


def _distributed() -> Any:
    """``torch.distributed``, or None in a build without it."""
    dist = getattr(torch, "distributed", None)
    return dist if dist is not None and dist.is_available() else None
