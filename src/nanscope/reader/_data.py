"""What the reader hands out: plain, immutable records decoded from a dump."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope._paths import is_user_file
from nanscope.format.health import Health
from nanscope.format.modes import TensorDebugMode, shape_from_summary
from nanscope.format.statistics import Statistics
from nanscope.vocabulary import Phase

# Outputs listed for an execution that records no tensor ids: ``num_outputs`` says how many
# there are, and a record may say 2**31 (docs/FORMAT.md, "Limits").
MAX_LISTED_OUTPUTS = 4096

# nanscope's ``Execution.phase`` numbers, as reports name them.
PHASES = {p.value: p.label for p in Phase}


def _numbers(vector: np.ndarray) -> list[float | str]:
    """A summary vector as JSON numbers; NaN and the infinities as strings, as in tensor values."""
    out: list[float | str] = []
    for x in vector.ravel().tolist():
        out.append(
            x if math.isfinite(x) else "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"
        )
    return out


def _shape(
    mode: TensorDebugMode, summary: np.ndarray | None, value: np.ndarray | None
) -> list[int | None] | None:
    """A tensor's shape where the record tells it: its full value, or a SHAPE summary."""
    if value is not None:
        return list(value.shape)
    if mode == TensorDebugMode.SHAPE and summary is not None:
        try:
            return list(shape_from_summary(summary))
        except ValueError:  # malformed: the reader reported it when it decoded the record
            return None
    return None


@dataclass(frozen=True)
class Collective:
    """The ``torch.distributed`` operation an execution was (nanscope's ``collective`` field).

    Equal ``(group, kind, sequence)`` on two ranks (and, for send and receive,
    peers that name each other) are one operation: every member of a group
    issues the group's collectives in the same order.
    """

    group: str
    kind: str  # "collective", "send" or "recv"
    sequence: int
    group_desc: str = ""
    group_size: int = 0
    peer: int | None = None  # send/recv: the peer's global rank

    @property
    def label(self) -> str:
        """``collective #12 of group 0 (default_pg)``, ``send #3 to rank 1 in group 0``."""
        group = f"group {self.group}" + (f" ({self.group_desc})" if self.group_desc else "")
        if self.kind == "send":
            return f"send #{self.sequence} to rank {self.peer} in {group}"
        if self.kind == "recv":
            return f"receive #{self.sequence} from rank {self.peer} in {group}"
        return f"collective #{self.sequence} of {group}"

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "group_desc": self.group_desc,
            "group_size": self.group_size,
            "kind": self.kind,
            "sequence": self.sequence,
            "peer": self.peer,
            "label": self.label,
        }


@dataclass(frozen=True)
class ProcessInfo:
    """One file set: a TensorFlow host, or one nanscope process (a rank)."""

    index: int
    name: str  # "<seconds>.<host>" part of the file names
    host: str
    run_id: str
    file_version: str
    tensorflow_version: str
    framework: str  # "tensorflow 2.21.0", "torch 2.13.0", ...
    nanscope_version: str
    rank: int | None
    world_size: int
    pid: int | None
    tensor_debug_mode: TensorDebugMode | None
    circular_buffer_size: int | None
    start_time: float
    # Clock anchors taken together at start (None: not recorded, as in TensorFlow's dumps).
    clock_wall: float | None = None
    clock_monotonic: float | None = None

    @property
    def label(self) -> str:
        """How to name this process to a person: ``rank 1``, ``pid 4242`` or the host."""
        if self.rank is not None:
            return f"rank {self.rank}"
        if self.pid is not None:
            return f"pid {self.pid}"
        return self.host

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "host": self.host,
            "rank": self.rank,
            "pid": self.pid,
            "framework": self.framework,
            "label": self.label,
        }


@dataclass(frozen=True)
class StackFrame:
    host_name: str
    file_path: str
    lineno: int
    function: str
    file_index: int = -1

    def to_json(self, recorded: bool = True) -> dict[str, Any]:
        """``recorded``: whether the dump holds this file's text (else ``file_index`` is -1)."""
        return {
            "file": self.file_path,
            "line": self.lineno,
            "function": self.function,
            "file_index": self.file_index if recorded else -1,
            "user": is_user_file(self.file_path)
            and not self.file_path.rpartition("/")[2].startswith("<"),
        }


def _row_json(
    event: Execution | GraphExecutionTrace, health: Health, recorded: bool
) -> dict[str, Any]:
    """What every event's list row says: where it is, when it ran, and its health."""
    return {
        "index": event.index,
        "process": event.process,
        "step": event.step,
        "wall_time": event.wall_time,
        "graph_id": event.graph_id,
        "nonfinite": health.any_nonfinite,
        "counts": health.to_json() if recorded else None,
    }


@dataclass(frozen=True)
class Execution:
    """One eager op or graph call (a ``.execution`` record), decoded."""

    index: int
    process: int
    wall_time: float
    step: int
    sequence: int
    op_type: str
    num_outputs: int
    graph_id: str
    input_tensor_ids: tuple[int, ...]
    output_tensor_ids: tuple[int, ...]
    output_tensor_device_ids: tuple[int, ...]
    tensor_debug_mode: TensorDebugMode
    # One summary vector (or None) per recorded output; None as a whole in
    # NO_TENSOR and FULL_TENSOR modes, as in TensorFlow's reader.
    debug_tensor_values: tuple[np.ndarray | None, ...] | None
    host_name: str
    stack_frame_ids: tuple[str, ...]
    # The outputs' health together, and each recorded output's (None: not recorded).
    health: Health
    output_health: tuple[Health | None, ...] = ()
    # nanscope extensions (empty for TensorFlow dumps).
    module_path: str = ""
    phase: int = 0
    forward_sequence: int = 0
    forward_stack_frame_ids: tuple[str, ...] = ()
    input_debug_tensor_values: tuple[np.ndarray | None, ...] = ()
    # Each input's health where the record holds its summary (None: not recorded).
    input_health: tuple[Health | None, ...] = ()
    collective: Collective | None = None  # a torch.distributed operation
    tensor_values: tuple[np.ndarray | None, ...] | None = field(default=None, repr=False)
    # Each output's (largest finite |x|, smallest non-zero finite |x|) where recorded
    # (FULL_HEALTH's output_ranges, or FULL_TENSOR's values); see nanscope.format.headroom.
    output_ranges: tuple[tuple[float, float] | None, ...] = ()
    # Each output's statistics where recorded (FULL_HEALTH with statistics asked for:
    # ``output_statistics``, field 1010); empty when the record holds none. What
    # ``nanscope diff`` compares; see nanscope.format.statistics.
    output_statistics: tuple[Statistics | None, ...] = ()
    # What is wrong with this record's tensors ("<file>: record at byte offset N: output 0:
    # ..."), also in the reader's problems: an output refused here reads as not recorded.
    problems: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def recorded(self) -> bool:
        """Whether any output's summary or value was recorded."""
        return any(h is not None for h in self.output_health)

    def _output(self, slot: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Output ``slot``'s summary vector and full value (either may be None)."""
        summaries, values = self.debug_tensor_values, self.tensor_values
        summary = summaries[slot] if summaries is not None and slot < len(summaries) else None
        value = values[slot] if values is not None and slot < len(values) else None
        return summary, value

    @property
    def shape(self) -> list[int | None] | None:
        """The first output's shape where the mode records it (SHAPE, FULL_TENSOR)."""
        if self.tensor_debug_mode == TensorDebugMode.FULL_TENSOR:
            return None  # as the index rows have always said: shapes come from SHAPE summaries
        return _shape(self.tensor_debug_mode, *self._output(0))

    def outputs_json(self) -> list[dict[str, Any]]:
        """One entry per output: tensor id, health, shape and the raw summary."""
        out = []
        # num_outputs is a number from the record, not a list it holds: bounded.
        recorded = max(len(self.debug_tensor_values or ()), len(self.tensor_values or ()))
        listed = self.output_tensor_ids or range(
            min(self.num_outputs, max(MAX_LISTED_OUTPUTS, recorded))
        )
        for slot, tid in enumerate(listed):
            summary, value = self._output(slot)
            h = self.output_health[slot] if slot < len(self.output_health) else None
            r = self.output_ranges[slot] if slot < len(self.output_ranges) else None
            entry: dict[str, Any] = {
                "slot": slot,
                "tensor_id": tid if self.output_tensor_ids else None,
                "counts": h.to_json() if h is not None else None,
                "shape": _shape(self.tensor_debug_mode, summary, value),
                "summary": None if summary is None else _numbers(summary),
                "range": None
                if r is None
                else dict(zip(("max_abs", "min_nonzero_abs"), _numbers(np.array(r)), strict=True)),
            }
            if self.output_statistics:  # only where recorded: other dumps' JSON is unchanged
                st = self.output_statistics[slot] if slot < len(self.output_statistics) else None
                entry["statistics"] = None if st is None else st.to_json()
            out.append(entry)
        return out

    def to_json(self) -> dict[str, Any]:
        """The execution as a list row: what ran, where, and its outputs' health."""
        return {
            **_row_json(self, self.health, self.recorded),
            "op_type": self.op_type,
            "phase": PHASES.get(self.phase, ""),
            "num_outputs": self.num_outputs,
            "shape": self.shape,
            "collective": self.collective.to_json() if self.collective else None,
        }


@dataclass(frozen=True)
class GraphExecutionTrace:
    """One instrumented tensor computed inside a graph, decoded."""

    index: int
    process: int
    wall_time: float
    step: int
    sequence: int
    op_name: str
    op_type: str
    output_slot: int
    graph_id: str
    graph_ids: tuple[str, ...]  # outermost first, this trace's graph last
    tensor_debug_mode: TensorDebugMode
    debug_tensor_value: np.ndarray | None  # None in NO_TENSOR and FULL_TENSOR modes
    device_name: str
    health: Health
    tensor_value: np.ndarray | None = field(default=None, repr=False)  # FULL_TENSOR
    graph_name: str = ""
    problems: tuple[str, ...] = field(default=(), repr=False, compare=False)  # as Execution's
    iteration: int = -1  # inside a loop: the iteration the value is from (-1: not in a loop)
    # The value's statistics where recorded (one entry; empty when none): as Execution's.
    output_statistics: tuple[Statistics | None, ...] = ()

    @property
    def recorded(self) -> bool:
        """Whether the tensor's summary or value was recorded."""
        return self.debug_tensor_value is not None or self.tensor_value is not None

    @property
    def shape(self) -> list[int | None] | None:
        return _shape(self.tensor_debug_mode, self.debug_tensor_value, self.tensor_value)

    def outputs_json(self) -> list[dict[str, Any]]:
        """The one traced output, as :meth:`Execution.outputs_json` gives each."""
        summary = self.debug_tensor_value
        entry: dict[str, Any] = {
            "slot": self.output_slot,
            "tensor_id": None,
            "counts": self.health.to_json() if self.recorded else None,
            "shape": self.shape,
            "summary": None if summary is None else _numbers(summary),
        }
        if self.output_statistics:  # only where recorded: other dumps' JSON is unchanged
            st = self.output_statistics[0]
            entry["statistics"] = None if st is None else st.to_json()
        return [entry]

    def to_json(self) -> dict[str, Any]:
        """The trace as a list row: which graph op, where, and its health."""
        return {
            **_row_json(self, self.health, self.recorded),
            "op_name": self.op_name,
            "op_type": self.op_type,
            "output_slot": self.output_slot,
            "graph_name": self.graph_name,
            "device": self.device_name,
            "shape": self.shape if self.debug_tensor_value is not None else None,
        }


@dataclass(frozen=True)
class GraphOpInfo:
    """The creation of one graph op."""

    graph_id: str
    op_type: str
    op_name: str
    graph_name: str
    input_names: tuple[str, ...]
    num_outputs: int
    output_tensor_ids: tuple[int, ...]
    device_name: str
    host_name: str
    stack_frame_ids: tuple[str, ...]
    module_path: str = ""
    forward_stack_frame_ids: tuple[str, ...] = ()

    @property
    def inputs(self) -> list[tuple[str, int]]:
        """``(producer op name, output slot)`` of each data input (control inputs left out)."""
        out = []
        for name in self.input_names:
            if name.startswith("^"):
                continue
            op, _, slot = name.rpartition(":")
            # isascii: int() refuses other digits ("²"); len: and numbers of 4,300+ digits.
            if op and slot.isascii() and slot.isdigit() and len(slot) <= 9:
                out.append((op, int(slot)))
            else:
                out.append((name, 0))
        return out


@dataclass
class GraphInfo:
    """A graph and its ops, in creation order."""

    graph_id: str
    name: str
    outer_graph_id: str
    process: int
    inner_graph_ids: list[str] = field(default_factory=list)
    ops: dict[str, GraphOpInfo] = field(default_factory=dict)
    _consumers: dict[str, list[tuple[int, str, int]]] | None = field(default=None, repr=False)

    def consumers(self, op_name: str) -> list[tuple[int, str, int]]:
        """``(output slot, consumer op, consumer input slot)`` for every data edge leaving ``op_name``."""
        if self._consumers is None:
            table: dict[str, list[tuple[int, str, int]]] = {}
            for op in self.ops.values():
                for in_slot, (src, src_slot) in enumerate(op.inputs):
                    table.setdefault(src, []).append((src_slot, op.op_name, in_slot))
            self._consumers = table
        return self._consumers.get(op_name, [])


@dataclass(frozen=True)
class SourceFileInfo:
    index: int
    process: int
    host_name: str
    file_path: str
    num_lines: int

    def to_json(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "file_index": self.index,
            "path": self.file_path,
            "host": self.host_name,
            "num_lines": self.num_lines,
            "user": is_user_file(self.file_path),
        }


@dataclass(frozen=True)
class Problem:
    """Something wrong with the dump that the reader worked around.

    ``incomplete`` is True when, because of it, events of an event file (``.execution``
    or ``.graph_execution_traces``) may be missing from the index or unreadable: the
    file is missing or cannot be read, a record was skipped (damaged, undecodable), the
    file ends in a torn record, a resync skipped bytes. Problems that lose no event (a
    sidecar index that was ignored, a newer format version, damaged stack frames or
    source files) leave it False. ``file`` is the file concerned (for a file set that
    lacks both event files, the set's prefix, which both names start with) and
    ``offset`` the byte offset in it, where known.
    """

    severity: str  # "warning" or "error"
    message: str
    incomplete: bool = False
    file: str | None = None
    offset: int | None = None

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "message": self.message,
            "incomplete": self.incomplete,
            "file": self.file,
            "offset": self.offset,
        }
