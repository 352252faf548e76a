"""What the reader hands out: plain, immutable records decoded from a dump."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nanscope.format.modes import Health, TensorDebugMode


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

    @property
    def label(self) -> str:
        """How to name this process to a person: ``rank 1``, ``pid 4242`` or the host."""
        if self.rank is not None:
            return f"rank {self.rank}"
        if self.pid is not None:
            return f"pid {self.pid}"
        return self.host


@dataclass(frozen=True)
class StackFrame:
    host_name: str
    file_path: str
    lineno: int
    function: str
    file_index: int = -1


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
    health: Health
    # nanscope extensions (empty for TensorFlow dumps).
    module_path: str = ""
    phase: int = 0
    forward_sequence: int = 0
    forward_stack_frame_ids: tuple[str, ...] = ()
    input_debug_tensor_values: tuple[np.ndarray | None, ...] = ()
    tensor_values: tuple[np.ndarray | None, ...] | None = field(default=None, repr=False)


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
            if op and slot.isdigit():
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


@dataclass(frozen=True)
class Problem:
    """Something wrong with the dump that the reader worked around."""

    severity: str  # "warning" or "error"
    message: str

    def __str__(self) -> str:
        return self.message
