"""Data edges between recorded events: who produced an input, who consumed an output.

Eager executions are linked by tensor ids (an id written again by a later op
is a new tensor); graph traces by their graph's ``producer:slot`` inputs.
Searches are bounded (``lookback``/``lookahead``) so that one question never
decodes a whole dump.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader, Execution, GraphInfo

CONSUMER_LOOKAHEAD = 2000
CONSUMER_LIMIT = 20


def producers(
    reader: DumpReader, ex: Execution, lookback: int
) -> tuple[dict[int, tuple[Execution, int]], bool]:
    """``{input tensor id: (producing execution, output slot)}`` for ``ex``'s inputs found
    within ``lookback`` events back in its process, and whether the search reached the
    first event (so an input not found came from outside the recorded ops)."""
    wanted = {tid for tid in ex.input_tensor_ids if tid != 0}
    found: dict[int, tuple[Execution, int]] = {}
    procs = reader.processes_of(EXECUTIONS)
    lo = max(0, ex.index - lookback)
    i = ex.index - 1
    while wanted and i >= lo:
        if procs[i] == ex.process:
            try:
                cand = reader.execution(i)
            except UNREADABLE:
                i -= 1
                continue
            for slot, tid in enumerate(cand.output_tensor_ids):
                if tid in wanted:
                    found[tid] = (cand, slot)
                    wanted.discard(tid)
        i -= 1
    return found, lo == 0


def consumers(
    reader: DumpReader,
    index: int,
    outputs: Sequence[int],
    process: int,
    lookahead: int = CONSUMER_LOOKAHEAD,
    limit: int = CONSUMER_LIMIT,
) -> list[dict[str, Any]]:
    """The executions after ``index`` that read its ``outputs`` (tensor ids), as JSON rows."""
    wanted = {tid: slot for slot, tid in enumerate(outputs) if tid}
    found: list[dict[str, Any]] = []
    procs = reader.processes_of(EXECUTIONS)
    end = min(reader.num_executions(), index + 1 + lookahead)
    for j in range(index + 1, end):
        if not wanted or len(found) >= limit:
            break
        if procs[j] != process:
            continue
        try:
            ex = reader.execution(j)
        except UNREADABLE:
            continue
        for in_slot, tid in enumerate(ex.input_tensor_ids):
            if tid in wanted:
                found.append({"kind": EXECUTIONS, "index": j, "op_type": ex.op_type,
                              "input_slot": in_slot, "output_slot": wanted[tid]})  # fmt: skip
                break
        # A tensor id written again by a later op is a new tensor: stop following the old one.
        for tid in ex.output_tensor_ids:
            wanted.pop(tid, None)
    return found


def nearest_trace(
    reader: DumpReader,
    process: int,
    graph_id: str,
    op_name: str,
    slot: int | None,
    near: int,
    later: bool,
) -> int | None:
    """The trace of ``op_name`` (output ``slot``, or any) nearest ``near``: the last at or
    before it, or with ``later`` the first after it."""
    gid, nid = reader.string_id(graph_id), reader.string_id(op_name)
    if gid is None or nid is None:
        return None
    rows = reader.index(TRACES)
    procs = reader.processes_of(TRACES)
    lo, hi = (near + 1, len(rows)) if later else (0, near + 1)
    part = rows[lo:hi]
    mask = (part["graph"] == gid) & (part["name"] == nid) & (procs[lo:hi] == process)
    if slot is not None:
        mask &= part["slot"] == slot
    hits = np.flatnonzero(mask)
    if not hits.size:
        return None
    return lo + int(hits[0] if later else hits[-1])


def graph_op_edges(
    reader: DumpReader, graph: GraphInfo, op_name: str, near: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A graph op's inputs and consumers as JSON rows; with ``near`` (a trace index), each
    names the trace of that op nearest it (inputs before, consumers after)."""
    op = graph.ops[op_name]

    def trace_of(name: str, slot: int | None, later: bool) -> int | None:
        if near is None:
            return None
        return nearest_trace(reader, graph.process, graph.graph_id, name, slot, near, later)

    inputs = []
    for in_slot, (src, src_slot) in enumerate(op.inputs):
        src_op = graph.ops.get(src)
        inputs.append({"op_name": src, "op_type": src_op.op_type if src_op else "",
                       "output_slot": src_slot, "input_slot": in_slot,
                       "trace_index": trace_of(src, src_slot, False)})  # fmt: skip
    outputs = []
    for out_slot, dst, in_slot in graph.consumers(op_name)[:200]:
        dst_op = graph.ops.get(dst)
        outputs.append({"op_name": dst, "op_type": dst_op.op_type if dst_op else "",
                        "output_slot": out_slot, "input_slot": in_slot,
                        "trace_index": trace_of(dst, None, True)})  # fmt: skip
    return inputs, outputs
