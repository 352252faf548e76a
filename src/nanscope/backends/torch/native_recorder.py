"""The Python half of the native recorder (see ``native/recorder.cpp``).

The C++ half sees every op and keeps its events in a buffer. This half
answers its rare questions (what an op is, a new stack's frames, summaries
that need PyTorch: accelerator outputs, FULL_TENSOR copies, the inputs of an
op that made Inf/NaN) and, on its own thread, turns buffered events into
:class:`~nanscope.events.ExecutionEvent` objects for the writer.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import Any

import torch

from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.device_buffer import DeviceBuffer, PendingSummaries
from nanscope.backends.torch.dumping import (
    SUSPENDED,
    DtypeFilter,
    _wait_for_collective,
)
from nanscope.backends.torch.ops import OpInfo, describe
from nanscope.backends.torch.summaries import (
    DTYPE_ENUM,
    FLOAT_DTYPES,
    summarize_device,
    summarize_host,
)
from nanscope.events import DumpWriter, ExecutionEvent, Phase, lifecycle
from nanscope.format.modes import TensorDebugMode

_PHASES = tuple(Phase)  # by value: Phase(n) is a slow call per event
_fork_hook = False
DRAIN_INTERVAL = 0.05  # seconds; well under the writer's flush interval
SLICE = 64  # events turned into Python objects at a time


class NativeIds:
    """Tensor ids from the native recorder's table (for the torch.compile recorder)."""

    def __init__(self, lib: ModuleType) -> None:
        self._lib = lib

    def get(self, t: torch.Tensor) -> int:
        return int(self._lib.tensor_id(t, False))

    def new(self, t: torch.Tensor) -> int:
        return int(self._lib.tensor_id(t, True))


_NOT_SUMMARISED = frozenset(
    getattr(torch, n)
    for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4", "complex32")
    if hasattr(torch, n)
)


def _dtype_table(dtype_filter: DtypeFilter | None) -> list[tuple[torch.Tensor, int, bool, bool]]:
    """Per dtype: an empty tensor of it (the C++ half reads its type), tfdbg2 enum or -1
    (complex: SHAPE skips it), kept by ``tensor_dtypes``, a float type (health modes)."""
    table = []
    seen: set[torch.dtype] = set()
    for name in dir(torch):
        dt = getattr(torch, name)
        if not isinstance(dt, torch.dtype) or dt in seen:
            continue
        seen.add(dt)
        if dt in _NOT_SUMMARISED:  # creating one of these warns
            continue
        try:
            example = torch.empty(0, dtype=dt)
        except Exception:  # dtypes that cannot make a tensor here
            continue
        enum = -1 if dt.is_complex else DTYPE_ENUM.get(dt, -1)
        kept = dtype_filter is None or bool(dtype_filter(dt))
        table.append((example, enum, kept, dt in FLOAT_DTYPES))
    return table


class NativeRecorder:
    """Drives the native recorder for one session; duck-types :class:`DumpingMode`
    for the torch.compile recorder (``ids``, ``device_buffer``, ``_cpu_device``,
    ``_device_id``, ``_failed``)."""

    def __init__(
        self,
        lib: ModuleType,
        writer: DumpWriter,
        context: RunContext,
        op_regex: re.Pattern[str] | None,
        dtype_filter: DtypeFilter | None,
    ) -> None:
        self.lib = lib
        self.writer = writer
        self.mode = writer.mode
        self.context = context
        self.op_regex = op_regex
        self.dtype_filter = dtype_filter
        self.ids = NativeIds(lib)
        self.device_buffer = DeviceBuffer()
        self.ops: list[OpInfo] = []
        self._devices: list[int] = []
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._warned = False
        table = _dtype_table(dtype_filter)
        context.mirror = lib
        context.on_step = self._on_step
        SUSPENDED.__class__.mirror = lib.set_suspended
        global _fork_hook
        if not _fork_hook and hasattr(os, "register_at_fork"):
            _fork_hook = True
            os.register_at_fork(after_in_child=lib.forget_in_child)
        width = {
            TensorDebugMode.CURT_HEALTH: 2,
            TensorDebugMode.CONCISE_HEALTH: 5,
            TensorDebugMode.FULL_HEALTH: 11,
            TensorDebugMode.SHAPE: 10,
        }.get(self.mode, 0)
        lib.start(self, int(self.mode), table, *writer.encoder.execution_pieces(width))
        self._thread = threading.Thread(target=self._drain_loop, name="nanscope-drain", daemon=True)
        self._thread.start()
        self._closed = False
        # Closed before the writer at exit, so that the last events reach it,
        # and so that no thread waits in C++ while the interpreter shuts down.
        lifecycle.register(self, source=True)

    # -- called by the C++ half (with the GIL) -----------------------------------------------

    def describe(self, name: str, overload: str) -> tuple[Any, ...]:
        namespace, _, op = name.partition("::")
        func: Any = None
        with contextlib.suppress(AttributeError, RuntimeError):
            func = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        if func is not None:
            info = describe(func, self.op_regex)
        else:
            full = f"{namespace}.{op}.{overload or 'default'}"
            info = OpInfo(
                name=full,
                skip=False,
                same_elements=False,
                inplace=False,
                record_values=self.op_regex is None or self.op_regex.match(full) is not None,
            )
        self.ops.append(info)
        return (
            len(self.ops) - 1,
            info.skip,
            info.same_elements,
            info.record_values,
            info.collective,
            info.uninitialised,
            info.view,
            list(info.value_args),
            info.name,
        )

    def new_stack(self, frames: Sequence[tuple[CodeType, int]]) -> int:
        return self.writer.stacks.intern_code_frames(frames)

    def located(self, stack: int) -> bytes:
        return self.writer.encoder.location_field(stack)

    def forward_located(self, stack: int) -> bytes:
        return self.writer.encoder.location_field(stack, forward=True)

    def extras(self, module: int, phase: int) -> bytes:
        names = self.context.module_names
        return self.writer.encoder.extras_field(names[module] if module < len(names) else "", phase)

    def device_ids(self) -> list[int]:
        """The writer's ids of the devices registered so far (never registers: the
        C++ half asks while the writer's lock is held)."""
        return self._devices

    def summaries(self, outs: list[torch.Tensor], which: list[int]) -> list[Any]:
        """Summaries the C++ half leaves to PyTorch, aligned with ``outs`` (``None`` elsewhere)."""
        parts: list[Any] = [None] * len(outs)
        mode = self.mode
        for i in which:
            t = outs[i]
            try:
                if t.is_cpu or mode == TensorDebugMode.FULL_TENSOR:
                    parts[i] = summarize_host(t, mode)
                else:
                    d = summarize_device(t, mode)
                    parts[i] = None if d is None else self.device_buffer.add(d)
            except Exception as exc:  # an unusual tensor: the op without this summary
                self._failed(exc)
        return parts

    def input_summaries(
        self, op: int, ins: list[torch.Tensor], mutated: list[bool], values: list[float]
    ) -> list[Any]:
        """What went into an op that made Inf/NaN: its tensors, then its Python numbers.

        An in-place op's mutated input now holds its result: unknown, not that.
        """
        info = self.ops[op]
        result: list[Any] = [
            summarize_host(t, self.mode) if t.is_cpu and not (info.inplace and m) else None
            for t, m in zip(ins, mutated, strict=True)
        ]
        for v in values:
            result.append(summarize_host(torch.tensor(float(v), dtype=torch.float64), self.mode))
        return result

    def wait_collective(self, out: Any) -> None:
        _wait_for_collective(out)

    # -- the drain thread --------------------------------------------------------------------

    def _drain_loop(self) -> None:
        self.lib.exclude_this_thread()
        while not self._stop.is_set():
            try:
                self.lib.wait_for_events(DRAIN_INTERVAL)
                self.sync()
            except Exception as exc:  # keep draining: a lost event beats a stalled program
                self._failed(exc)

    def sync(self) -> None:
        """Hand every buffered event to the writer.

        Most are encoded by the C++ half, a slice at a time (the writer then
        holds bytes: no Python objects per event wait for the disk); an event
        with summaries from Python is handed over as an ``ExecutionEvent``.
        """
        with self._write_lock:  # one thread at a time, in order
            while True:
                if self.writer.write_encoded_executions(self._encode_slice):
                    continue
                batch = self.lib.drain(1)  # an event the C++ half does not encode
                if not batch:
                    return
                self._write(batch)

    def _encode_slice(self, first: int) -> Any:
        return self.lib.encode_slice(first, SLICE)

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        ops = self.ops
        names = self.context.module_names
        write = self.writer.write_execution
        devices = self._devices
        for (
            op, out_ids, in_ids, out_dev, sums, has, parts, inputs,
            stack, module, phase, step, serial, fwd_serial, fwd_stack, link_target, wall,
        ) in batch:  # fmt: skip
            if len(devices) <= max(out_dev, default=0):
                self._register_devices()
            summaries: Any
            if sums is None and parts is None:
                summaries = [None] * len(out_ids)
            else:
                summaries = [
                    sums[i] if h == 1 else (parts[i] if h == 2 else None) for i, h in enumerate(has)
                ]
                if parts is not None and any(type(p) is tuple for p in summaries):
                    summaries = PendingSummaries(summaries)
            seq = write(
                ExecutionEvent(
                    ops[op].name,
                    out_ids,
                    in_ids,
                    [devices[d] for d in out_dev],
                    summaries,
                    inputs if inputs is not None else (),
                    -1,
                    "",
                    stack,
                    names[module] if module < len(names) else "",
                    _PHASES[phase],
                    step,
                    self.lib.seq_of(fwd_serial) if fwd_serial >= 0 else 0,
                    fwd_stack,
                    wall,
                ),
                encode_now=True,
            )
            if link_target:
                self.lib.note_seq(serial, seq)

    def _register_devices(self) -> None:
        names = self.lib.device_names()
        for name in names[len(self._devices) :]:
            self._devices.append(self.writer.register_device(name))

    # -- DumpingMode's interface for the torch.compile recorder ------------------------------

    @property
    def _cpu_device(self) -> int:
        if not self._devices:
            self._register_devices()
        return self._devices[0]

    def _device_id(self, t: torch.Tensor) -> int:
        return self.writer.register_device(str(t.device))

    def _failed(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            print(f"nanscope: could not record an op ({exc!r}); recording goes on", file=sys.stderr)

    # -- life cycle --------------------------------------------------------------------------

    def _on_step(self) -> None:
        self.lib.pause()
        try:
            self.device_buffer.submit()
        finally:
            self.lib.resume()

    def flush(self, timeout: float | None = None) -> None:
        """Everything recorded so far handed to the writer (call before writing directly)."""
        if self._closed:
            return
        self._on_step()
        self.sync()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        lifecycle.unregister(self)
        self.lib.stop()
        self._stop.set()
        self._thread.join(timeout=30)
        self._on_step()
        self.sync()
        self.lib.release()
        self.context.mirror = None
        self.context.on_step = None
        if SUSPENDED.__class__.mirror is self.lib.set_suspended:
            SUSPENDED.__class__.mirror = None


__all__ = ["NativeIds", "NativeRecorder"]
