"""Decoding ``DebugEvent`` payloads into index rows and reader records."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nanscope.format.health import index_row, summary_problem
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.proto.tensor_pb2 import TensorProto
from nanscope.format.tensors import ValueView, proto_to_array

# The most elements a summary vector may claim (the widest mode's has 11): a proto that
# claims more is not a summary, and is not decoded (docs/FORMAT.md, "Limits").
MAX_SUMMARY_ELEMENTS = 1024


class DecodeError(ValueError):
    """A record whose CRC checks out but whose content is not a valid event."""


def wall_time(event: pb.DebugEvent) -> float:
    """The event's wall time; 0.0 (unknown) for NaN or an infinity, which JSON cannot carry."""
    t = event.wall_time
    return t if math.isfinite(t) else 0.0


def parse_event(payload: bytes | memoryview) -> pb.DebugEvent:
    event = pb.DebugEvent()
    try:
        event.ParseFromString(bytes(payload))
    except Exception as exc:  # protobuf raises DecodeError, but also others on garbage
        raise DecodeError(f"not a DebugEvent ({exc})") from None
    return event


def mode_of(value: int) -> TensorDebugMode:
    """The mode an event names; ``UNSPECIFIED`` for a number this reader does not know."""
    try:
        return TensorDebugMode(value)
    except ValueError:
        return TensorDebugMode.UNSPECIFIED


def tensor_values(
    protos: list[TensorProto],
    mode: TensorDebugMode,
    problems: list[str] | None = None,
    what: str = "output",
) -> list[np.ndarray | None]:
    """Each proto's value (None where it has none or cannot be decoded).

    In FULL_TENSOR mode a proto is a value and may hold as many elements as its bytes
    do; in the other modes it is a summary: at most :data:`MAX_SUMMARY_ELEMENTS`, read
    flat. Why a proto was refused, or why its summary is malformed, is appended to
    ``problems`` (``"output 0: ..."``), for the caller to say where the record is.
    """
    full = mode == TensorDebugMode.FULL_TENSOR
    limit = None if full else MAX_SUMMARY_ELEMENTS
    out: list[np.ndarray | None] = []
    for slot, p in enumerate(protos):
        try:
            value = proto_to_array(p, limit)
        except ValueError as exc:
            if problems is not None:
                problems.append(f"{what} {slot}: {exc}; not shown")
            out.append(None)
            continue
        if value is not None and not full:
            if value.dtype.kind in "cOSUV" and value.dtype.name != "bfloat16":
                # Complex numbers, strings: no count, rank or flag can be read from them.
                if problems is not None:
                    problems.append(f"{what} {slot}: a summary of {value.dtype} holds no counts")
                out.append(None)
                continue
            # Summaries are vectors of float64 (TensorFlow's layout); of_summary reads them flat.
            value = value.reshape(-1).astype(np.float64, copy=False)
            if problems is not None and (why := summary_problem(mode, value)) is not None:
                problems.append(f"{what} {slot}: {why}; read as unknown")
        out.append(value)
    return out


def output_views(
    ex: pb.Execution, values: list[Any], problems: list[str] | None = None
) -> dict[int, ValueView]:
    """FULL_TENSOR: the outputs that are views of values recorded before, by slot
    (``Execution.output_views``), each put in ``values`` for its health (see
    :func:`nanscope.format.health.of_view`). An entry naming an output that is not
    there, or one that holds a value of its own, is a problem and left out."""
    views: dict[int, ValueView] = {}
    for v in ex.output_views:
        slot = int(v.output_slot)
        if not 0 <= slot < len(values) or values[slot] is not None or slot in views:
            if problems is not None:
                problems.append(
                    f"output {slot}: a view entry for an output that has a value "
                    "or is not there; not shown"
                )
            continue
        views[slot] = values[slot] = ValueView(
            int(v.sequence),
            int(v.slot),
            int(v.offset),
            tuple(v.shape),
            tuple(v.strides),
            tuple(v.counts),
        )
    return views


# Row tuple: (name, graph, slot, wall_time, step, sequence, size, neg_inf, pos_inf,
# nan, nonfinite, phase, device), strings as str (the caller interns them).
RowData = tuple[str, str, int, float, int, int, int, int, int, int, int, int, int]


def execution_row(event: pb.DebugEvent, problems: list[str]) -> RowData:
    """The index row of an execution; what is wrong with its outputs goes to ``problems``."""
    ex = event.execution
    mode = mode_of(ex.tensor_debug_mode)
    values: list[Any] = tensor_values(list(ex.tensor_protos), mode, problems)
    if ex.output_views and mode == TensorDebugMode.FULL_TENSOR:
        output_views(ex, values, problems)
    h = index_row(mode, values)
    device = ex.output_tensor_device_ids[0] if ex.output_tensor_device_ids else 0
    return (
        ex.op_type,
        ex.graph_id,
        ex.num_outputs,
        wall_time(event),
        event.step,
        ex.sequence,
        *h,
        ex.phase,
        device,
    )


def trace_row(event: pb.DebugEvent, problems: list[str]) -> RowData:
    """The index row of a trace; what is wrong with its tensor goes to ``problems``."""
    tr = event.graph_execution_trace
    mode = mode_of(tr.tensor_debug_mode)
    values = tensor_values([tr.tensor_proto], mode, problems) if tr.HasField("tensor_proto") else []
    h = index_row(mode, values)
    return (
        tr.op_name,
        tr.tfdbg_context_id,
        tr.output_slot,
        wall_time(event),
        event.step,
        tr.sequence,
        *h,
        0,
        0,
    )
