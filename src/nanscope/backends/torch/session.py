"""Turning PyTorch recording on and off."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import torch

from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.dumping import DumpingMode, dtype_filter_from
from nanscope.events import DumpWriter


class TorchDumpSession:
    """A dispatch mode pushed on the calling thread, feeding a :class:`DumpWriter`.

    Backward ops are recorded whichever thread the autograd engine runs them
    on: the engine carries the calling thread's dispatch modes to its workers.
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
        self.context.install()
        self.mode = DumpingMode(self.writer, self.context, pattern, dtype_filter)
        self.mode.__enter__()
        self._closed = False

    def flush(self) -> None:
        self.mode.device_buffer.submit()
        self.writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Fails when popped on another thread, or already popped by the user.
        with contextlib.suppress(Exception):
            self.mode.__exit__(None, None, None)
        self.context.uninstall()
        self.mode.device_buffer.submit()
        self.writer.close()
