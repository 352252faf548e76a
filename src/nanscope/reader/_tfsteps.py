"""Steps, and events lost at the start, in the dumps TensorFlow writes.

TensorFlow records no training step (every ``DebugEvent.step`` is 0) and says
nothing of its circular buffer (the metadata holds no size, the events no
sequence number). Both can be read from what the dump does hold: which
``tf.function`` the program called eagerly (an execution per call, whose op type
is ``__inference_<name>_<n>``), which graph ops each function holds (the
``.graphs`` file is never circular), and the graph execution traces each call
left (written while it ran, before its execution record).

**Steps** (docs/TENSORFLOW.md, "Steps"). The *step function* is the function
that trains: called eagerly, and holding (itself or in the functions it calls)
gradient ops (``gradient_tape/...``, ``gradients/...``) and variable updates
(``AssignSubVariableOp``, ``ResourceApplyAdam``, ...): a custom loop's
``@tf.function train_step``, ``Model.fit``'s train function
(``multi_step_on_iterator`` in Keras 3, ``train_function`` in tf.keras). Of
several, the one called most often. Without one, a function the program
differentiates eagerly (TensorFlow's ``__forward_<name>`` calls, made under a
``GradientTape``), the one called most often (of equals, the first called).
Each call begins a step, at its first traced op; a call that runs its training
graph several times (``steps_per_execution``) begins a step each time that
graph's first traced op runs again. Every event belongs to the step that had
begun when it ran: a call's traces and its execution to its step, the eager
ops after a call (reading the loss, a validation run) to that call's step.
Steps count from 0. Without a step function (a program that trains eagerly,
with no ``tf.function``) the dump has no steps.

**Events lost at the start.** A function's own ops (not those of the functions
it calls, which may sit in loops and branches) run once per call, and each
leaves the same traces every call. So in a whole history every call of a
function leaves as many traces of its own graph as any other call. When calls
that the dump records left fewer than its last call, the trace buffer let go
of their traces (it keeps the newest). When the first left more, or traces of
the function come before the first execution recorded, which is not a call of
it, the executions of the calls that left them were let go of.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from nanscope.reader._data import GraphInfo

# How TensorFlow names the eager call of a function: the prefix, the Python function's name,
# a number. ``__forward_`` is the forward function of a function called under a GradientTape.
CALL_PREFIXES = ("__inference_", "__forward_")
FORWARD_PREFIX = "__forward_"
_NUMBER = re.compile(r"_\d+$")

# Gradient ops, by the name scopes TensorFlow gives them in a graph.
GRADIENT_SCOPES = ("gradient_tape/", "gradients/")
# Ops that write a variable: what an optimizer's update is made of.
VARIABLE_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
VARIABLE_WRITE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter")


def function_name(op_type: str) -> str:
    """``__inference_train_step_123`` -> ``train_step``; other op types as they are."""
    for prefix in CALL_PREFIXES:
        if op_type.startswith(prefix):
            return _NUMBER.sub("", op_type[len(prefix) :])
    return op_type


def _has_gradients(graph: GraphInfo) -> bool:
    return any(name.startswith(GRADIENT_SCOPES) or "/gradient_tape/" in name for name in graph.ops)


def _writes_variables(graph: GraphInfo) -> bool:
    return any(
        op.op_type in VARIABLE_WRITES or op.op_type.startswith(VARIABLE_WRITE_PREFIXES)
        for op in graph.ops.values()
    )


@dataclass(frozen=True)
class _Function:
    """One function the program called eagerly, as the executions name it."""

    op_types: frozenset[int]  # the string ids of its calls' op types
    graph_ids: tuple[str, ...]  # the graphs it may be (one, or several of the same name)
    exact: bool  # graph_ids is the one graph the calls name (not a guess by name)
    forward: bool  # called under a GradientTape (``__forward_``)


class TfHistory:
    """What one TensorFlow process's dump says of its calls, for steps and lost events.

    ``executions`` and ``traces`` are the process's index rows (any row dtype with
    ``name``, ``graph``, ``slot`` and ``wall_time``), in file order; ``string`` turns
    their string ids into text; ``graphs`` are the process's graphs by id.
    """

    def __init__(
        self,
        executions: np.ndarray,
        traces: np.ndarray,
        string: Callable[[int], str],
        graphs: dict[str, GraphInfo],
    ) -> None:
        self.executions = executions
        self.traces = traces
        self.string = string
        self.graphs = graphs
        self._by_name: dict[str, list[str]] = {}
        for gid, g in graphs.items():
            self._by_name.setdefault(g.name, []).append(gid)
        # The traces' graph ids, as text, to their string ids.
        self._trace_graphs = {string(int(s)): int(s) for s in np.unique(traces["graph"]).tolist()}
        self._call_positions: dict[tuple[str, ...], np.ndarray] = {}
        self.functions = self._functions()

    # -- which executions are calls of which function ---------------------------------------

    def _functions(self) -> dict[tuple[str, ...], _Function]:
        """The functions called eagerly, keyed by the graphs they run."""
        rows = self.executions
        found: dict[tuple[str, ...], _Function] = {}
        if not len(rows):
            return found
        pairs = np.unique(
            rows["name"].astype(np.int64) << np.int64(32) | rows["graph"].astype(np.int64)
        )
        calls = [
            (key >> 32, self.string(key >> 32), self.string(key & 0xFFFFFFFF))
            for key in pairs.tolist()
        ]
        # Graphs that the executions name: no other call runs them.
        named = {graph_id for _, _, graph_id in calls if graph_id in self.graphs}
        for sid, op_type, graph_id in calls:
            if not graph_id and not op_type.startswith(CALL_PREFIXES):
                continue
            exact = graph_id in self.graphs
            if exact:
                ids: tuple[str, ...] = (graph_id,)
            else:
                # TensorFlow names no graph for the functions a GradientTape calls: the
                # graph of the same name that no other call names is the one (several when
                # it was traced again).
                by_name = self._by_name.get(function_name(op_type), ())
                ids = tuple(g for g in by_name if g not in named)
                exact = len(ids) == 1
            if not ids:
                continue
            old = found.get(ids)
            found[ids] = _Function(
                op_types=(old.op_types if old else frozenset()) | {sid},
                graph_ids=ids,
                exact=exact and (old.exact if old else True),
                forward=op_type.startswith(FORWARD_PREFIX) or (old.forward if old else False),
            )
        return found

    def _calls(self, fn: _Function) -> np.ndarray:
        """The positions of ``fn``'s calls among the executions."""
        found = self._call_positions.get(fn.graph_ids)
        if found is None:
            names = self.executions["name"]
            wanted = np.fromiter(fn.op_types, dtype=names.dtype, count=len(fn.op_types))
            found = self._call_positions[fn.graph_ids] = np.flatnonzero(np.isin(names, wanted))
        return found

    def _family(self, graph_ids: Iterable[str]) -> list[str]:
        """The graphs and every graph nested in them, outermost first."""
        out: list[str] = []
        seen: set[str] = set()
        queue = list(graph_ids)
        while queue:
            gid = queue.pop(0)
            if gid in seen:
                continue
            seen.add(gid)
            out.append(gid)
            g = self.graphs.get(gid)
            if g is not None:
                queue.extend(g.inner_graph_ids)
        return out

    def _trains(self, fn: _Function) -> bool:
        family = [self.graphs[g] for g in self._family(fn.graph_ids) if g in self.graphs]
        return any(map(_has_gradients, family)) and any(map(_writes_variables, family))

    def _in_graphs(self, graph_ids: Iterable[str]) -> np.ndarray:
        """Which traces ran in one of ``graph_ids`` (their own ops, not nested graphs')."""
        wanted = [self._trace_graphs[g] for g in graph_ids if g in self._trace_graphs]
        if not wanted:
            return np.zeros(len(self.traces), dtype=bool)
        graph_col = self.traces["graph"]
        return np.isin(graph_col, np.array(wanted, dtype=graph_col.dtype))

    # -- steps ------------------------------------------------------------------------------

    def step_function(self) -> _Function | None:
        """The function whose calls are the training steps (see the module's docstring)."""
        counted = [(fn, len(self._calls(fn))) for fn in self.functions.values()]
        for pick in (lambda fn: self._trains(fn), lambda fn: fn.forward):
            candidates = [(fn, n) for fn, n in counted if n and pick(fn)]
            if candidates:
                # Most calls; of equals, the one called first.
                return max(candidates, key=lambda c: (c[1], -int(self._calls(c[0])[0])))[0]
        return None

    def steps(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each execution's and each trace's step (int64 arrays), or None without a step
        function."""
        fn = self.step_function()
        if fn is None:
            return None
        calls = self._calls(fn)
        times = self.executions["wall_time"].astype(np.float64)
        call_times = times[calls]
        begins = self._begins(fn, call_times)
        # Each call's execution: the step of its last run.
        call_steps = np.searchsorted(begins, call_times, side="right") - 1
        # Other executions: the step of the latest call before them (0 before the first).
        latest = np.cumsum(np.isin(np.arange(len(times)), calls)) - 1
        exec_steps = np.where(latest >= 0, call_steps[np.maximum(latest, 0)], 0)
        trace_times = self.traces["wall_time"].astype(np.float64)
        trace_steps = np.searchsorted(begins, trace_times, side="right") - 1
        return (
            np.maximum(exec_steps, 0).astype(np.int64),
            np.maximum(trace_steps, 0).astype(np.int64),
        )

    def _begins(self, fn: _Function, call_times: np.ndarray) -> np.ndarray:
        """When each step began, in order: each call's first trace of the function's graphs
        (its execution's time when it left none), and each later run of its training
        graph within a call; also a call in progress when the dump ended."""
        n = len(call_times)
        family = self._family(fn.graph_ids)
        tt = self.traces["wall_time"].astype(np.float64)
        # Which call each trace ran in, or before: a call's traces precede its execution.
        call_of = np.searchsorted(call_times, tt, side="left")
        begin = np.append(call_times, np.inf)  # the last: a call still running at the end
        ours = np.flatnonzero(self._in_graphs(family))
        if ours.size:
            first = np.full(n + 1, np.inf)
            np.minimum.at(first, call_of[ours], tt[ours])
            begin = np.minimum(begin, first)
        begins = [begin[np.isfinite(begin)]]
        marker = self._marker(family)
        if marker is not None:
            hits = np.flatnonzero(marker)
            # The first run of each call began with the call; each further run of the
            # training graph in the same call (steps_per_execution) begins a step.
            order = np.lexsort((tt[hits], call_of[hits]))
            hits = hits[order]
            again = np.zeros(len(hits), dtype=bool)
            again[1:] = call_of[hits][1:] == call_of[hits][:-1]
            begins.append(tt[hits[again]])
        out = np.sort(np.concatenate(begins))
        return out

    def _marker(self, family: list[str]) -> np.ndarray | None:
        """Traces of the first op that ran in the training graph (the outermost graph of
        ``family`` with gradient ops), whose every run it begins; None: none found."""
        training = next(
            (g for g in family if g in self.graphs and _has_gradients(self.graphs[g])), None
        )
        if training is None:
            return None
        own = np.flatnonzero(self._in_graphs([training]))
        if not own.size:
            return None
        first = self.traces[own[0]]
        marker: np.ndarray = (
            (self.traces["graph"] == first["graph"])
            & (self.traces["name"] == first["name"])
            & (self.traces["slot"] == first["slot"])
        )
        return marker

    # -- events lost at the start -----------------------------------------------------------

    def lost(self) -> tuple[str | None, str | None]:
        """Why the trace file and the execution file (each None: nothing says so) lost
        their first events."""
        lost_traces: str | None = None
        lost_executions: str | None = None
        if not len(self.executions) or not len(self.traces):
            return None, None
        times = self.executions["wall_time"].astype(np.float64)
        tt = self.traces["wall_time"].astype(np.float64)
        for fn in self.functions.values():
            if not fn.exact:
                continue
            own = np.flatnonzero(self._in_graphs(fn.graph_ids))
            if not own.size:
                continue  # its own ops leave no traces: nothing to count
            calls = self._calls(fn)
            call_times = times[calls]
            name = self.string(int(self.executions["name"][calls[0]]))
            # Each call's own traces: those after the call before it, up to its execution.
            counts = np.bincount(
                np.searchsorted(call_times, tt[own], side="left"), minlength=len(calls) + 1
            )[: len(calls)]
            # The last call's count: every one of its traces reached the file.
            full = int(counts[-1])
            short = np.flatnonzero(counts[:-1] < full)
            if short.size and lost_traces is None:
                lost_traces = (
                    f"{short.size} of the {len(calls)} calls of {name} that the dump holds (the "
                    f"first at execution #{calls[short[0]]}) left fewer of the traces of its graph "
                    f"than every call leaves ({full}): their traces were not kept"
                )
            if lost_executions is None and (
                (len(calls) > 1 and int(counts[0]) > full)
                or (tt[own[0]] < times[0] and calls[0] != 0)
            ):
                lost_executions = (
                    f"traces of {name} come before its first call that the dump holds "
                    f"(execution #{calls[0]}), from calls whose executions were not kept"
                )
        return lost_traces, lost_executions
