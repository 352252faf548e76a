"""Decoding ``DebugEvent`` payloads into index rows and reader records."""

from __future__ import annotations

import numpy as np

from nanscope.format.health import index_row
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.proto.tensor_pb2 import TensorProto
from nanscope.format.tensors import proto_to_array


class DecodeError(ValueError):
    """A record whose CRC checks out but whose content is not a valid event."""


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


def tensor_values(protos: list[TensorProto]) -> list[np.ndarray | None]:
    out: list[np.ndarray | None] = []
    for p in protos:
        try:
            out.append(proto_to_array(p))
        except ValueError:
            out.append(None)
    return out


# Row tuple: (name, graph, slot, wall_time, step, sequence, size, neg_inf, pos_inf,
# nan, nonfinite, phase, device), strings as str (the caller interns them).
RowData = tuple[str, str, int, float, int, int, int, int, int, int, int, int, int]


def execution_row(event: pb.DebugEvent) -> RowData:
    ex = event.execution
    h = index_row(mode_of(ex.tensor_debug_mode), tensor_values(list(ex.tensor_protos)))
    device = ex.output_tensor_device_ids[0] if ex.output_tensor_device_ids else 0
    return (
        ex.op_type,
        ex.graph_id,
        ex.num_outputs,
        event.wall_time,
        event.step,
        ex.sequence,
        *h,
        ex.phase,
        device,
    )


def trace_row(event: pb.DebugEvent) -> RowData:
    tr = event.graph_execution_trace
    values = tensor_values([tr.tensor_proto]) if tr.HasField("tensor_proto") else []
    h = index_row(mode_of(tr.tensor_debug_mode), values)
    return (
        tr.op_name,
        tr.tfdbg_context_id,
        tr.output_slot,
        event.wall_time,
        event.step,
        tr.sequence,
        *h,
        0,
        0,
    )
