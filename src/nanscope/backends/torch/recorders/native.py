"""The native recorder: a dispatch-key kernel in C++ (``native/recorder.cpp``) and this,
its Python half.

The C++ half sees every op and keeps its events in a buffer (FULL_TENSOR
values of CPU tensors copied there too). This half answers its rare
questions (what an op is, a new stack's frames, summaries that need PyTorch:
accelerator outputs, FULL_TENSOR values of unusual tensors such as complex
or sparse ones, the inputs of an op that made Inf/NaN) and, on its own
thread, hands the buffered events to the writer: most encoded by the C++
half, the others as :class:`~nanscope.events.ExecutionEvent` objects.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import Any

import torch

from nanscope.backends.torch import summaries
from nanscope.backends.torch.device_buffer import PendingSummaries
from nanscope.backends.torch.dispatch import on_new_threads
from nanscope.backends.torch.ops import OpInfo, describe
from nanscope.backends.torch.recorders.base import (
    DtypeFilter,
    RecorderBase,
    Setup,
)
from nanscope.backends.torch.summaries import DTYPE_ENUM, FLOAT_DTYPES, summarize_host
from nanscope.backends.torch.suspension import never_record_this_thread
from nanscope.events import ExecutionEvent, Phase, register_source, unregister
from nanscope.events._model import CollectiveTag
from nanscope.events._queue import ExecutionBatch
from nanscope.format.modes import SUMMARY_LENGTH

_PHASES = tuple(Phase)  # by value: Phase(n) is a slow call per event
_fork_hook = False
DRAIN_INTERVAL = 0.05  # seconds; well under the writer's flush interval
# Events encoded into one batch at most: the GIL is held per batch only to make its
# few Python objects and, on the writer's thread, for a few numpy operations.
BATCH = 2048


class NativeIds:
    """Tensor ids from the native recorder's table (a :class:`~.base.TensorIdSource`)."""

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


class NativeRecorder(RecorderBase):
    """Drives the native recorder for one session (a :class:`~.base.Recorder`)."""

    kind = "native"

    def __init__(self, lib: ModuleType, setup: Setup) -> None:
        super().__init__(setup)
        self.lib = lib
        self.ids = NativeIds(lib)
        self.ops: list[OpInfo] = []
        self._funcs: dict[int, Any] = {}  # op index -> its overload (for distributed ops' schemas)
        self._devices: list[int] = []
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        table = _dtype_table(self.dtype_filter)
        self.context.mirror = lib
        self.context.on_step = self.submit_device_summaries
        global _fork_hook
        if not _fork_hook and hasattr(os, "register_at_fork"):
            _fork_hook = True
            os.register_at_fork(after_in_child=lib.forget_in_child)
        width = SUMMARY_LENGTH.get(self.mode, 0)  # 0: no summary vectors (NO_TENSOR, FULL_TENSOR)
        try:
            lib.start(
                self,
                int(self.mode),
                table,
                *self.writer.encoder.execution_pieces(width),
                summaries.RANGES,
                summaries.STATISTICS,
            )
        except RuntimeError:
            # An op of the previous session still inside the recorder on
            # another thread: the session records with the Python recorder.
            self.context.mirror = None
            self.context.on_step = None
            raise
        # While its buffer is full it sheds as the writer does: never the windows of the
        # first Inf/NaN; and a FULL_TENSOR record holds at most max_value_bytes of values.
        lib.set_shedding(self.writer.origin_window, self.writer.max_value_bytes)
        self.context.follow_frames(lib)
        self.context.sync_mirror()
        # Threads started from now on record by the recorder's dispatch key, as this one does.
        self._unfollow = on_new_threads(lib.key_this_thread)
        self._thread = threading.Thread(target=self._drain_loop, name="nanscope-drain", daemon=True)
        self._thread.start()
        self._closed = False
        # Closed before the writer at exit, so that the last events reach it,
        # and so that no thread waits in C++ while the interpreter shuts down.
        register_source(self)

    # -- called by the C++ half (with the GIL) -----------------------------------------------

    def describe(self, name: str, overload: str) -> tuple[Any, ...]:
        namespace, _, op = name.partition("::")
        func: Any = None
        with contextlib.suppress(AttributeError, RuntimeError):
            func = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        if func is not None:
            info = describe(func, self.op_regex)
            self._funcs[len(self.ops)] = func
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
            info.distributed,
            info.uninitialised,
            info.view,
            list(info.value_args),
            info.name,
            [i for i, _ in info.written],
        )

    def new_stack(self, frames: Sequence[tuple[CodeType, int]]) -> int:
        return self.writer.stacks.intern_code_frames(frames)

    def module_index(self, modules: list[torch.nn.Module]) -> int:
        """The path index of modules running (outermost first): see RunContext.follow_frames."""
        return self.context.module_index_of(modules)

    def located(self, stack: int) -> bytes:
        return self.writer.encoder.location_field(stack)

    def forward_located(self, stack: int) -> bytes:
        return self.writer.encoder.location_field(stack, forward=True)

    def extras(self, module: int, phase: int) -> bytes:
        names = self.context.module_names
        return self.writer.encoder.extras_field(names[module] if module < len(names) else "", phase)

    def module_path(self, module: int) -> str:
        names = self.context.module_names
        return names[module] if module < len(names) else ""

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
                parts[i] = summarize_host(t, mode) if t.is_cpu else self.summarize_off_host(t)
            except Exception as exc:  # an unusual tensor: the op without this summary
                self.failed(exc)
        return parts

    def input_summaries(
        self, op: int, ins: list[torch.Tensor], mutated: list[bool], values: list[float]
    ) -> list[Any]:
        """What went into an op that made Inf/NaN (``mutated``: written by the op, if in place)."""
        inplace = self.ops[op].inplace
        return self.summarize_inputs(ins, [inplace and m for m in mutated], values)

    def sent(self, op: int, ins: list[torch.Tensor]) -> list[Any] | None:
        """A distributed operation's input summaries, taken before it runs (None for a
        receive: its input is the buffer it writes, nothing this rank sends)."""
        if not self.ops[op].sends:
            return None
        return self.summarize_inputs(ins, [False] * len(ins), [])

    def collective(
        self, op: int, args: tuple[Any, ...], out: tuple[Any, ...], summarise: bool
    ) -> CollectiveTag | None:
        """A ``torch.distributed`` operation's tag (see :meth:`distributed_op`)."""
        info = self.ops[op]
        func = self._funcs.get(op)
        if func is None:
            return None
        # The op's outputs as a dispatch mode sees them: one value, or a tuple of them.
        result = out[0] if len(out) == 1 else out
        return self.distributed_op(func, info, args, result, summarise)

    def forward_began(self) -> None:
        """An op that autograd recorded ran after ``backward()`` returned (see RunContext)."""
        self.context.forward_began()

    # -- the drain thread --------------------------------------------------------------------

    def _drain_loop(self) -> None:
        never_record_this_thread()
        while not self._stop.is_set():
            try:
                self.lib.wait_for_events(DRAIN_INTERVAL)
                self.sync()
            except Exception as exc:  # keep draining: a lost event beats a stalled program
                self.failed(exc)

    def sync(self) -> None:
        """Hand every buffered event to the writer.

        Most are encoded and framed by the C++ half, without the GIL, a batch
        at a time (the writer then holds bytes and a numpy array: no Python
        object per event); an event with summaries from Python is handed over
        as an ``ExecutionEvent``.
        """
        with self._write_lock:  # one thread at a time, in order
            while True:
                if self.writer.write_execution_batch(self._encode_batch):
                    continue
                batch = self.lib.drain(1)  # an event the C++ half does not encode
                if not batch:
                    return
                self._write(batch)

    def _encode_batch(self, first: int) -> ExecutionBatch | None:
        fields = self.lib.encode_batch(first, BATCH)
        return None if fields is None else ExecutionBatch(*fields)

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        ops = self.ops
        names = self.context.module_names
        write = self.writer.write_execution
        devices = self._devices
        for (
            op,
            out_ids,
            in_ids,
            out_dev,
            sums,
            has,
            parts,
            inputs,
            stack,
            module,
            phase,
            step,
            serial,
            fwd_serial,
            fwd_stack,
            link_target,
            wall,
            tag,
        ) in batch:
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
            event = ExecutionEvent(
                op_type=ops[op].name,
                output_tensor_ids=out_ids,
                input_tensor_ids=in_ids,
                output_device_ids=[devices[d] for d in out_dev],
                summaries=summaries,
                input_summaries=inputs if inputs is not None else (),
                stack=stack,
                module_path=names[module] if module < len(names) else "",
                phase=_PHASES[phase],
                step=step,
                forward_sequence=self.lib.seq_of(fwd_serial) if fwd_serial >= 0 else 0,
                forward_stack=fwd_stack,
                wall_time=wall,
                collective=tag,
            )
            seq = write(event, encode_now=True)
            if link_target:
                self.lib.note_seq(serial, seq)

    def _register_devices(self) -> None:
        names = self.lib.device_names()
        for name in names[len(self._devices) :]:
            self._devices.append(self.writer.register_device(name))

    # -- the Recorder protocol ---------------------------------------------------------------

    @property
    def cpu_device(self) -> int:
        if not self._devices:
            self._register_devices()
        return self._devices[0]  # the C++ half's device 0

    def device_id(self, t: torch.Tensor) -> int:
        return self.writer.register_device(str(t.device))

    def flush(self) -> None:
        """Everything recorded so far handed to the writer (call before writing directly)."""
        if self._closed:
            return
        self.submit_device_summaries()
        self.sync()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        unregister(self)
        self._unfollow()
        if not self.inherited():
            self.lib.stop()
            self._stop.set()
            self._thread.join(timeout=30)
            self.submit_device_summaries()
            self.sync()
            # Events the recorder's full buffer let go of: reported with the writer's drops.
            self.writer.count_dropped(self.lib.dropped(), self.lib.dropped_nonfinite())
            self.lib.release()
        # else a forked child: forget_in_child left the parent's native state at the fork,
        # and its events are the parent's to write; no lock of the parent's is taken.
        # This thread's copy must not carry into a later session.
        self.lib.set_module(0)
        self.lib.set_optimizer(0, -1)
        self.context.unfollow_frames()
        self.context.mirror = None
        self.context.on_step = None


__all__ = ["NativeIds", "NativeRecorder"]
