"""One event in detail: its view (inputs, producers, consumers), stack, graph op and values."""

from __future__ import annotations

from typing import Any

from nanscope.analysis import EventView, ViewBuilder, consumers, graph_op_edges, values_json
from nanscope.format.modes import TensorDebugMode
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
from nanscope.server.runs import Run

# Producers of an event's inputs are looked for this many events back.
LOOKBACK = 2000


class NotFound(LookupError):
    """What was asked for is not in the run (an event, graph, op, file or value); the
    message says which, and the API answers it with 404."""


def check_index(reader: DumpReader, kind: str, index: int) -> int:
    """``index``, when the run has such an event of ``kind``."""
    n = reader.num(kind)
    if not 0 <= index < n:
        raise NotFound(f"no {kind.replace('_', ' ')} #{index} (the run has {n})")
    return index


def _view(reader: DumpReader, kind: str, index: int) -> tuple[ViewBuilder, EventView]:
    """One event's view (NotFound when it is absent or cannot be decoded)."""
    check_index(reader, kind, index)
    views = ViewBuilder(reader, LOOKBACK)
    try:
        return views, views.view(kind, index)
    except UNREADABLE as exc:
        name = kind.replace("_", " ")
        raise NotFound(f"{name} #{index} cannot be decoded: {exc}") from None


def _stack_json(
    run: Run, reader: DumpReader, frame_ids: tuple[str, ...], process: int
) -> list[Any]:
    # Which files' text the dump holds: asked by every event detail, so computed once.
    recorded = run.cached(
        ("recorded", process),
        lambda: frozenset(f.index for f in reader.source_files(process) if f.num_lines),
    )
    return [f.to_json(f.file_index in recorded) for f in reader.stack_frames(frame_ids, process)]


def execution(run: Run, reader: DumpReader, index: int) -> dict[str, Any]:
    """``/api/executions/<index>``: the execution's view, stack, outputs, tensor ids, forward
    op, consumers, graph and collective."""
    views, view = _view(reader, EXECUTIONS, index)
    ex = reader.execution(view.index)
    out = view.to_json()
    out["stack"] = _stack_json(run, reader, ex.stack_frame_ids, ex.process)
    out["outputs"] = ex.outputs_json()
    out["input_tensor_ids"] = list(ex.input_tensor_ids)
    out["output_tensor_ids"] = list(ex.output_tensor_ids)
    fwd = views.by_sequence(ex.forward_sequence, ex.process) if ex.forward_sequence else None
    out["forward_index"] = fwd.index if fwd is not None else None
    out["consumers"] = consumers(reader, ex.index, ex.output_tensor_ids, ex.process)
    out["has_values"] = bool(ex.tensor_values and any(v is not None for v in ex.tensor_values))
    out["graph"] = {"graph_id": ex.graph_id, "graph_name": view.graph_name} if ex.graph_id else None
    out["collective"] = ex.collective.to_json() if ex.collective is not None else None
    return out


def trace(run: Run, reader: DumpReader, index: int) -> dict[str, Any]:
    """``/api/traces/<index>``: the graph execution trace's view, its op's stack, outputs and
    enclosing graphs."""
    _, view = _view(reader, TRACES, index)
    tr = reader.trace(view.index)
    out = view.to_json()
    op = reader.graph_op(tr.graph_id, tr.op_name, tr.process)
    out["stack"] = _stack_json(run, reader, op.stack_frame_ids, tr.process) if op else []
    out["outputs"] = tr.outputs_json()
    out["graph_ids"] = list(tr.graph_ids)
    out["has_values"] = tr.tensor_value is not None
    return out


def graph_op(
    run: Run, reader: DumpReader, process: int, graph_id: str, op_name: str, near: int | None
) -> dict[str, Any]:
    """``/api/graph_op``: an op of a graph, with its stack, inputs and consumers (their
    traces nearest event ``near``)."""
    graph = reader.graph(graph_id, process)
    if graph is None:
        raise NotFound(f"no graph {graph_id!r} in process {process}")
    op = graph.ops.get(op_name)
    if op is None:
        raise NotFound(f"no op {op_name!r} in graph {graph.name or graph_id}")
    inputs, users = graph_op_edges(reader, graph, op_name, near)
    return {
        "graph_id": graph_id,
        "graph_name": graph.name,
        "graph_ids": reader.graph_chain(graph_id, process),
        "op": {
            "op_name": op.op_name,
            "op_type": op.op_type,
            "num_outputs": op.num_outputs,
            "device": op.device_name,
            "module_path": op.module_path,
            "stack": _stack_json(run, reader, op.stack_frame_ids, process),
        },
        "inputs": inputs,
        "consumers": users,
    }


def tensor(reader: DumpReader, kind: str, index: int, slot: int, limit: int) -> dict[str, Any]:
    """``/api/tensor``: the first ``limit`` recorded values of output ``slot`` of an event
    (checked by :func:`check_index`), with their statistics."""
    try:
        if kind == EXECUTIONS:
            ex = reader.execution(index)
            vals, problems, mode = ex.tensor_values or (), ex.problems, ex.tensor_debug_mode
            value = vals[slot] if slot < len(vals) else None
        else:
            tr = reader.trace(index)
            value, problems, mode = tr.tensor_value, tr.problems, tr.tensor_debug_mode
    except UNREADABLE as exc:
        raise NotFound(f"{kind} #{index} cannot be decoded: {exc}") from None
    if value is None:
        # A value the reader refused (a shape claiming more than the record holds): say why.
        refused = [
            m for m in problems if f": output {slot}: " in m and mode == TensorDebugMode.FULL_TENSOR
        ]
        if refused:
            raise NotFound(f"the values of this tensor cannot be read: {refused[0]}")
        raise NotFound("no values recorded for this tensor (record in FULL_TENSOR mode)")
    return {"kind": kind, "index": index, "slot": slot, **values_json(value, limit)}
