"""What the writer's queue carries: one small typed record per kind of item.

Producers (any thread) append these to :class:`nanscope.events._writer.DumpWriter`'s
queue; its background thread takes them off in order and dispatches on their
type. They are ``NamedTuple`` classes: as cheap to build as the plain tuples
they replace, immutable, and with named fields.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from nanscope.events._model import ExecutionEvent, Graph, GraphOp, TraceEvent


class EncodedExecution(NamedTuple):
    """One execution that a backend turned into its record before handing it over.

    The health fields are those of :func:`nanscope.format.health.index_row`
    (``-1`` where unknown). The writer reads records by position, so plain
    tuples in this field order serve too. The native recorder hands over most
    of its events as :class:`ExecutionBatch` instead (no Python object per
    event); this is for events encoded in Python on a backend's thread.
    """

    payload: bytes  # the DebugEvent, not framed yet
    op_type: str
    graph_id: str
    num_outputs: int
    wall_time: float
    step: int
    sequence: int
    size: int
    neg_inf: int
    pos_inf: int
    nan: int
    nonfinite: int
    phase: int
    device: int  # the writer's id of the first output's device (0: none)
    # For the writer's range history (nanscope.format.headroom.RangeRow; NaN unknown).
    module_path: str
    amax: float
    amin: float
    range_dtype: int


class ExecutionBatch(NamedTuple):
    """Executions a backend encoded and framed itself, handed over as one batch.

    ``data`` holds the framed records back to back; ``rows`` is the bytes of
    their sidecar rows (:data:`nanscope.format.sidecar.ROW_DTYPE`), ``offset``
    and ``length`` within ``data``, whose ``name`` column numbers ``names``
    (op types) instead of the stream's string table and whose ``graph`` column
    is 0 (no graph id). ``ranges`` are the range history's updates, in order:
    ``(module path, phase, step, amax, amin, range dtype)``, the events of one
    module, phase and step already combined (as ``RangeHistory.add`` would).
    The native recorder builds these in C++: the writer then handles a batch
    in a few numpy operations, with no Python object per event.
    """

    events: int
    data: bytes
    rows: bytes
    names: Sequence[str]
    ranges: Sequence[tuple[str, int, int, float, float, int]]


class QueuedExecution(NamedTuple):
    """An execution event, encoded on the writer thread."""

    event: ExecutionEvent
    sequence: int
    wall_time: float


class EncodedExecutions(NamedTuple):
    """Executions already encoded by the producer (see :class:`EncodedExecution`)."""

    records: Sequence[EncodedExecution]


class QueuedTrace(NamedTuple):
    """One graph execution trace."""

    event: TraceEvent
    sequence: int
    wall_time: float


class GraphCallTraces(NamedTuple):
    """One graph call's traces: row ``i`` of ``summaries`` belongs to ``op_names[i]``."""

    graph_id: str
    op_names: Sequence[str]
    output_slots: Sequence[int]
    summaries: Any  # an array, an object with resolve(), a list of arrays or None
    device_name: str
    step: int
    first_sequence: int
    wall_time: float


class NewSourceFile(NamedTuple):
    """A file seen for the first time in a stack (``snapshot``: record its lines)."""

    file_index: int
    path: str
    snapshot: bool


class NewStackFrame(NamedTuple):
    """A ``(file, line, function)`` frame seen for the first time."""

    frame_id: str
    file_index: int
    line: int
    func: str


class QueuedGraph(NamedTuple):
    graph: Graph
    wall_time: float


class QueuedGraphOp(NamedTuple):
    op: GraphOp
    wall_time: float


class NewDevice(NamedTuple):
    name: str
    device_id: int


class FlushRequest(NamedTuple):
    """Write what came before to the files, then set ``done``."""

    done: threading.Event


class CloseRequest(NamedTuple):
    """Stop the writer thread (the files are closed after what came before)."""


QueueItem = (
    QueuedExecution
    | EncodedExecutions
    | ExecutionBatch
    | QueuedTrace
    | GraphCallTraces
    | NewSourceFile
    | NewStackFrame
    | QueuedGraph
    | QueuedGraphOp
    | NewDevice
    | FlushRequest
    | CloseRequest
)
