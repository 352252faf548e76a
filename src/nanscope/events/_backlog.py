"""What each queued item counts for in the writer's backlog: its events, its bytes, and
which of its events hold Inf/NaN, as far as a producer can tell without waiting.

:class:`~nanscope.events._writer.DumpWriter` bounds its backlog by these counts, sheds by
them when it falls behind (events/_shed.py), and counts them as dropped when closing on a
failed disk. Each count is the same when an item is enqueued and when it is processed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nanscope.events._model import ExecutionEvent
from nanscope.events._queue import (
    EncodedExecutions,
    ExecutionBatch,
    GraphCallTraces,
    QueuedExecution,
    QueuedTrace,
    QueueItem,
)
from nanscope.format import sidecar
from nanscope.format.health import UNKNOWN_ROW, IndexRow, index_row
from nanscope.format.modes import TensorDebugMode
from nanscope.format.records import OVERHEAD

# An event's bytes in memory, beyond a FULL_TENSOR value's elements: its Python objects or
# its record's other fields (an estimate; what the byte bounds count).
EVENT_BYTES = 256


# The events each kind of queued item carries (what closing on a failed disk counts).
EVENTS_IN: dict[type, Callable[[Any], int]] = {
    QueuedExecution: lambda item: 1,
    EncodedExecutions: lambda item: len(item.records),
    ExecutionBatch: lambda item: item.events,
    QueuedTrace: lambda item: 1,
    GraphCallTraces: lambda item: len(item.op_names),
}


def item_bytes(item: Any, full_tensor: bool) -> int:
    """About the bytes a queued item holds, what ``max_queue_bytes`` bounds: its
    records' bytes, or its FULL_TENSOR values' and :data:`EVENT_BYTES` per event.
    The same number when the item is enqueued and when it is processed
    (``full_tensor``: the writer's mode is FULL_TENSOR)."""
    kind = type(item)
    if kind is ExecutionBatch:
        return len(item.data)
    if kind is QueuedExecution:
        if full_tensor:
            return EVENT_BYTES + values_bytes(item.event.summaries)
        return EVENT_BYTES
    if kind is EncodedExecutions:
        return sum([len(r[0]) for r in item.records]) + OVERHEAD * len(item.records)
    if kind is QueuedTrace:
        if full_tensor:
            return EVENT_BYTES + values_bytes((item.event.summary,))
        return EVENT_BYTES
    if kind is GraphCallTraces:
        values = item.summaries
        held = (
            values.nbytes
            if isinstance(values, np.ndarray)
            else (values_bytes(values) if full_tensor else 0)
        )
        return EVENT_BYTES * len(item.op_names) + held
    return 0


def values_bytes(values: Any) -> int:
    """The bytes of the arrays in a sequence of FULL_TENSOR values (0 for summaries not
    fetched yet, whose size is not known before)."""
    if not isinstance(values, (list, tuple)):
        return 0
    return sum([v.nbytes for v in values if isinstance(v, np.ndarray)])


def execution_health(event: ExecutionEvent, mode: TensorDebugMode) -> IndexRow | None:
    """A queued execution's health, as far as the producer can tell: ``None`` while
    its summaries are still on a device (fetching them here could wait for the very
    thread that asks: device_buffer.py submits a batch at the step's end)."""
    if mode == TensorDebugMode.NO_TENSOR:
        return UNKNOWN_ROW
    summaries = event.summaries
    if not isinstance(summaries, (list, tuple)):
        return None
    return index_row(mode, summaries)


def call_health(call: GraphCallTraces, mode: TensorDebugMode) -> tuple[np.ndarray, list[bool]]:
    """A graph call's non-finite rows (positions among its ops) and whether each holds
    NaN, from summaries on the host."""
    matrix = call.summaries
    chosen = getattr(matrix, "chosen", None)
    if (
        mode == TensorDebugMode.FULL_TENSOR
    ):  # a list of values, one per op (as the writer's _on_traces reads it)
        bad: list[int] = []
        nan: list[bool] = []
        for i in range(len(call.op_names)):
            value = None if matrix is None else matrix[i]
            if value is None:
                continue
            h = index_row(mode, (value,))
            if h.nonfinite == 1:
                bad.append(i)
                nan.append(h.nan > 0)
        return np.array(bad, dtype=np.int64), nan
    m = np.asarray(matrix, dtype=np.float64)
    if chosen is not None:
        m = m[chosen]
    nonfinite, has_nan = matrix_health(mode, m)
    hits = np.flatnonzero(nonfinite)
    positions = hits if chosen is None else np.asarray(chosen, dtype=np.int64)[hits]
    return positions, has_nan[hits].tolist()


def matrix_health(mode: TensorDebugMode, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a graph call's summary matrix: whether it holds Inf/NaN, and NaN (as
    :meth:`Encoder.trace_batch` counts them)."""
    n = m.shape[0] if m.ndim == 2 else 0
    width = m.shape[1] if m.ndim == 2 else 0
    none = np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        if mode == TensorDebugMode.FULL_HEALTH and width >= 11:
            return m[:, 5:8].sum(axis=1) > 0, m[:, 7] > 0
        if mode == TensorDebugMode.CONCISE_HEALTH and width >= 5:
            return m[:, 2:5].sum(axis=1) > 0, m[:, 4] > 0
        if mode == TensorDebugMode.CURT_HEALTH and width >= 2:
            return m[:, 1] != 0, none
    return none, none


def nonfinite_in(item: QueueItem, mode: TensorDebugMode) -> int:
    """How many of a queued item's events hold Inf/NaN (closing on a failed disk:
    what is counted as dropped without being written)."""
    if mode == TensorDebugMode.NO_TENSOR:
        return 0
    match item:
        case ExecutionBatch():
            rows = np.frombuffer(item.rows, dtype=sidecar.ROW_DTYPE)
            return int((rows["nonfinite"] == 1).sum())
        case EncodedExecutions():
            return sum(1 for r in item.records if r[11] == 1)
        case QueuedExecution():
            # Summaries still on a device: not known, so counted as possibly non-finite.
            h = execution_health(item.event, mode)
            return int(h is None or h.nonfinite == 1)
        case QueuedTrace():
            summary = item.event.summary
            return int(summary is not None and index_row(mode, (summary,)).nonfinite == 1)
        case GraphCallTraces():
            if item.summaries is None:
                return 0
            if hasattr(item.summaries, "resolve"):
                return len(item.op_names)
            return len(call_health(item, mode)[0])
    return 0


def subset_batch(batch: ExecutionBatch, keep: np.ndarray) -> ExecutionBatch:
    """The batch's executions that ``keep`` marks, as a batch of their own."""
    rows = np.frombuffer(batch.rows, dtype=sidecar.ROW_DTYPE)
    kept = rows[keep].copy()
    view = memoryview(batch.data)
    data = b"".join(
        view[o : o + n]
        for o, n in zip(kept["offset"].tolist(), kept["length"].tolist(), strict=True)
    )
    lengths = kept["length"].astype(np.int64)
    kept["offset"] = np.cumsum(lengths) - lengths
    # Shedding is an overload: the range history goes without this batch (as without
    # the events dropped).
    return ExecutionBatch(len(kept), data, kept.tobytes(), batch.names, ())
