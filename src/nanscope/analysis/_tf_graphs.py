"""What TensorFlow graphs say about Inf/NaN beyond their data edges: which ops are the
backward pass, which write variables, and where a loss scaler checked gradients and
skipped the update.

Keras's ``LossScaleOptimizer`` (Keras 3, which ``tf.keras`` is, and the ``tf_keras``
one alike) multiplies the loss by a dynamic scale, so that its float16 gradients
overflow now and then. Its ``apply`` checks them before it applies them::

    finite = all([all(is_finite(g)) for g in grads])   # IsFinite -> All -> Pack -> All
    cond(finite, apply_and_maybe_double_scale, halve_scale)    # an If op

In a traced graph that is an ``If`` (or ``StatelessIf``) whose predicate is an AND of
``IsFinite`` checks and whose other inputs are the gradients themselves: their values go
into the branch that applies them only when every one is finite. So gradients read by such
a check were *handled*: the update was skipped, the scale halved (the other branch ran).
The branches are graphs of their own (``cond_true_529``, ``cond_false_530`` for an ``If``
named ``cond``: ``cond_v2`` names them after the op), traced when they run, so the dump
also shows which branch each call took.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from nanscope.reader import TRACES, DumpReader, GraphInfo

# The predicate of the loss scaler's cond: an AND of IsFinite checks, maybe reshaped.
_CHECK = "IsFinite"
_AND_OPS = frozenset(
    {
        "All",
        "LogicalAnd",
        "Pack",
        "ConcatV2",
        "Identity",
        "Reshape",
        "Squeeze",
        "ExpandDims",
        "StopGradient",
        "Snapshot",
    }
)
_CONDS = frozenset({"If", "StatelessIf"})
# Values visited when following a value's paths to the loss scaler's checks, at most.
_CONTAIN_LIMIT = 5000

# Ops that write their value inputs into a variable: parameters, optimizer states, metrics.
_WRITES = frozenset(
    {
        "AssignVariableOp",
        "AssignAddVariableOp",
        "AssignSubVariableOp",
        "Assign",
        "AssignAdd",
        "AssignSub",
    }
)
_WRITE_PREFIXES = (
    "ResourceApply",
    "ResourceSparseApply",
    "ApplyGradientDescent",
    "ApplyAdam",
    "ResourceScatter",
    "ScatterUpdate",
    "ScatterAdd",
    "ScatterSub",
)


def is_backward_op(op_name: str) -> bool:
    """Whether a graph op is part of a backward pass, by the name scope TensorFlow gives the
    ops that compute gradients: ``gradient_tape/`` (``tf.GradientTape``), ``gradients/``
    (``tf.gradients``)."""
    return op_name.startswith(("gradient_tape/", "gradients/")) or "/gradient_tape/" in op_name


def writes_variable(op_type: str) -> bool:
    """Whether an op writes its (non-resource) inputs into a variable."""
    return op_type in _WRITES or op_type.startswith(_WRITE_PREFIXES)


def branch_pattern(if_name: str) -> re.Pattern[str]:
    """The names ``cond_v2`` gives the branch graphs of an ``If`` op named ``if_name``:
    ``a/cond`` -> ``a_cond_true_12``, ``a_cond_false_13``."""
    return re.compile(re.escape(if_name.replace("/", "_")) + r"_(true|false)_\d+$")


@dataclass
class _GraphChecks:
    """One graph's loss-scaler conds: for each, the values its IsFinite checks read."""

    checked: dict[tuple[str, int], set[str]] = field(default_factory=dict)  # value -> conds
    check_ops: dict[str, set[str]] = field(default_factory=dict)  # IsFinite op -> conds


class LossScaleChecks:
    """Where, in one process's graphs, a loss scaler checked values and skipped an update."""

    def __init__(self, reader: DumpReader, process: int) -> None:
        self.reader = reader
        self.process = process
        self._graphs: dict[str, _GraphChecks] = {}
        self._runs: dict[tuple[str, str], list[tuple[int, bool]] | None] = {}
        self._positions: dict[tuple[int, int, int], np.ndarray] = {}

    def _of(self, graph: GraphInfo) -> _GraphChecks:
        found = self._graphs.get(graph.graph_id)
        if found is None:
            found = self._graphs[graph.graph_id] = _scan(graph)
        return found

    def checks(self, graph: GraphInfo, op_name: str, slot: int | None = None) -> set[str]:
        """The loss-scaler conds whose finiteness checks read ``op_name``'s output ``slot``
        (any output when ``None``)."""
        table = self._of(graph).checked
        if slot is not None:
            return table.get((op_name, slot), set())
        return set().union(*(c for (name, _), c in table.items() if name == op_name))

    def is_check(self, graph: GraphInfo, op_name: str) -> bool:
        """Whether ``op_name`` is an IsFinite that a loss-scaler cond's predicate reads."""
        return op_name in self._of(graph).check_ops

    def guards(self, graph: GraphInfo, cond: str, op_name: str, slot: int) -> bool:
        """Whether ``cond`` is a loss-scaler cond that reads ``op_name:slot`` only after its
        own predicate checked it (the value goes into the applying branch only if finite)."""
        return cond in self.checks(graph, op_name, slot)

    def contains(self, graph: GraphInfo, op_name: str, slot: int) -> bool:
        """Whether every value made from ``op_name:slot`` meets this graph's loss-scaler
        checks before it can do harm: each path through the graph's data edges ends at a
        finiteness check (an ``IsFinite`` that a loss-scaler cond's predicate reads) or at
        such a cond, which hands the value to the applying branch only when every check
        passed; none reaches a graph output or a variable first.

        What the traces cannot show (events a circular buffer dropped) the graph can: where
        this holds, the values were either absorbed on the way or checked, and a
        non-finite one made the loss scaler skip the update."""
        todo: list[tuple[str, int]] = [(op_name, slot)]
        seen: set[tuple[str, int]] = set()
        while todo:
            name, out = todo.pop()
            if (name, out) in seen:
                continue
            seen.add((name, out))
            if len(seen) > _CONTAIN_LIMIT:
                return False
            consumers, leaves = consumers_through(graph, name, out)
            if leaves or not consumers:
                return False  # a graph output (or a value nothing reads: not shown checked)
            for dst, _ in consumers:
                op = graph.ops.get(dst)
                if op is None or writes_variable(op.op_type):
                    return False
                if self.is_check(graph, dst):
                    continue
                if op.op_type in _CONDS:
                    if self.guards(graph, dst, name, out):
                        continue
                    return False  # another cond: its branches are graphs of their own
                todo.extend({(dst, s) for s, _, _ in graph.consumers(dst)} or {(dst, 0)})
        return True

    def skip_run(self, graph: GraphInfo, cond: str, op_name: str, slot: int, index: int) -> int:
        """The trace that shows the update skipped in the call of ``graph`` where trace
        ``index`` (of ``op_name:slot``) was written: the first trace of the cond's other
        branch (which halves the scale) in that call. -1 when the dump cannot tell (a
        branch left untraced, events dropped) or the call took the applying branch."""
        runs = self._branch_runs(graph, cond)
        if not runs or self.reader.evicted(TRACES):
            return -1
        call = self._count(graph.graph_id, op_name, slot, index)
        # Every call runs one branch: where the counts differ, events are missing.
        if len(self._traces_of(graph.graph_id, op_name, slot)) != len(runs):
            return -1
        if not 0 < call <= len(runs):
            return -1
        first, applied = runs[call - 1]
        return -1 if applied else first

    def _count(self, graph_id: str, op_name: str, slot: int, index: int) -> int:
        """How many traces of ``op_name:slot`` in ``graph_id`` there are up to ``index``:
        the number of the graph call that wrote trace ``index``."""
        positions = self._traces_of(graph_id, op_name, slot)
        return int(np.searchsorted(positions, index, side="right"))

    def _traces_of(self, graph_id: str, op_name: str, slot: int | None) -> np.ndarray:
        r = self.reader
        gid, nid = r.string_id(graph_id), r.string_id(op_name)
        if gid is None or nid is None:
            return np.zeros(0, dtype=np.int64)
        key = (gid, nid, -1 if slot is None else slot)
        found = self._positions.get(key)
        if found is None:
            rows = r.index(TRACES)
            mask = (rows["graph"] == gid) & (rows["name"] == nid)
            mask &= r.processes_of(TRACES) == self.process
            if slot is not None:
                mask &= rows["slot"] == slot
            found = self._positions[key] = np.flatnonzero(mask)
        return found

    def _branch_runs(self, graph: GraphInfo, cond: str) -> list[tuple[int, bool]] | None:
        """Each run of ``cond``'s branches, in order: (its first trace, whether it was the
        branch that applies the values, the true one); None when a branch has no traces
        to count its runs by."""
        key = (graph.graph_id, cond)
        if key in self._runs:
            return self._runs[key]
        pattern = branch_pattern(cond)
        runs: list[tuple[int, bool]] = []
        branches = [
            g
            for g in self.reader.graphs(self.process).values()
            if g.outer_graph_id == graph.graph_id and pattern.match(g.name)
        ]
        for branch in branches:
            applied = pattern.match(branch.name).group(1) == "true"  # type: ignore[union-attr]
            # Every run traces each of the branch's ops once: count the runs by one of them,
            # the op traced first.
            gid = self.reader.string_id(branch.graph_id)
            if gid is None:
                continue
            rows = self.reader.index(TRACES)
            mine = np.flatnonzero(
                (rows["graph"] == gid) & (self.reader.processes_of(TRACES) == self.process)
            )
            if not mine.size:
                continue
            first = self.reader.string(int(rows["name"][mine[0]]))
            for i in self._traces_of(branch.graph_id, first, int(rows["slot"][mine[0]])).tolist():
                runs.append((i, applied))
        self._runs[key] = sorted(runs) if len(branches) == 2 else None
        return self._runs[key]


def _scan(graph: GraphInfo) -> _GraphChecks:
    """Find the conds whose predicate is an AND of IsFinite checks, and what they check."""
    out = _GraphChecks()
    for op in graph.ops.values():
        if op.op_type not in _CONDS or not op.inputs:
            continue
        checks = _predicate_checks(graph, op.inputs[0][0])
        if not checks:
            continue
        for name in checks:
            out.check_ops.setdefault(name, set()).add(op.op_name)
            src, slot = graph.ops[name].inputs[0]
            out.checked.setdefault((src, slot), set()).add(op.op_name)
    return out


def _predicate_checks(graph: GraphInfo, start: str) -> set[str]:
    """The IsFinite ops that an AND-only predicate rooted at ``start`` reads; empty when
    anything else decides it (a comparison, a negation: not a finiteness check)."""
    checks: set[str] = set()
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        op = graph.ops.get(name)
        if op is None:
            return set()
        if op.op_type == _CHECK and op.inputs:
            checks.add(name)
        elif op.op_type == "Const":
            continue  # reduction axes, shapes
        elif op.op_type in _AND_OPS:
            todo.extend(src for src, _ in op.inputs)
        else:
            return set()
    return checks


# Ops that pass a value on unchanged and that TensorFlow's dumping never traces (its op
# callbacks skip them): a consumer's input is then the trace of what they were given.
_PASS_THROUGH = frozenset({"Identity", "Snapshot", "Enter", "Exit", "Switch", "Merge"})
_PASS_LIMIT = 64  # links followed at most (a cycle through a loop's Merge ends it)


def input_trace(
    reader: DumpReader, process: int, graph: GraphInfo, src: str, slot: int, near: int
) -> int | None:
    """The last trace at or before ``near`` of graph input ``src:slot``, looking through
    the ``Identity`` ops (``Variable.read_value()``, ``tf.identity``, a function's outputs)
    that TensorFlow leaves untraced."""
    from nanscope.analysis._dataflow import nearest_trace

    for _ in range(_PASS_LIMIT):
        found = nearest_trace(reader, process, graph.graph_id, src, slot, near, later=False)
        if found is not None:
            return found
        op = graph.ops.get(src)
        if op is None or op.op_type not in _PASS_THROUGH or not op.inputs:
            return None
        src, slot = op.inputs[0]
    return None


def consumers_through(
    graph: GraphInfo, op_name: str, slot: int
) -> tuple[list[tuple[str, int]], bool]:
    """The ops that read output ``slot`` of ``op_name``, as ``(op, input slot)``, looking
    through untraced ``Identity`` ops; and whether the value also leaves the graph (an
    ``Identity`` that nothing reads: a function's output)."""
    found: list[tuple[str, int]] = []
    leaves = False
    todo: list[tuple[str, int]] = [(op_name, slot)]
    seen: set[tuple[str, int]] = set()
    while todo and len(seen) < _PASS_LIMIT:
        name, out = todo.pop()
        if (name, out) in seen:
            continue
        seen.add((name, out))
        for s, dst, in_slot in graph.consumers(name):
            if s != out:
                continue
            op = graph.ops.get(dst)
            if op is not None and op.op_type in _PASS_THROUGH and op.op_type != "Switch":
                if not graph.consumers(dst):
                    leaves = True
                todo.append((dst, 0))
            else:
                found.append((dst, in_slot))
    return found, leaves
