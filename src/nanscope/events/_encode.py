"""Serialising events into ``DebugEvent`` records (hand-encoded hot paths).

The encoder also derives, for the sidecar index, each record's health counts
from its summaries, so the writer never decodes what it just encoded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nanscope.events import _wire as wire
from nanscope.events._model import CollectiveTag, ExecutionEvent, Pending, TraceEvent
from nanscope.format import headroom
from nanscope.format.headroom import (
    AMAX_SLOT,
    RECORDED_WIDTH,
    TFDBG_WIDTH,
    UNKNOWN_RANGES,
    RangeRow,
)
from nanscope.format.health import IndexRow, index_row, of_array
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.statistics import MEAN_SLOT, PER_OUTPUT, STATISTICS_WIDTH
from nanscope.format.tensors import ValueView, array_to_proto

_V = wire.varint
_TAG = {f: wire.tag(f, wire.LEN) for f in (4, 5, 7, 8, 9, 10, 1004, 1006)}
_TAG_VARINT = {f: wire.tag(f, wire.VARINT) for f in (1003, 1005, 1006)}
# TensorFlow's NO_TENSOR graph trace: an empty float32 tensor of shape [0].
_NO_TENSOR_PROTO = b"\x08\x01" + wire.len_field(2, wire.len_field(2, b""))

MAX_VALUE_BYTES = 1 << 30
"""FULL_TENSOR: the values one record holds at most, by default (see :func:`cap_values`)."""


def omitted(value: np.ndarray) -> ValueView:
    """A FULL_TENSOR value written without its elements: a view entry (``output_views``)
    naming no record (sequence 0, which no execution has), with the value's shape, C-order
    strides and health counts (``size``, then ``-inf, +inf, nan, negative, zero, positive``
    for a float type)."""
    shape = tuple(int(d) for d in value.shape)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    counts: tuple[int, ...]
    if value.dtype.kind == "c":
        # No signs to count; its Inf and NaN in the slots a reader looks at.
        flat = value.reshape(-1)
        nan = inf = 0
        for lo in range(0, flat.size, 1 << 21):
            part = flat[lo : lo + (1 << 21)]
            bad_nan = np.isnan(part)
            nan += int(np.count_nonzero(bad_nan))
            inf += int(np.count_nonzero(np.isinf(part) & ~bad_nan))
        counts = (int(value.size), 0, inf, nan, 0, 0, 0)
    else:
        h = of_array(value)
        if h.neg is None:  # not a float type: the size alone
            counts = (int(value.size),)
        else:
            counts = (h.size, h.neg_inf, h.pos_inf, h.nan, h.neg, h.zero, h.pos)  # type: ignore[assignment]
    return ValueView(0, 0, 0, shape, tuple(strides), counts)


def cap_values(
    values: Sequence[np.ndarray | ValueView | None], budget: int, views: bool = True
) -> tuple[list[np.ndarray | ValueView | None], int, int]:
    """FULL_TENSOR values with those past ``budget`` bytes (in order) written without their
    elements: as :func:`omitted` views (``views``, outputs), or as nothing (inputs, which
    have no view entries). Returns the values, the budget left and how many were omitted."""
    out: list[np.ndarray | ValueView | None] = []
    dropped = 0
    for v in values:
        if isinstance(v, np.ndarray):
            if v.nbytes > budget:
                out.append(omitted(v) if views else None)
                dropped += 1
                continue
            budget -= v.nbytes
        out.append(v)
    return out, budget, dropped


def collective_field(tag: CollectiveTag) -> bytes:
    """An execution's ``collective`` field (1007). Collectives are few: protobuf encodes it."""
    op = pb.CollectiveOp(
        group=tag.group,
        group_desc=tag.group_desc,
        group_size=tag.group_size,
        kind=tag.kind,
        sequence=tag.sequence,
        peer=tag.peer,
        framework_sequence=tag.framework_sequence,
    )
    return wire.len_field(1007, op.SerializeToString())


def view_field(slot: int, view: ValueView) -> bytes:
    """An execution's ``output_views`` entry (1009) for its output ``slot`` (FULL_TENSOR)."""
    message = pb.ValueView(
        output_slot=slot,
        sequence=view.sequence,
        slot=view.slot,
        offset=view.offset,
        shape=view.shape,
        strides=view.strides,
        counts=view.counts,
    )
    return wire.len_field(1009, message.SerializeToString())


def resolve(summaries: Sequence[np.ndarray | None] | Pending) -> Sequence[np.ndarray | None]:
    if isinstance(summaries, (list, tuple)):
        return summaries
    if hasattr(summaries, "resolve"):
        return summaries.resolve()
    return list(summaries)


class Encoder:
    """Turns events into ``DebugEvent`` payloads, caching every constant part."""

    def __init__(
        self,
        mode: TensorDebugMode,
        host_name: str,
        stacks: list[tuple[str, ...]],
        max_value_bytes: int = MAX_VALUE_BYTES,
    ) -> None:
        self.mode = mode
        # FULL_TENSOR: the values one record holds at most (see cap_values).
        self.max_value_bytes = max_value_bytes
        self.values_omitted = 0  # values written without their elements (past the bound)
        self.host_name = host_name
        self._stacks = stacks
        self._mode_exec = wire.int_field(6, int(mode))
        self._mode_trace = wire.int_field(4, int(mode))
        self._code_locations: dict[int, bytes] = {}
        self._exec_heads: dict[tuple[str, int, str], bytes] = {}
        self._exec_extras: dict[tuple[str, int], bytes] = {}
        self._trace_heads: dict[tuple[str, str, int], bytes] = {}
        self._trace_devices: dict[str, bytes] = {}
        self._summary_heads: dict[int, bytes] = {}
        self._field_heads: dict[tuple[int, int], bytes] = {}
        self._located: dict[int, bytes] = {}

    # -- shared pieces ---------------------------------------------------------------------

    def code_location(self, stack: int) -> bytes:
        """A serialised ``CodeLocation`` for a stack id (cached)."""
        loc = self._code_locations.get(stack)
        if loc is None:
            frames = self._stacks[stack] if 0 <= stack < len(self._stacks) else ()
            loc = wire.str_field(1, self.host_name) + wire.repeated_str(2, frames)
            self._code_locations[stack] = loc
        return loc

    def summary_proto(self, vector: np.ndarray) -> bytes:
        """A serialised ``TensorProto`` of a float64 summary, as TensorFlow's graph path writes it."""
        n = len(vector)
        head = self._summary_heads.get(n)
        if head is None:
            shape = wire.len_field(2, wire.len_field(2, wire.int_field(1, n)))
            head = b"\x08\x02" + shape + wire.tag(4, wire.LEN) + wire.varint(8 * n)
            self._summary_heads[n] = head
        if vector.dtype != np.float64:
            vector = vector.astype(np.float64)
        return head + vector.tobytes()

    def value_proto(self, value: np.ndarray | ValueView | None) -> bytes:
        if value is None or isinstance(value, ValueView):  # a view: see output_views
            return b""
        if self.mode == TensorDebugMode.FULL_TENSOR:
            return bytes(array_to_proto(np.asarray(value)).SerializeToString())
        return self.summary_proto(value)

    def cap_trace(self, value: np.ndarray | None) -> np.ndarray | None:
        """FULL_TENSOR: a trace's value, or ``None`` when it is past :attr:`max_value_bytes`
        (a trace has no view entries: its record then holds no value, and only the
        sidecar index its health)."""
        if (
            self.mode == TensorDebugMode.FULL_TENSOR
            and isinstance(value, np.ndarray)
            and value.nbytes > self.max_value_bytes
        ):
            self.values_omitted += 1
            return None
        return value

    def cap_outputs(
        self, summaries: Sequence[np.ndarray | None]
    ) -> tuple[Sequence[np.ndarray | None], int]:
        """FULL_TENSOR: an execution's output values with those past the record's bound
        (:attr:`max_value_bytes`) as :func:`omitted` views; returns them and the bytes of
        values left for the inputs. Other modes: unchanged."""
        if self.mode != TensorDebugMode.FULL_TENSOR:
            return summaries, 0
        capped, left, dropped = cap_values(summaries, self.max_value_bytes)
        if not dropped:
            return summaries, left
        self.values_omitted += dropped
        return capped, left  # type: ignore[return-value]

    # -- executions ------------------------------------------------------------------------

    def execution_pieces(self, width: int) -> tuple[bytes, bytes, bytes]:
        """For encoders outside Python: the mode field, a ``width``-slot summary's
        field up to its doubles, and the field of an output without a summary."""
        prefix = self._summary_field(7, np.zeros(width))[: -8 * width] if width else b""
        return self._mode_exec, prefix, _TAG[7] + b"\x00"

    def location_field(self, stack: int, forward: bool = False) -> bytes:
        """The code location field (8, or 1004 for a forward stack) of a stack id."""
        if stack < 0:
            return b""
        return wire.len_field(1004 if forward else 8, self.code_location(stack))

    def extras_field(self, module_path: str, phase: int) -> bytes:
        """nanscope's module path and phase fields of an execution."""
        return wire.str_field(1001, module_path) + wire.int_field(1002, phase)

    def _summary_field(self, field: int, value: np.ndarray | None) -> bytes:
        """A ``tensor_protos``-style field holding one summary (cached prefix per length)."""
        if value is None:
            return _TAG[field] + b"\x00"
        if self.mode == TensorDebugMode.FULL_TENSOR:
            return wire.len_field(field, self.value_proto(value))
        n = len(value)
        key = (field, n)
        prefix = self._field_heads.get(key)
        if prefix is None:
            head = self.summary_proto(np.zeros(n))[: -8 * n]
            prefix = self._field_heads[key] = _TAG[field] + _V(len(head) + 8 * n) + head
        if value.dtype != np.float64:
            value = value.astype(np.float64)
        return prefix + value.tobytes()

    def execution(
        self,
        ev: ExecutionEvent,
        sequence: int,
        wall_time: float,
        summaries: Sequence[np.ndarray | None] | None = None,
    ) -> tuple[bytes, IndexRow, Sequence[np.ndarray | None]]:
        """``(payload, health, output summaries)`` for one execution.

        ``summaries`` are the event's, already resolved (else resolved here).
        """
        num_outputs = ev.num_outputs if ev.num_outputs >= 0 else len(ev.output_tensor_ids)
        hkey = (ev.op_type, num_outputs, ev.graph_id)
        head = self._exec_heads.get(hkey)
        if head is None:
            head = (
                wire.str_field(1, ev.op_type)
                + wire.int_field(2, num_outputs)
                + wire.str_field(3, ev.graph_id)
            )
            self._exec_heads[hkey] = head
        no_tensor = self.mode == TensorDebugMode.NO_TENSOR
        if no_tensor:
            summaries = ()
        elif summaries is None:
            summaries = resolve(ev.summaries)
        original = summaries
        # FULL_TENSOR: at most max_value_bytes of values per record (the reader refuses
        # records from 2 GiB); outputs first, then the inputs with what is left.
        summaries, left = self.cap_outputs(summaries)
        parts = [head]
        ids = ev.input_tensor_ids
        if ids:
            body = b"".join(map(_V, ids))
            parts += (_TAG[4], _V(len(body)), body)
        ids = ev.output_tensor_ids
        if ids:
            body = b"".join(map(_V, ids))
            parts += (_TAG[5], _V(len(body)), body)
        parts.append(self._mode_exec)
        field = self._summary_field
        ranges = None
        stats: np.ndarray | None = None
        views = b""
        if self.mode == TensorDebugMode.FULL_HEALTH:
            # In memory a FULL_HEALTH summary carries its ranges after tfdbg2's 11
            # slots (nanscope.format.headroom); on disk they go to their own field.
            ranges = np.full(2 * len(summaries), np.nan, dtype="<f8")
            for i, s in enumerate(summaries):
                if s is not None and len(s) >= RECORDED_WIDTH:
                    ranges[2 * i : 2 * i + 2] = s[AMAX_SLOT:RECORDED_WIDTH]
                    if len(s) >= STATISTICS_WIDTH:
                        # With statistics asked for, four more slots (field 1010).
                        if stats is None:
                            stats = np.full(PER_OUTPUT * len(summaries), np.nan, dtype="<f8")
                        stats[PER_OUTPUT * i : PER_OUTPUT * (i + 1)] = s[MEAN_SLOT:STATISTICS_WIDTH]
                    s = s[:TFDBG_WIDTH]
                parts.append(field(7, s))
        else:
            for slot, s in enumerate(summaries):
                if isinstance(s, ValueView):
                    views += view_field(slot, s)
                    s = None
                parts.append(field(7, s))
        if ev.stack >= 0:
            loc = self._located.get(ev.stack)
            if loc is None:
                loc = self._located[ev.stack] = wire.len_field(8, self.code_location(ev.stack))
            parts.append(loc)
        ids = ev.output_device_ids
        if ids:
            body = b"".join(map(_V, ids))
            parts += (_TAG[9], _V(len(body)), body)
        ekey = (ev.module_path, int(ev.phase))
        extra = self._exec_extras.get(ekey)
        if extra is None:
            extra = wire.str_field(1001, ev.module_path) + wire.int_field(1002, int(ev.phase))
            self._exec_extras[ekey] = extra
        parts.append(extra)
        if ev.forward_sequence:
            parts += (_TAG_VARINT[1003], _V(ev.forward_sequence))
        if ev.forward_stack >= 0:
            parts.append(wire.len_field(1004, self.code_location(ev.forward_stack)))
        if sequence:
            parts += (_TAG_VARINT[1005], _V(sequence))
        if not no_tensor and ev.input_summaries:
            inputs = resolve(ev.input_summaries)
            if self.mode == TensorDebugMode.FULL_TENSOR:
                capped, _, dropped = cap_values(inputs, left, views=False)
                self.values_omitted += dropped
                inputs = capped  # type: ignore[assignment]
            for s in inputs:
                if s is not None and ranges is not None:
                    s = s[:TFDBG_WIDTH]
                parts.append(field(1006, s))
        if ev.collective is not None:
            parts.append(collective_field(ev.collective))
        if ranges is not None and len(ranges) and not np.isnan(ranges).all():
            parts.append(wire.len_field(1008, ranges.tobytes()))
        if stats is not None and not np.isnan(stats).all():
            parts.append(wire.len_field(1010, stats.tobytes()))
        parts.append(views)
        body = b"".join(parts)
        payload = b"".join(
            (
                wire.double_field(1, wall_time),
                wire.int_field(2, ev.step),
                _TAG[9],
                _V(len(body)),
                body,
            )
        )
        # The health from the capped values (an omitted value's counts were taken once);
        # the values returned as they came (their ranges are still wanted).
        return payload, index_row(self.mode, summaries), original

    def ranges(self, summaries: Sequence[np.ndarray | None]) -> RangeRow:
        """An execution's ranges for the range history, from its summaries (or FULL_TENSOR values)."""
        if self.mode == TensorDebugMode.FULL_HEALTH:
            return headroom.of_summaries(summaries)
        if self.mode == TensorDebugMode.FULL_TENSOR:  # views' values are counted where made
            return headroom.of_values([s for s in summaries if isinstance(s, np.ndarray)])
        return UNKNOWN_RANGES

    # -- graph execution traces ------------------------------------------------------------

    def _trace_head(self, graph_id: str, op_name: str, slot: int) -> bytes:
        key = (graph_id, op_name, slot)
        head = self._trace_heads.get(key)
        if head is None:
            head = (
                wire.str_field(1, graph_id)
                + wire.str_field(2, op_name)
                + wire.int_field(3, slot)
                + self._mode_trace
            )
            self._trace_heads[key] = head
        return head

    def _trace_device(self, device_name: str) -> bytes:
        dev = self._trace_devices.get(device_name)
        if dev is None:
            dev = self._trace_devices[device_name] = wire.str_field(6, device_name)
        return dev

    def trace(self, ev: TraceEvent, sequence: int, wall_time: float) -> bytes:
        """The payload of one trace."""
        if self.mode == TensorDebugMode.NO_TENSOR:
            value = _NO_TENSOR_PROTO
        else:
            value = self.value_proto(self.cap_trace(ev.summary))
        body = (
            self._trace_head(ev.graph_id, ev.op_name, ev.output_slot)
            + wire.len_field(5, value)
            + self._trace_device(ev.device_name)
            + wire.int_field(1005, sequence)
        )
        return b"".join(
            (
                wire.double_field(1, wall_time),
                wire.int_field(2, ev.step),
                _TAG[10],
                _V(len(body)),
                body,
            )
        )

    def trace_batch(
        self,
        graph_id: str,
        op_names: Sequence[str],
        slots: Sequence[int],
        matrix: np.ndarray,
        device_name: str,
        step: int,
        first_sequence: int,
        wall_time: float,
        iterations: np.ndarray | None = None,
    ) -> tuple[list[bytes], np.ndarray]:
        """Payloads for one graph call's summaries (one row of ``matrix`` per traced tensor).

        ``iterations``: per row, the loop iteration plus one (0: not in a loop).

        Returns the payloads and an ``(n, 5)`` int64 array of health columns
        ``size, neg_inf, pos_inf, nan, nonfinite``, computed for all rows at once.
        """
        m = np.ascontiguousarray(matrix, dtype=np.float64)
        n = m.shape[0]
        stats: list[bytes] | None = None
        if (
            self.mode == TensorDebugMode.FULL_HEALTH
            and m.ndim == 2
            and m.shape[1] >= STATISTICS_WIDTH
        ):
            # Statistics (compiled graphs, with statistics asked for): field 1010 of each
            # trace; the summary keeps tfdbg2's eleven slots.
            block = m[:, MEAN_SLOT:STATISTICS_WIDTH]
            stats = [
                b"" if np.isnan(row).all() else wire.len_field(1010, row.tobytes())
                for row in np.ascontiguousarray(block, dtype="<f8")
            ]
            m = np.ascontiguousarray(m[:, :TFDBG_WIDTH])
        dev = self._trace_device(device_name)
        event_head = wire.double_field(1, wall_time) + wire.int_field(2, step)
        width = m.shape[1] if m.ndim == 2 else 0
        summary_head = self.summary_proto(np.zeros(width))[: -8 * width] if width else b""
        middle = _TAG[5] + _V(len(summary_head) + 8 * width) + summary_head
        if self.mode == TensorDebugMode.NO_TENSOR:  # no values: ``matrix`` is (n, 0)
            middle = wire.len_field(5, _NO_TENSOR_PROTO)
        row_bytes = 8 * width
        blob = m.tobytes()
        head = self._trace_head
        tag10, tag1005, varint, join = _TAG[10], _TAG_VARINT[1005], _V, b"".join
        payloads: list[bytes] = []
        append = payloads.append
        loops = iterations.tolist() if iterations is not None else None
        tag1006 = _TAG_VARINT[1006]
        for i in range(n):
            body = join(
                (
                    head(graph_id, op_names[i], slots[i]),
                    middle,
                    blob[i * row_bytes : (i + 1) * row_bytes],
                    dev,
                    tag1005,
                    varint(first_sequence + i),
                )
            )
            if loops is not None and loops[i] > 0:
                body += tag1006 + varint(int(loops[i]))
            if stats is not None:
                body += stats[i]
            append(join((event_head, tag10, varint(len(body)), body)))
        health = np.full((n, 5), -1, dtype=np.int64)
        if self.mode == TensorDebugMode.FULL_HEALTH and width >= 11:
            health[:, 0] = m[:, 4]
            health[:, 1:4] = m[:, 5:8]
            health[:, 4] = (m[:, 5:8].sum(axis=1) > 0).astype(np.int64)
        elif self.mode == TensorDebugMode.CONCISE_HEALTH and width >= 5:
            health[:, 0:4] = m[:, 1:5]
            health[:, 4] = (m[:, 2:5].sum(axis=1) > 0).astype(np.int64)
        elif self.mode == TensorDebugMode.CURT_HEALTH and width >= 2:
            health[:, 4] = (m[:, 1] != 0).astype(np.int64)
        elif self.mode == TensorDebugMode.SHAPE and width >= 4:
            health[:, 0] = m[:, 3]
        return payloads, health
