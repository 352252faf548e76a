"""Hand-made dumps whose records claim more than their bytes hold.

Each builder writes a minimal, well-framed file set (valid CRCs, a metadata
record) whose one execution or trace carries a crafted ``TensorProto``: a shape
of 12000x12000 with one value, a FULL_TENSOR value without its bytes, a SHAPE
summary with an absurd rank. They model a hostile or corrupted dump that no
CRC check can catch, and are shared by the unit tests, the CLI test and the fuzzer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nanscope.format import files
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.proto import tensor_pb2
from nanscope.format.records import frame
from nanscope.format.tensors import DataType

BIG = (12000, 12000)  # 144M elements: 1.1 GB of float64 if anyone believed it


def proto(
    dtype: DataType,
    shape: Sequence[int],
    *,
    content: bytes = b"",
    double_val: Sequence[float] = (),
    float_val: Sequence[float] = (),
    string_val: Sequence[bytes] = (),
) -> tensor_pb2.TensorProto:
    """A ``TensorProto`` that says exactly what it is told to, true or not."""
    p = tensor_pb2.TensorProto(dtype=int(dtype), tensor_content=content)  # type: ignore[arg-type]
    for d in shape:
        p.tensor_shape.dim.add(size=int(d))
    p.double_val.extend(double_val)
    p.float_val.extend(float_val)
    p.string_val.extend(string_val)
    return p


def summary(
    vector: Sequence[float] | np.ndarray, shape: Sequence[int] | None = None
) -> tensor_pb2.TensorProto:
    """A float64 summary vector in ``tensor_content``, with its true shape unless told otherwise."""
    v = np.asarray(vector, dtype="<f8")
    return proto(DataType.DT_DOUBLE, shape if shape is not None else v.shape, content=v.tobytes())


def write_dump(
    logdir: Path,
    mode: TensorDebugMode,
    outputs: Sequence[tensor_pb2.TensorProto] = (),
    *,
    trace: tensor_pb2.TensorProto | None = None,
    num_outputs: int | None = None,
    inputs: Sequence[tensor_pb2.TensorProto] = (),
    input_names: Sequence[str] = (),
) -> Path:
    """One file set under ``logdir``: one execution with ``outputs``, one trace of ``trace``.

    Returns the ``.execution`` file (its one record starts at byte offset 0).
    """
    logdir.mkdir(parents=True, exist_ok=True)
    fs = files.FileSet(files.file_set_prefix(logdir, 1_700_000_000, "crafted"))

    def write(suffix: str, *events: pb.DebugEvent) -> None:
        fs.path(suffix).write_bytes(b"".join(frame(e.SerializeToString()) for e in events))

    meta = pb.DebugEvent(wall_time=1.0)
    m = meta.debug_metadata
    m.file_version = "debug.Event:1"
    m.framework = "crafted"
    m.nanscope_version = "0"
    m.process_rank = -1
    m.tensor_debug_mode = int(mode)  # type: ignore[assignment]
    write(files.METADATA, meta)
    write(files.SOURCE_FILES)
    write(files.STACK_FRAMES)
    graph = pb.DebugEvent(wall_time=1.0)
    graph.debugged_graph.graph_id = "g"
    op = pb.DebugEvent(wall_time=1.0)
    c = op.graph_op_creation
    c.graph_id, c.op_type, c.op_name, c.num_outputs = "g", "Log", "Log", 1
    c.input_names.extend(input_names)
    write(files.GRAPHS, graph, op)
    ex = pb.DebugEvent(wall_time=2.0, step=1)
    e = ex.execution
    e.op_type = "Log"
    e.num_outputs = len(outputs) if num_outputs is None else num_outputs
    e.tensor_debug_mode = int(mode)  # type: ignore[assignment]
    e.tensor_protos.extend(outputs)
    e.input_tensor_protos.extend(inputs)
    e.sequence = 1
    write(files.EXECUTION, ex)
    tr = pb.DebugEvent(wall_time=3.0, step=1)
    t = tr.graph_execution_trace
    t.tfdbg_context_id, t.op_name, t.sequence = "g", "Log", 1
    t.tensor_debug_mode = int(mode)  # type: ignore[assignment]
    if trace is not None:
        t.tensor_proto.CopyFrom(trace)
    write(files.GRAPH_EXECUTION_TRACES, tr)
    return fs.path(files.EXECUTION)


def big_summary_dump(logdir: Path) -> Path:
    """The issue's dump: a FULL_HEALTH summary whose one value claims a 12000x12000 shape."""
    claim = proto(DataType.DT_DOUBLE, BIG, double_val=[1.0])
    return write_dump(logdir, TensorDebugMode.FULL_HEALTH, [claim], trace=claim)


def big_full_tensor_dump(logdir: Path) -> Path:
    """FULL_TENSOR values claiming 12000x12000 with one float (or no bytes at all)."""
    one = proto(DataType.DT_FLOAT, BIG, float_val=[1.0])
    empty = proto(DataType.DT_FLOAT, BIG)
    return write_dump(logdir, TensorDebugMode.FULL_TENSOR, [one, empty], trace=one)
