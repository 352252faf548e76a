"""What a report says about one event, gathered from the reader."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from nanscope._paths import is_user_file
from nanscope.analysis import _dataflow as dataflow
from nanscope.analysis._explain import explain
from nanscope.analysis._tf_graphs import input_trace
from nanscope.format.health import UNKNOWN, Health
from nanscope.reader import (
    EXECUTIONS,
    TRACES,
    UNREADABLE,
    DumpReader,
    Execution,
    StackFrame,
)
from nanscope.reader._data import PHASES


@dataclass
class Source:
    file: str
    line: int
    function: str
    code: str = ""  # the line itself, when the dump recorded the file
    # (line number, text) around the line, filled for the events a report shows.
    context: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Producer:
    kind: str
    index: int
    op_type: str
    op_name: str


@dataclass(frozen=True)
class InputView:
    name: str  # "input 0" (eager) or "Softmax:0" (graph)
    producer: Producer | None
    counts: Health | None


@dataclass
class EventView:
    """One event as a report shows it."""

    kind: str
    index: int
    process: int
    rank: int | None
    op_type: str
    op_name: str
    graph_id: str
    graph_name: str
    step: int
    wall_time: float
    phase: str
    module_path: str
    device: str
    counts: Health
    shape: list[int | None] | None
    inputs: list[InputView]
    source: Source | None
    stack: list[Source]
    forward_op: str = ""
    forward_source: Source | None = None
    external_input: bool = False
    explanation: str = ""
    # Inside a loop (a JAX scan or while_loop): the iteration the values are from.
    iteration: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d


class ViewBuilder:
    """Builds :class:`EventView` objects; looks ``lookback`` events back for producers."""

    def __init__(self, reader: DumpReader, lookback: int = 5000) -> None:
        self.reader = reader
        self.lookback = lookback
        self._sources: dict[tuple[int, int], list[str]] = {}

    # -- sources -----------------------------------------------------------------------------

    def _code(self, frame: StackFrame, process: int) -> str:
        key = (process, frame.file_index)
        lines = self._sources.get(key)
        if lines is None:
            try:
                lines = self.reader.source_lines(frame.file_index, process)
            except (IndexError, OSError, ValueError, *UNREADABLE):
                lines = []
            self._sources[key] = lines
        return lines[frame.lineno - 1].strip() if 0 < frame.lineno <= len(lines) else ""

    def add_context(self, view: EventView, lines: int = 3) -> None:
        """Fill the source context of ``view``'s user line and forward line."""
        for src in (view.source, view.forward_source):
            if src is None or src.context:
                continue
            for f in self.reader.source_files(view.process):
                if f.file_path != src.file:
                    continue
                key = (view.process, f.index)
                text = self._sources.get(key)
                if text is None:
                    try:
                        text = self.reader.source_lines(f.index, view.process)
                    except (IndexError, OSError, ValueError, *UNREADABLE):  # changed since indexed
                        text = []
                    self._sources[key] = text
                lo, hi = max(1, src.line - lines), min(len(text), src.line + lines)
                src.context = [(n, text[n - 1]) for n in range(lo, hi + 1)]
                break

    def _frames(self, frames: list[StackFrame], process: int) -> tuple[Source | None, list[Source]]:
        stack = [Source(f.file_path, f.lineno, f.function) for f in frames]
        user = [f for f in frames if is_user_file(f.file_path)]
        if not user:
            return None, stack
        f = user[-1]
        return Source(f.file_path, f.lineno, f.function, self._code(f, process)), stack

    # -- events ------------------------------------------------------------------------------

    def view(self, kind: str, index: int) -> EventView:
        return self.execution(index) if kind == EXECUTIONS else self.trace(index)

    def _flagged(self, kind: str, index: int) -> bool:
        """Whether the index says the event holds Inf/NaN (only those get an explanation)."""
        return bool(self.reader.index(kind)["nonfinite"][index] == 1)

    def _rank(self, process: int) -> int | None:
        procs = self.reader.processes
        return procs[process].rank if process < len(procs) else None

    def execution(self, index: int) -> EventView:
        r = self.reader
        ex = r.execution(index)
        source, stack = self._frames(r.stack(ex), ex.process)
        inputs, external = self._execution_inputs(ex)
        view = EventView(
            kind=EXECUTIONS,
            index=index,
            process=ex.process,
            rank=self._rank(ex.process),
            op_type=ex.op_type,
            op_name=ex.op_type,
            graph_id=ex.graph_id,
            graph_name=(g.name if (g := r.graph(ex.graph_id, ex.process)) else ""),
            step=ex.step,
            wall_time=ex.wall_time,
            phase=PHASES.get(ex.phase, ""),
            module_path=ex.module_path,
            device=r.devices(ex.process).get(ex.output_tensor_device_ids[0], "")
            if ex.output_tensor_device_ids
            else "",
            counts=ex.health if ex.recorded else UNKNOWN,
            shape=ex.shape,
            inputs=inputs,
            source=source,
            stack=stack,
            external_input=external,
        )
        if ex.forward_sequence:
            fwd = self.by_sequence(ex.forward_sequence, ex.process)
            if fwd is not None:
                view.forward_op = fwd.op_type
            fsource, _ = self._frames(
                r.stack_frames(ex.forward_stack_frame_ids, ex.process), ex.process
            )
            view.forward_source = fsource
        if self._flagged(EXECUTIONS, index):
            view.explanation = explain(
                ex.op_type, view.counts, [i.counts for i in inputs], external
            )
        return view

    def by_sequence(self, sequence: int, process: int) -> Execution | None:
        """The execution of ``process`` with this sequence number (a backward op's forward op)."""
        rows = self.reader.index(EXECUTIONS)
        procs = self.reader.processes_of(EXECUTIONS)
        hits = np.flatnonzero((rows["sequence"] == sequence) & (procs == process))
        if not hits.size:
            return None
        try:
            return self.reader.execution(int(hits[0]))
        except UNREADABLE:
            return None

    def _execution_inputs(self, ex: Execution) -> tuple[list[InputView], bool]:
        """Each input with its producer (looked up backwards) and its counts."""
        recorded = ex.input_health
        producers, searched_all = dataflow.producers(self.reader, ex, self.lookback)
        inputs = []
        external = False
        for k, tid in enumerate(ex.input_tensor_ids):
            counts: Health | None = None
            if k < len(recorded):
                counts = recorded[k]
            if tid == 0:  # a Python number argument (nanscope's convention)
                inputs.append(InputView(f"input {k} (a number)", None, counts))
                continue
            prod = producers.get(tid)
            producer = None
            if prod is not None:
                p, slot = prod
                producer = Producer(EXECUTIONS, p.index, p.op_type, p.op_type)
                if counts is None and slot < len(p.output_health):
                    counts = p.output_health[slot]
            elif searched_all and counts is not None and counts.nonfinite:
                external = True
            inputs.append(InputView(f"input {k}", producer, counts))
        return inputs, external

    def trace(self, index: int) -> EventView:
        r = self.reader
        tr = r.trace(index)
        counts = tr.health
        op = r.graph_op(tr.graph_id, tr.op_name, tr.process)
        frames = r.stack(op, tr.process) if op else []
        source, stack = self._frames(frames, tr.process)
        inputs: list[InputView] = []
        external = False
        graph_of_op = r.graph(tr.graph_id, tr.process)
        if op is not None and graph_of_op is not None:
            for producer_name, slot in op.inputs:
                # Through the Identity ops that TensorFlow leaves untraced.
                found = input_trace(r, tr.process, graph_of_op, producer_name, slot, index - 1)
                if found is None:
                    producer_op = r.graph_op(tr.graph_id, producer_name, tr.process)
                    number = (
                        producer_op is not None
                        and producer_op.op_type == "Const"
                        and not producer_op.inputs
                    )
                    suffix = " (a number)" if number else ""
                    inputs.append(InputView(f"{producer_name}:{slot}{suffix}", None, None))
                    continue
                try:
                    p = r.trace(found)
                except UNREADABLE:
                    inputs.append(InputView(f"{producer_name}:{slot}", None, None))
                    continue
                producer = Producer(TRACES, found, p.op_type, p.op_name)
                inputs.append(InputView(f"{producer_name}:{slot}", producer, p.health))
        graph = r.graph(tr.graph_id, tr.process)
        view = EventView(
            kind=TRACES,
            index=index,
            process=tr.process,
            rank=self._rank(tr.process),
            op_type=tr.op_type,
            op_name=tr.op_name,
            graph_id=tr.graph_id,
            graph_name=graph.name if graph else "",
            step=tr.step,
            wall_time=tr.wall_time,
            phase="",
            module_path=op.module_path if op else "",
            device=tr.device_name,
            counts=counts,
            shape=tr.shape if tr.debug_tensor_value is not None else None,
            inputs=inputs,
            source=source,
            stack=stack,
            external_input=external,
        )
        if op is not None and op.forward_stack_frame_ids:
            view.forward_source, _ = self._frames(
                r.stack_frames(op.forward_stack_frame_ids, tr.process), tr.process
            )
            view.phase = "backward"
        if tr.iteration >= 0:
            view.iteration = tr.iteration
        if op is not None and op.op_type == "Placeholder" and not op.inputs:
            # A graph's argument: its values came from the caller (data, parameters).
            view.external_input = True
        if self._flagged(TRACES, index):
            view.explanation = explain(
                tr.op_type, counts, [i.counts for i in inputs], view.external_input
            )
        return view
