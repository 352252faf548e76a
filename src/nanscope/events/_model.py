"""The framework-neutral event model that every backend reports into.

Backends (PyTorch, JAX, TensorFlow glue) describe what ran with these plain
objects and hand them to :class:`nanscope.events._writer.DumpWriter`. They
carry no framework types: summaries are numpy vectors (or a deferred
:class:`Pending` whose values are fetched later, e.g. from a GPU buffer,
on the writer's thread).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np


class Phase(enum.IntEnum):
    """Which part of a training step ran an op (nanscope's ``Execution.phase``)."""

    UNKNOWN = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3


class Pending(Protocol):
    """Summaries that are not on the host yet; ``resolve`` fetches them (may block)."""

    def resolve(self) -> Sequence[np.ndarray | None]: ...


Summaries = Sequence["np.ndarray | None"]


class CollectiveTag(NamedTuple):
    """Which ``torch.distributed`` operation an execution was (the ``collective`` field).

    Every member of a group issues the group's collectives in the same order:
    ``sequence`` numbers them per group (send and receive: per group, peer and
    direction), so equal tags on two ranks are one operation (docs/FORMAT.md).
    """

    group: str
    kind: str  # "collective", "send" or "recv"
    sequence: int
    group_desc: str = ""
    group_size: int = 0
    peer: int = -1  # send/recv: the peer's global rank
    framework_sequence: int = 0


@dataclass(slots=True)
class ExecutionEvent:
    """One eagerly executed op or one call of a graph (a ``.execution`` record).

    ``summaries`` has one entry per output, in the writer's tensor debug mode
    (``None`` for an output that the mode or the filters skip; a full array in
    FULL_TENSOR mode, or a :class:`nanscope.format.tensors.ValueView` for a view
    of values recorded before). ``stack`` and ``forward_stack`` are stack ids from
    :meth:`nanscope.events._stacks.StackInterner.intern`.
    """

    op_type: str
    output_tensor_ids: Sequence[int] = ()
    input_tensor_ids: Sequence[int] = ()
    output_device_ids: Sequence[int] = ()
    summaries: Summaries | Pending = ()
    input_summaries: Summaries | Pending = ()
    num_outputs: int = -1  # -1: len(output_tensor_ids)
    graph_id: str = ""
    stack: int = -1
    module_path: str = ""
    phase: Phase = Phase.UNKNOWN
    step: int = 0
    forward_sequence: int = 0
    forward_stack: int = -1
    wall_time: float = 0.0
    collective: CollectiveTag | None = None


@dataclass(slots=True)
class TraceEvent:
    """One instrumented tensor computed inside a graph (a ``.graph_execution_traces`` record)."""

    graph_id: str
    op_name: str
    output_slot: int = 0
    summary: np.ndarray | None = None
    device_name: str = ""
    step: int = 0
    wall_time: float = 0.0


@dataclass(slots=True)
class GraphOp:
    """The creation of one op in a graph (a ``GraphOpCreation`` record)."""

    graph_id: str
    op_type: str
    op_name: str
    graph_name: str = ""
    input_names: Sequence[str] = ()
    num_outputs: int = 1
    output_tensor_ids: Sequence[int] = ()
    device_name: str = ""
    stack: int = -1
    module_path: str = ""
    forward_stack: int = -1


@dataclass(slots=True)
class Graph:
    """A graph (a ``DebuggedGraph`` record); ``outer_graph_id`` is empty for an outermost graph."""

    graph_id: str
    graph_name: str = ""
    outer_graph_id: str = ""
    instrumented_ops: Sequence[str] = field(default_factory=tuple)
