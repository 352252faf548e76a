"""Summaries that stay on an accelerator until a batch is copied to the host.

On CUDA, turning each op's summary into Python numbers would synchronise the
host with the device after every op. Instead each summary is a small device
tensor; every ``capacity`` summaries (and at the end of each step) they are
stacked and copied into pinned host memory with ``non_blocking=True``,
followed by a recorded event. Only the writer thread waits for that event,
when it serialises the events: the training thread never blocks.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

RESOLVE_TIMEOUT = 120.0


class _Batch:
    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.host: torch.Tensor | None = None
        self.event: Any = None
        self.submitted = threading.Event()

    def submit(self) -> None:
        if self.tensors:
            widths = {t.numel() for t in self.tensors}
            width = max(widths)
            rows = [
                t if t.numel() == width else torch.nn.functional.pad(t, (0, width - t.numel()))
                for t in self.tensors
            ]
            stacked = torch.stack(rows)
            pinned = stacked.is_cuda and torch.cuda.is_available()
            host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=pinned)
            host.copy_(stacked, non_blocking=True)
            if stacked.is_cuda:
                self.event = torch.cuda.Event()
                self.event.record()
            self.host = host
            self.tensors = []
        self.submitted.set()

    def row(self, index: int, length: int) -> np.ndarray | None:
        if not self.submitted.wait(RESOLVE_TIMEOUT) or self.host is None:
            return None
        if self.event is not None:
            self.event.synchronize()  # on the writer thread, never the training thread
        row: np.ndarray = self.host[index, :length].numpy().copy()
        return row


class PendingSummaries:
    """One event's output summaries, some still on the device (see :class:`DeviceBuffer`)."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[_Batch, int, int] | np.ndarray | None]) -> None:
        self.parts = parts

    def resolve(self) -> Sequence[np.ndarray | None]:
        out: list[np.ndarray | None] = []
        for p in self.parts:
            if isinstance(p, tuple):
                batch, index, length = p
                out.append(batch.row(index, length))
            else:
                out.append(p)
        return out


class DeviceBuffer:
    """Collects device summaries of one thread and submits them in batches."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._batch = _Batch()

    def add(self, summary: torch.Tensor) -> tuple[_Batch, int, int]:
        with self._lock:
            batch = self._batch
            batch.tensors.append(summary)
            ref = (batch, len(batch.tensors) - 1, summary.numel())
            if len(batch.tensors) >= self.capacity:
                self._submit_locked()
        return ref

    def _submit_locked(self) -> None:
        batch, self._batch = self._batch, _Batch()
        batch.submit()

    def submit(self) -> None:
        """Start copying what was collected (call at step ends and before closing)."""
        with self._lock:
            self._submit_locked()
