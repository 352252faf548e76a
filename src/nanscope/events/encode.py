"""Serialising events into ``DebugEvent`` records (hand-encoded hot paths).

The encoder also derives, for the sidecar index, each record's health counts
from its summaries, so the writer never decodes what it just encoded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nanscope.events import wire
from nanscope.events.model import ExecutionEvent, Pending, TraceEvent
from nanscope.format.modes import UNKNOWN_HEALTH, HealthRow, TensorDebugMode, summary_health
from nanscope.format.tensors import array_to_proto

_EMPTY_TENSOR = wire.len_field(7, b"")  # Execution.tensor_protos entry for a skipped output
# TensorFlow's NO_TENSOR graph trace: an empty float32 tensor of shape [0].
_NO_TENSOR_PROTO = b"\x08\x01" + wire.len_field(2, wire.len_field(2, b""))


def resolve(summaries: Sequence[np.ndarray | None] | Pending) -> Sequence[np.ndarray | None]:
    if isinstance(summaries, (list, tuple)):
        return summaries
    if hasattr(summaries, "resolve"):
        return summaries.resolve()
    return list(summaries)


class Encoder:
    """Turns events into ``DebugEvent`` payloads, caching every constant part."""

    def __init__(
        self, mode: TensorDebugMode, host_name: str, stacks: list[tuple[str, ...]]
    ) -> None:
        self.mode = mode
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

    def value_proto(self, value: np.ndarray | None) -> bytes:
        if value is None:
            return b""
        if self.mode == TensorDebugMode.FULL_TENSOR:
            return bytes(array_to_proto(np.asarray(value)).SerializeToString())
        return self.summary_proto(value)

    # -- executions ------------------------------------------------------------------------

    def execution(
        self, ev: ExecutionEvent, sequence: int, wall_time: float
    ) -> tuple[bytes, HealthRow, Sequence[np.ndarray | None]]:
        """``(payload, health, resolved output summaries)`` for one execution."""
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
        summaries = resolve(ev.summaries) if self.mode != TensorDebugMode.NO_TENSOR else ()
        parts = [
            head,
            wire.packed_ints(4, ev.input_tensor_ids),
            wire.packed_ints(5, ev.output_tensor_ids),
            self._mode_exec,
        ]
        for s in summaries:
            parts.append(_EMPTY_TENSOR if s is None else wire.len_field(7, self.value_proto(s)))
        if ev.stack >= 0:
            parts.append(wire.len_field(8, self.code_location(ev.stack)))
        parts.append(wire.packed_ints(9, ev.output_device_ids))
        ekey = (ev.module_path, int(ev.phase))
        extra = self._exec_extras.get(ekey)
        if extra is None:
            extra = wire.str_field(1001, ev.module_path) + wire.int_field(1002, int(ev.phase))
            self._exec_extras[ekey] = extra
        parts.append(extra)
        parts.append(wire.int_field(1003, ev.forward_sequence))
        if ev.forward_stack >= 0:
            parts.append(wire.len_field(1004, self.code_location(ev.forward_stack)))
        parts.append(wire.int_field(1005, sequence))
        if self.mode != TensorDebugMode.NO_TENSOR and ev.input_summaries:
            for s in resolve(ev.input_summaries):
                parts.append(
                    wire.len_field(1006, b"")
                    if s is None
                    else wire.len_field(1006, self.value_proto(s))
                )
        body = b"".join(parts)
        payload = (
            wire.double_field(1, wall_time) + wire.int_field(2, ev.step) + wire.len_field(9, body)
        )
        return payload, summary_health(self.mode, summaries), summaries

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

    def trace(self, ev: TraceEvent, sequence: int, wall_time: float) -> tuple[bytes, HealthRow]:
        if self.mode == TensorDebugMode.NO_TENSOR:
            value = _NO_TENSOR_PROTO
        else:
            value = self.value_proto(ev.summary)
        body = (
            self._trace_head(ev.graph_id, ev.op_name, ev.output_slot)
            + wire.len_field(5, value)
            + self._trace_device(ev.device_name)
            + wire.int_field(1005, sequence)
        )
        payload = (
            wire.double_field(1, wall_time) + wire.int_field(2, ev.step) + wire.len_field(10, body)
        )
        health = (
            summary_health(self.mode, (ev.summary,)) if ev.summary is not None else UNKNOWN_HEALTH
        )
        return payload, health

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
    ) -> tuple[list[bytes], np.ndarray]:
        """Payloads for one graph call's summaries (one row of ``matrix`` per traced tensor).

        Returns the payloads and an ``(n, 5)`` int64 array of health columns
        ``size, neg_inf, pos_inf, nan, nonfinite``, computed for all rows at once.
        """
        m = np.ascontiguousarray(matrix, dtype=np.float64)
        n = m.shape[0]
        dev = self._trace_device(device_name)
        event_head = wire.double_field(1, wall_time) + wire.int_field(2, step)
        payloads: list[bytes] = []
        append = payloads.append
        width = m.shape[1] if m.ndim == 2 else 0
        summary_head = self.summary_proto(np.zeros(width))[: -8 * width] if width else b""
        value_field_head = wire.tag(5, wire.LEN) + wire.varint(len(summary_head) + 8 * width)
        for i in range(n):
            body = (
                self._trace_head(graph_id, op_names[i], slots[i])
                + value_field_head
                + summary_head
                + m[i].tobytes()
                + dev
                + wire.int_field(1005, first_sequence + i)
            )
            append(event_head + wire.tag(10, wire.LEN) + wire.varint(len(body)) + body)
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
