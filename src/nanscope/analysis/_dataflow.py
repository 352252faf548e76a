"""Data edges between recorded events: who produced an input, who consumed an output.

Eager executions are linked by tensor ids (an id written again by a later op
is a new tensor); graph traces by their graph's ``producer:slot`` inputs.
Searches are bounded (``lookback``/``lookahead``) so that one question never
decodes a whole dump.
"""

from __future__ import annotations

import threading
import weakref
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
                found.append(
                    {
                        "kind": EXECUTIONS,
                        "index": j,
                        "op_type": ex.op_type,
                        "input_slot": in_slot,
                        "output_slot": wanted[tid],
                    }
                )
                break
        # A tensor id written again by a later op is a new tensor: stop following the old one.
        for tid in ex.output_tensor_ids:
            wanted.pop(tid, None)
    return found


class _TraceGroups:
    """Each (process, graph, op name)'s traces, in order: a sorted index built in one
    vectorised pass, so that finding the trace nearest an event is a binary search
    instead of a scan of every trace before it (the GUI asks for each input and
    consumer of every graph op it shows)."""

    def __init__(self, rows: np.ndarray, procs: np.ndarray) -> None:
        self.rows, self.procs = rows, procs
        order = np.lexsort((rows["name"], rows["graph"], procs))  # stable: by position within
        self.order = order
        self.groups: dict[tuple[int, int, int], tuple[int, int]] = {}
        if not len(order):
            return
        p, g, n = procs[order], rows["graph"][order], rows["name"][order]
        starts = np.flatnonzero(
            np.r_[True, (p[1:] != p[:-1]) | (g[1:] != g[:-1]) | (n[1:] != n[:-1])]
        )
        ends = np.r_[starts[1:], len(order)]
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            self.groups[(int(p[start]), int(g[start]), int(n[start]))] = (start, end)

    def nearest(
        self, key: tuple[int, int, int], slot: int | None, near: int, later: bool
    ) -> int | None:
        span = self.groups.get(key)
        if span is None:
            return None
        positions = self.order[span[0] : span[1]]
        cut = int(np.searchsorted(positions, near, side="right"))
        candidates = positions[cut:] if later else positions[:cut][::-1]
        if slot is not None:
            candidates = candidates[self.rows["slot"][candidates] == slot]
        return int(candidates[0]) if len(candidates) else None


_groups_lock = threading.Lock()
_groups: weakref.WeakKeyDictionary[DumpReader, _TraceGroups] = weakref.WeakKeyDictionary()


def _trace_groups(reader: DumpReader) -> _TraceGroups:
    rows, procs = reader.index(TRACES), reader.processes_of(TRACES)
    with _groups_lock:
        groups = _groups.get(reader)
    # The index is a new array whenever the dump grew or was re-read.
    if groups is None or groups.rows is not rows or groups.procs is not procs:
        groups = _TraceGroups(rows, procs)
        with _groups_lock:
            _groups[reader] = groups
    return groups


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
    return _trace_groups(reader).nearest((process, gid, nid), slot, near, later)


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
        inputs.append(
            {
                "op_name": src,
                "op_type": src_op.op_type if src_op else "",
                "output_slot": src_slot,
                "input_slot": in_slot,
                "trace_index": trace_of(src, src_slot, False),
            }
        )
    outputs = []
    for out_slot, dst, in_slot in graph.consumers(op_name)[:200]:
        dst_op = graph.ops.get(dst)
        outputs.append(
            {
                "op_name": dst,
                "op_type": dst_op.op_type if dst_op else "",
                "output_slot": out_slot,
                "input_slot": in_slot,
                "trace_index": trace_of(dst, None, True),
            }
        )
    return inputs, outputs
