"""The Python recorder: a dispatch mode that makes every ATen op an ``Execution`` event.

The fallback where the native recorder (:mod:`.native`) cannot be built, and
the one chosen by ``NANSCOPE_TORCH_RECORDER=python``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import torch
from torch._C._autograd import _get_sequence_nr

from nanscope.backends.torch.device_buffer import PendingSummaries
from nanscope.backends.torch.dispatch import DynamoFreeMode, InstalledMode
from nanscope.backends.torch.ops import OpCache, OpInfo, TensorIds, tensors_of, written_tensors
from nanscope.backends.torch.recorders.base import (
    RecorderBase,
    Setup,
)
from nanscope.backends.torch.summaries import FLOAT_DTYPES, summarize_host, tensor_counts
from nanscope.backends.torch.suspension import SUSPENDED
from nanscope.events import ExecutionEvent, Phase
from nanscope.events._model import CollectiveTag
from nanscope.format.headroom import AMAX_SLOT, RECORDED_WIDTH
from nanscope.format.modes import HEALTH_MODES, TensorDebugMode
from nanscope.format.tensors import MAX_FILL_ELEMENTS, ValueView

_FORWARD_LINKS_MAX = 1 << 20
# Dtypes whose FULL_TENSOR values a view may point at instead of copying them: those the
# native recorder copies itself (recorder.cpp's value_dtype), so that both write the same.
_VIEWABLE = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    }
)


class _Values:
    """Where the FULL_TENSOR values of a tensor are while its storage has not been written
    since (its version counter, shared with its views, has not moved): the execution and
    output that hold them, as a contiguous root's elements from ``offset`` on."""

    __slots__ = ("dtype", "numel", "offset", "sequence", "slot", "storage", "version")

    def __init__(
        self,
        version: int,
        storage: int,
        dtype: torch.dtype,
        sequence: int,
        slot: int,
        offset: int,
        numel: int,
    ) -> None:
        self.version, self.storage, self.dtype = version, storage, dtype
        self.sequence, self.slot, self.offset, self.numel = sequence, slot, offset, numel


class _Local(threading.local):
    def __init__(self) -> None:
        self.last_seq_nr = -1


class PythonRecorder(RecorderBase, DynamoFreeMode):
    """Records each op it sees into a :class:`DumpWriter` (a :class:`~.base.Recorder`).

    Pushed on the calling thread, and on threads started later, when made.
    """

    kind = "python"

    def __init__(self, setup: Setup) -> None:
        DynamoFreeMode.__init__(self)
        RecorderBase.__init__(self, setup)
        self.ids = TensorIds()
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
        # FULL_TENSOR: tensor id -> where its values are (see _Values and _view_of).
        self._values: dict[int, _Values] = {}
        self._full_tensor = self.mode == TensorDebugMode.FULL_TENSOR
        self._health = self.mode in HEALTH_MODES
        self._reads_values = self._health or self.mode == TensorDebugMode.FULL_TENSOR
        self._installed = InstalledMode(self)

    def handle(
        self, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> Any:
        if SUSPENDED.depth:  # nanscope's own ops, a compiled graph: not looked up at all
            return func(*args, **(kwargs or {}))
        info = self._ops[func]
        sent: list[Any] | None = None
        if info.sends and info.record_values and self._reads_values:
            # What this rank sends, before an in-place collective overwrites it.
            try:
                ins = tensors_of(args, [])
                sent = self.summarize_inputs(ins, [False] * len(ins), [])
            except Exception as exc:
                self.failed(exc)
        out = func(*args, **(kwargs or {}))
        if SUSPENDED.depth:  # began while the op ran (a compilation started inside it)
            return out
        if not info.skip:
            try:
                tag = None
                if info.distributed:
                    summarise = info.record_values and self._reads_values
                    tag = self.distributed_op(func, info, args, out, summarise)
                self._record(info, args, kwargs, out, tag, sent)
            except Exception as exc:  # never break the user's program
                self.failed(exc)
        return out

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Without this, torch.compile runs every frame eagerly under the mode;
        # with it, compiled code runs and nanscope.backends.torch.compiled
        # records its graphs and their summaries.
        return True

    # -- the Recorder protocol ---------------------------------------------------------------

    @property
    def cpu_device(self) -> int:
        did = self._devices.get("cpu")
        if did is None:
            did = self._devices["cpu"] = self.writer.register_device("cpu")
        return did

    def device_id(self, t: torch.Tensor) -> int:
        key = str(t.device)
        did = self._devices.get(key)
        if did is None:
            did = self._devices[key] = self.writer.register_device(key)
        return did

    def sync(self) -> None:
        """Nothing waits: each op goes to the writer as it is recorded."""

    def flush(self) -> None:
        self.submit_device_summaries()

    def close(self) -> None:
        self._installed.remove()
        if not self.inherited():  # a forked child: the device buffer's lock is the parent's
            self.submit_device_summaries()

    # -- recording ---------------------------------------------------------------------------

    def _summary(
        self,
        t: torch.Tensor,
        tid: int,
        info: OpInfo,
        source: tuple[int, torch.Tensor] | None,
        bumped: bool = True,
    ) -> Any:
        s = self._summary_of(t, tid, info, source, bumped)
        if info.view and self.mode == TensorDebugMode.FULL_HEALTH and isinstance(s, np.ndarray):
            # A view's values are its input's: their ranges belong to the op that made them
            # (nanscope.format.headroom), not to every view of them.
            s = s.copy()
            s[AMAX_SLOT:RECORDED_WIDTH] = np.nan
        return s

    def _summary_of(
        self,
        t: torch.Tensor,
        tid: int,
        info: OpInfo,
        source: tuple[int, torch.Tensor] | None,
        bumped: bool = True,
    ) -> Any:
        """``bumped``: an in-place op's output whose version counter moves when dispatch
        returns (a returned output); a written argument that it does not return
        (``_foreach_mul_``'s list) may keep its version under a dispatch mode."""
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
                self._remember(tid, t, s, info.inplace and bumped)
            return s
        if t.is_meta:
            return None
        return self.summarize_off_host(t)

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
        self,
        info: OpInfo,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        out: Any,
        collective: CollectiveTag | None = None,
        sent: list[Any] | None = None,
    ) -> None:
        # The hot path of the recorder: one call per op, kept to plain Python
        # operations (no per-op allocation beyond the event itself).
        ctx = self.context
        ins = tensors_of(args, [])
        if kwargs:
            for v in kwargs.values():
                tensors_of(v, ins)
        outs = tensors_of(out, [])
        returned = len(outs)
        if info.written:
            # What it wrote and does not return (_foreach_mul_, _fused_adamw_ return
            # nothing) are outputs too: new versions of those tensors.
            outs += written_tensors(info, args, kwargs, outs)
        ids = self.ids
        in_ids = [ids.get(t) for t in ins]
        out_ids = [ids.new(t) for t in outs]
        source = (in_ids[0], ins[0]) if info.same_elements and in_ids else None
        parts: list[Any] = []
        roots: list[tuple[int, int, torch.Tensor]] = []  # FULL_TENSOR values held by this record
        if info.uninitialised or (info.view and in_ids and in_ids[0] in self._blank):
            self._uninitialised(out_ids)
            parts = [None] * len(outs)
        elif self._full_tensor and info.record_values and not info.distributed:
            base = self._base_values(info, ins, in_ids)
            kept = self.dtype_filter
            for slot, (t, tid) in enumerate(zip(outs, out_ids, strict=True)):
                if kept is not None and not kept(t.dtype):
                    parts.append(None)
                    continue
                try:
                    view = None if base is None else _view_of(t, base)
                    if view is not None and base is not None:
                        parts.append(view)
                        self._remember_values(tid, t, base)
                        continue
                    value = self._summary(t, tid, info, None, slot < returned)
                    parts.append(value)
                    if isinstance(value, np.ndarray) and t.dtype in _VIEWABLE and t.is_cpu:
                        roots.append((slot, tid, t))
                except Exception as exc:  # an unusual tensor: record the op without its value
                    self.failed(exc)
                    parts.append(None)
        else:
            summary = self._summary
            for slot, (t, tid) in enumerate(zip(outs, out_ids, strict=True)):
                try:
                    parts.append(summary(t, tid, info, source, slot < returned))
                except Exception as exc:  # an unusual tensor: record the op without its summary
                    self.failed(exc)
                    parts.append(None)
        summaries: Any = parts
        input_summaries: list[Any] = []
        if any(type(p) is tuple for p in parts):  # device summaries, resolved later
            summaries = PendingSummaries(parts)
        if sent is not None:
            input_summaries = sent
        elif self._health and any(_nonfinite(self.mode, p) for p in parts):
            # The rare case worth the cost: what went into an op that made Inf/NaN.
            values = [
                a
                for a in (args[i] if i < len(args) else None for i in info.value_args)
                if type(a) is float or type(a) is int
            ]
            in_ids.extend([0] * len(values))
            mutated = [info.inplace and any(t is o for o in outs) for t in ins]
            input_summaries = self.summarize_inputs(ins, mutated, values)
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
        stack = self.writer.capture_stack(sys._getframe(3))  # the op's caller
        step = ctx.step
        if step != self._last_step:
            self._last_step = step
            self.submit_device_summaries()
        seq = self.writer.write_execution(
            ExecutionEvent(
                op_type=info.name,
                output_tensor_ids=out_ids,
                input_tensor_ids=in_ids,
                output_device_ids=[
                    self.cpu_device if t.is_cpu else self.device_id(t) for t in outs
                ],
                summaries=summaries,
                input_summaries=input_summaries,
                stack=stack,
                module_path=module_path,
                phase=phase,
                step=step,
                forward_sequence=forward_sequence,
                forward_stack=forward_stack,
                collective=collective,
            )
        )
        for slot, tid, t in roots:
            if t.is_contiguous() and t.numel() > 0 and t.layout == torch.strided:
                offset = int(t.storage_offset())
                root = _Values(0, 0, t.dtype, seq, slot, offset, t.numel())
                self._remember_values(tid, t, root, info.inplace and slot < returned)
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

    def _base_values(
        self, info: OpInfo, ins: list[torch.Tensor], in_ids: list[int]
    ) -> _Values | None:
        """A view op's input's recorded values, if its storage was not written since."""
        if not info.view or not in_ids:
            return None
        entry = self._values.get(in_ids[0])
        if entry is None or entry.version < 0 or entry.version != _version(ins[0]):
            return None
        return entry

    def _remember_values(
        self, tid: int, t: torch.Tensor, root: _Values, inplace: bool = False
    ) -> None:
        version = _version(t)
        if version < 0:
            return  # no version counter (inference mode): never point at old values
        if inplace:  # an in-place op's output gets its version bump after dispatch returns
            version += 1
        values = self._values
        values[tid] = _Values(
            version,
            t.untyped_storage().data_ptr(),
            t.dtype,
            root.sequence,
            root.slot,
            root.offset,
            root.numel,
        )
        if len(values) > 8192:
            for k in list(values)[:4096]:
                del values[k]


def _view_of(t: torch.Tensor, base: _Values) -> ValueView | None:
    """``t`` as a view of ``base``'s recorded values, if every element it reads is there."""
    if not (t.is_cpu and t.layout == torch.strided and t.dtype == base.dtype):
        return None
    if t.is_neg() or t.is_conj() or t.numel() == 0:
        return None
    if t.untyped_storage().data_ptr() != base.storage:
        return None
    strides = t.stride()
    if any(s < 0 for s in strides):
        return None
    first = int(t.storage_offset()) - base.offset
    last = first + sum((d - 1) * s for d, s in zip(t.shape, strides, strict=True))
    # A broadcast may hold more elements than its base: up to what a reader fills (FORMAT.md).
    if first < 0 or last >= base.numel or t.numel() > max(base.numel, MAX_FILL_ELEMENTS):
        return None
    return ValueView(base.sequence, base.slot, first, tuple(t.shape), tuple(strides), _counts(t))


def _counts(t: torch.Tensor) -> tuple[int, ...]:
    """A view's counts for the index: its size, and for a float type the Inf/NaN and signs."""
    size = t.numel()
    if t.dtype not in FLOAT_DTYPES:
        return (size,)
    ni, pi, nn, neg, zero, pos = tensor_counts(t)
    return (size, ni, pi, nn, neg, zero, pos)


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
