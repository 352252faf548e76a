"""The recording dispatch mode: every ATen op becomes an ``Execution`` event."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch._C._autograd import _get_sequence_nr
from torch.utils._python_dispatch import TorchDispatchMode

from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.device_buffer import DeviceBuffer, PendingSummaries
from nanscope.backends.torch.ops import OpCache, OpInfo, TensorIds, tensors_of
from nanscope.backends.torch.summaries import (
    DTYPE_ENUM,
    FLOAT_DTYPES,
    summarize_device,
    summarize_host,
)
from nanscope.events import DumpWriter, ExecutionEvent, Phase
from nanscope.format.modes import TensorDebugMode

DtypeFilter = Callable[[torch.dtype], bool]
_FORWARD_LINKS_MAX = 1 << 20


class _Local(threading.local):
    def __init__(self) -> None:
        self.last_seq_nr = -1


class _Suspended(threading.local):
    """Per thread: > 0 while a compiled graph runs or torch.compile compiles (see compiled.py).

    ``mirror`` (shared by all threads) receives each new depth: the native
    recorder keeps its own per-thread copy.
    """

    mirror: Callable[[int], None] | None = None

    def __init__(self) -> None:
        self._depth = 0

    @property
    def depth(self) -> int:
        return self._depth

    @depth.setter
    def depth(self, value: int) -> None:
        self._depth = value
        mirror = _Suspended.mirror
        if mirror is not None:
            mirror(value)


# The ops that a compiled graph runs (its extern kernels) are recorded as one
# execution of the graph, and compilation's own (fake) ops not at all.
SUSPENDED = _Suspended()


class DumpingMode(TorchDispatchMode):
    """Records each op it sees into a :class:`DumpWriter`."""

    def __init__(
        self,
        writer: DumpWriter,
        context: RunContext,
        op_regex: re.Pattern[str] | None,
        dtype_filter: DtypeFilter | None,
    ) -> None:
        super().__init__()
        self.writer = writer
        self.mode = writer.mode
        self.context = context
        self.op_regex = op_regex
        self.dtype_filter = dtype_filter
        self.ids = TensorIds()
        self.device_buffer = DeviceBuffer()
        self._ops = OpCache(self.op_regex)
        self._devices: dict[str, int] = {}
        self._local = _Local()
        # autograd node sequence_nr -> (execution sequence, stack id, module path)
        self._forward: dict[int, tuple[int, int, str]] = {}
        # tensor id -> (version counter, host summary), to give same-element views
        # their base's summary while the base has not been written to since.
        self._summaries: dict[int, tuple[int, np.ndarray]] = {}
        self._last_step = -1
        # Ids of uninitialised tensors (allocations, and views of them): a view of
        # memory that nothing has written yet holds garbage, possibly NaN (DDP's
        # gradient buckets are viewed right after allocation). A write gives the
        # written tensor a fresh id, so a tensor leaves the set by being written.
        self._blank: dict[int, None] = {}
        self._health = writer.mode in (
            TensorDebugMode.FULL_HEALTH,
            TensorDebugMode.CONCISE_HEALTH,
            TensorDebugMode.CURT_HEALTH,
        )
        self._reads_values = self._health or writer.mode == TensorDebugMode.FULL_TENSOR

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if SUSPENDED.depth:
            return out
        info = self._ops[func]
        if not info.skip:
            try:
                if info.collective and info.record_values and self._reads_values:
                    _wait_for_collective(out)
                self._record(info, args, kwargs, out)
            except Exception as exc:  # never break the user's program
                self._failed(exc)
        return out

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Without this, torch.compile runs every frame eagerly under the mode;
        # with it, compiled code runs and nanscope.backends.torch.compiled
        # records its graphs and their summaries.
        return True

    _warned = False

    def _failed(self, exc: Exception) -> None:
        if not DumpingMode._warned:
            DumpingMode._warned = True
            print(f"nanscope: could not record an op ({exc!r}); recording goes on", file=sys.stderr)

    def _device_id(self, t: torch.Tensor) -> int:
        key = str(t.device)
        did = self._devices.get(key)
        if did is None:
            did = self._devices[key] = self.writer.register_device(key)
        return did

    def _summary(
        self, t: torch.Tensor, tid: int, info: OpInfo, source: tuple[int, torch.Tensor] | None
    ) -> Any:
        mode = self.mode
        if mode == TensorDebugMode.NO_TENSOR or not info.record_values:
            return None
        if self.dtype_filter is not None and not self.dtype_filter(t.dtype):
            return None
        if t.is_cpu:  # an attribute; t.device builds a device object each time
            if source is not None and mode != TensorDebugMode.FULL_TENSOR:
                entry = self._summaries.get(source[0])
                # The base's version counter moves with every in-place write, through
                # any alias; unchanged since it was summarised means the same values.
                # (The view itself gets the shared counter only after dispatch.)
                cached = entry[1] if entry is not None and entry[0] == _version(source[1]) else None
                if cached is not None:
                    if mode == TensorDebugMode.SHAPE:
                        view = summarize_host(t, mode)
                    else:
                        view = cached.copy()
                        if mode == TensorDebugMode.FULL_HEALTH:
                            view[3] = t.dim()  # same elements, its own rank
                    if view is not None:
                        self._remember(tid, t, view, False)
                    return view
            s = summarize_host(t, mode)
            if s is not None and mode != TensorDebugMode.FULL_TENSOR:
                self._remember(tid, t, s, info.inplace)
            return s
        if t.is_meta:
            return None
        if mode == TensorDebugMode.FULL_TENSOR:
            return summarize_host(t, mode)  # a full copy is a sync by nature
        d = summarize_device(t, mode)
        return None if d is None else self.device_buffer.add(d)

    def _uninitialised(self, tids: list[int]) -> None:
        blank = self._blank
        for tid in tids:
            blank[tid] = None
        if len(blank) > 4096:  # ids are never reused: the oldest are the least likely views
            for k in list(blank)[:2048]:
                del blank[k]

    def _remember(self, tid: int, t: torch.Tensor, summary: np.ndarray, inplace: bool) -> None:
        cache = self._summaries
        # An in-place op's output gets its version bump only after dispatch returns.
        version = _version(t)
        if version < 0:
            return  # no version counter (inference mode): never reuse
        cache[tid] = (version + 1 if inplace else version, summary)
        if len(cache) > 4096:
            for k in list(cache)[:2048]:
                del cache[k]

    def _record(
        self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any
    ) -> None:
        # The hot path of the recorder: one call per op, kept to plain Python
        # operations (no per-op allocation beyond the event itself).
        ctx = self.context
        ins = tensors_of(args, [])
        if kwargs:
            for v in kwargs.values():
                tensors_of(v, ins)
        outs = tensors_of(out, [])
        ids = self.ids
        in_ids = [ids.get(t) for t in ins]
        out_ids = [ids.new(t) for t in outs]
        source = (in_ids[0], ins[0]) if info.same_elements and in_ids else None
        parts: list[Any] = []
        if info.uninitialised or (info.view and in_ids and in_ids[0] in self._blank):
            self._uninitialised(out_ids)
            parts = [None] * len(outs)
        else:
            summary = self._summary
            for t, tid in zip(outs, out_ids, strict=True):
                try:
                    parts.append(summary(t, tid, info, source))
                except Exception as exc:  # an unusual tensor: record the op without its summary
                    self._failed(exc)
                    parts.append(None)
        summaries: Any = parts
        input_summaries: list[Any] = []
        if any(type(p) is tuple for p in parts):  # device summaries, resolved later
            summaries = PendingSummaries(parts)
        elif self._health and any(_nonfinite(self.mode, p) for p in parts):
            # The rare case worth the cost: what went into an op that made Inf/NaN.
            # An in-place op's mutated input now holds its result: unknown, not that.
            input_summaries = [
                summarize_host(t, self.mode)
                if t.is_cpu and not (info.inplace and any(t is o for o in outs))
                else None
                for t in ins
            ]
            # Python numbers among the arguments (x / 0.0) matter to the why:
            # they follow the tensors as inputs with id 0 (nanscope's convention).
            for i in info.value_args:
                a = args[i] if i < len(args) else None
                if type(a) is float or type(a) is int:
                    in_ids.append(0)
                    value = torch.tensor(float(a), dtype=torch.float64)
                    input_summaries.append(summarize_host(value, self.mode))
        node = torch._C._current_autograd_node()
        phase = ctx.phase(node)
        forward_sequence = 0
        forward_stack = -1
        if node is not None:
            link = self._forward.get(node._sequence_nr())
            if link is not None:
                forward_sequence, forward_stack, module_path = link
            else:
                module_path = ""
        else:
            module_path = ctx.module_path()
        stack = self.writer.capture_stack(sys._getframe(2))
        step = ctx.step
        if step != self._last_step:
            self._last_step = step
            self.device_buffer.submit()
        seq = self.writer.write_execution(
            ExecutionEvent(
                info.name,
                out_ids,
                in_ids,
                [self._cpu_device if t.is_cpu else self._device_id(t) for t in outs],
                summaries,
                input_summaries,
                -1,
                "",
                stack,
                module_path,
                phase,
                step,
                forward_sequence,
                forward_stack,
            )
        )
        if node is None and phase != Phase.OPTIMIZER:
            cur = _get_sequence_nr()
            local = self._local
            if cur != local.last_seq_nr:
                local.last_seq_nr = cur
                if torch.is_grad_enabled() and any(t.requires_grad for t in ins):
                    links = self._forward
                    links[cur - 1] = (seq, stack, module_path)
                    if len(links) > _FORWARD_LINKS_MAX:
                        for k in list(links)[: _FORWARD_LINKS_MAX // 2]:
                            del links[k]

    @property
    def _cpu_device(self) -> int:
        did = self._devices.get("cpu")
        if did is None:
            did = self._devices["cpu"] = self.writer.register_device("cpu")
        return did


def _wait_for_collective(out: Any) -> None:
    """Wait until an asynchronous collective on CPU tensors is done, so its outputs are summarised.

    A ``c10d`` collective returns a ``Work`` at once; gloo writes the result
    later on its own threads. Summarised at once, the outputs would show this
    rank's values before the reduction (finite on a rank that is about to get
    another rank's NaN), or a mix. Waiting costs DDP its overlap of
    communication with the backward pass while recording. Accelerator outputs
    are not waited for (their summaries are computed on the device).
    """
    if not (type(out) is tuple and len(out) == 2 and isinstance(out[1], torch.ScriptObject)):
        return
    outs = tensors_of(out[0], [])
    if not outs or not all(t.is_cpu for t in outs):
        return
    from torch.distributed import Work

    work = Work.unbox(out[1])
    if not work.is_completed():
        work.wait()


def _version(t: torch.Tensor) -> int:
    """The tensor's version counter, or -1 when it has none (inference-mode tensors)."""
    try:
        return int(t._version)
    except RuntimeError:
        return -1


def _nonfinite(mode: TensorDebugMode, s: Any) -> bool:
    if not isinstance(s, np.ndarray):
        return False
    if mode == TensorDebugMode.FULL_HEALTH:
        return bool(s[5] + s[6] + s[7] > 0)
    if mode == TensorDebugMode.CONCISE_HEALTH:
        return bool(s[2] + s[3] + s[4] > 0)
    if mode == TensorDebugMode.CURT_HEALTH:
        return bool(s[1] != 0)
    return False


def dtype_filter_from(tensor_dtypes: Any) -> DtypeFilter | None:
    """``tensor_dtypes`` as TensorFlow takes it: a list of dtypes (or names) or a predicate."""
    if tensor_dtypes is None:
        return None
    if callable(tensor_dtypes):
        return tensor_dtypes  # type: ignore[no-any-return]
    if isinstance(tensor_dtypes, (list, tuple, set, frozenset)):
        wanted = set()
        for d in tensor_dtypes:
            dt = getattr(torch, d, None) if isinstance(d, str) else d
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"tensor_dtypes: {d!r} is not a torch dtype or dtype name")
            wanted.add(dt)
        return wanted.__contains__
    raise ValueError(
        "tensor_dtypes must be a list of dtypes (e.g. [torch.float32, 'bfloat16']) "
        f"or a predicate; got {type(tensor_dtypes).__name__}"
    )


__all__ = ["DTYPE_ENUM", "FLOAT_DTYPES", "DumpingMode", "dtype_filter_from"]
