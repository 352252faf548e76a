"""Eager and compiled parts of one JAX program are one data flow.

A JAX program mixes eager ops (each an ``Execution``, linked by tensor ids) and
calls of jitted functions (an ``Execution`` of the call, with the traces of the
values computed inside, linked by the graph's ``producer:slot`` inputs). Values
cross between the two: an eager array passed into a jitted call is that call's
``Placeholder`` (its arguments, in order), and what a call returns is read by
later eager ops and later calls. So the lineages of one process are followed in
one pass over both kinds of events, in the order they happened (a call's traces
are written just before its ``Execution``):

* an eager value passed into a call continues its lineage inside the graph, at
  the ``Placeholder`` of that argument;
* a value a call returns continues the lineage that reached the graph's output
  inside the call, in later eager ops and later calls. Reaching a graph output
  is no harm by itself: what later reads the value decides (a mask built
  eagerly, kept and passed into every training step, is absorbed by the softmax
  inside each call: benign);
* a lineage born in the forward pass that reaches a backward equation (JAX
  writes backward equations with a forward source) reaches the loss and the
  gradients; one that a training step (a graph with backward equations) returns
  at a later step than its birth was kept in the parameters or the optimizer
  state; values that nothing read by the end of the recording are harmful.

Inside a guarded call that was not replayed (docs/JAX.md, "Guards and replays")
only the guards are traced: a guard's inputs have no trace in that call, so its
Inf/NaN continue the lineages of the call's non-finite arguments (or of what it
computed before), and a value whose consumers were not traced was absorbed if the
call returned none of its kind.

The rules are in docs/ROOT_CAUSE.md ("Eager and compiled parts are one data flow").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nanscope.analysis._dataflow import nearest_trace
from nanscope.analysis._lineage import (
    DECODE_LIMIT,
    END,
    GRADIENTS,
    GRAPH_OUTPUT,
    LATER_STEP,
    Lineage,
    absorbs,
    nonfinite_kinds,
    passed_on,
    reaches_backward,
    verdict_of,
)
from nanscope.analysis._tf_graphs import input_trace
from nanscope.format.health import Health
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader, Execution, GraphInfo
from nanscope.vocabulary import NonFinite, Phase


def is_jax(reader: DumpReader, process: int) -> bool:
    """Whether ``process`` recorded a JAX program."""
    procs = reader.processes
    return process < len(procs) and procs[process].framework.startswith("jax")


@dataclass
class _Run:
    """The traces one call of a graph wrote (consecutive, one wall time), and its call."""

    graph: int  # string id of the graph
    wall: float
    start: int  # first trace index
    execution: int | None = None  # the call's Execution, when it was kept
    inside: set[int] = field(default_factory=set)  # lineages whose values it traced
    left: set[int] = field(default_factory=set)  # ... that reached a graph output
    # A traced value's counts -> its lineages, and the arguments among them: a result is
    # the value whose summary is its own (its producer's row).
    by_health: dict[tuple[object, ...], set[int]] = field(default_factory=dict)
    arguments: dict[tuple[object, ...], int] = field(default_factory=dict)


class _Joint:
    def __init__(self, reader: DumpReader, process: int) -> None:
        self.reader = reader
        self.process = process
        self.lineages: list[Lineage] = []
        self.bad: dict[int, set[int]] = {}  # tensor id -> lineages
        self.unread: dict[int, set[int]] = {}  # tensor id -> lineages, nothing read it yet
        self.producer: dict[int, int] = {}  # tensor id -> the execution that made it
        self.member_of: dict[int, set[int]] = {}  # trace index -> lineages
        self.last: dict[int, tuple[str, int]] = {}  # lineage -> its last event
        self._placeholders: dict[str, dict[str, int]] = {}
        self._training: dict[str, bool] = {}
        self._backward: dict[tuple[str, str], bool] = {}
        # (graph id, output slot) -> what it held at the last call that summarised it, and
        # which argument it returned as it was (-1: a value computed in the call).
        self.held: dict[tuple[str, int], set[NonFinite]] = {}
        self.returns: dict[tuple[str, int], int] = {}

    # -- graphs ------------------------------------------------------------------------------

    def graph(self, graph_id: str) -> GraphInfo | None:
        return self.reader.graph(graph_id, self.process)

    def placeholders(self, graph: GraphInfo) -> dict[str, int]:
        """The graph's arguments and their positions (a JAX graph's ``Placeholder`` ops, one
        per argument, in order)."""
        found = self._placeholders.get(graph.graph_id)
        if found is None:
            names = [n for n, op in graph.ops.items() if op.op_type == "Placeholder"]
            found = {n: k for k, n in enumerate(names)}
            self._placeholders[graph.graph_id] = found
        return found

    def backward(self, graph: GraphInfo, op_name: str) -> bool:
        """Whether a graph op is a backward equation (JAX writes those with a forward source)."""
        key = (graph.graph_id, op_name)
        found = self._backward.get(key)
        if found is None:
            op = graph.ops.get(op_name)
            found = bool(op is not None and op.forward_stack_frame_ids)
            self._backward[key] = found
        return found

    def training(self, graph_id: str) -> bool:
        """Whether a graph computes gradients (a training step: its results are the state)."""
        found = self._training.get(graph_id)
        if found is None:
            graph = self.graph(graph_id)
            found = bool(graph) and any(
                op.forward_stack_frame_ids
                for op in graph.ops.values()  # type: ignore[union-attr]
            )
            self._training[graph_id] = found
        return found

    # -- lineages ----------------------------------------------------------------------------

    def new(
        self,
        kind: str,
        index: int,
        step: int,
        phase: int,
        wall: float,
        signature: tuple[object, ...],
        entered: bool,
        after_gap: bool,
    ) -> int:
        self.lineages.append(
            Lineage(kind, self.process, index, step, phase, wall, signature, entered, after_gap)
        )
        return len(self.lineages) - 1

    def note(
        self, li: int, kind: str, index: int, out: set[NonFinite], step: int, backward: bool
    ) -> None:
        """Event ``index`` holds lineage ``li``'s values (of the kinds in ``out``)."""
        lin = self.lineages[li]
        if kind == lin.kind:
            lin.add(index, out)
        else:
            lin.carries |= out
        self.last[li] = (kind, index)
        if backward and reaches_backward(lin):
            lin.reach(GRADIENTS)

    def absorb(self, li: int, kind: str, index: int) -> None:
        lin = self.lineages[li]
        if lin.absorbed_at is None:
            # Where, in the lineage's own kind: the event, or its last member before it.
            lin.absorbed_at = index if kind == lin.kind else lin.members[-1]


def joint_lineages(reader: DumpReader, process: int) -> tuple[list[Lineage], bool]:
    """The lineages of one JAX process, eager ops and graph traces together, and whether they
    were followed to the end (False when the decode limit was reached)."""
    xrows, trows = reader.index(EXECUTIONS), reader.index(TRACES)
    xmine = np.flatnonzero(reader.processes_of(EXECUTIONS) == process)
    tmine = np.flatnonzero(reader.processes_of(TRACES) == process)
    xbad = xmine[xrows["nonfinite"][xmine] == 1]
    tbad = tmine[trows["nonfinite"][tmine] == 1]
    if not xbad.size and not tbad.size:
        return [], True
    j = _Joint(reader, process)
    runs, run_of = _runs(trows, tmine, xrows, xmine)
    # Where to begin: the first event with Inf/NaN (a call's traces come before its call).
    starts = []
    if xbad.size:
        starts.append(float(xrows["wall_time"][xbad[0]]))
    if tbad.size:
        r = runs[int(run_of[tbad[0]])]
        starts.append(r.wall)
    begin = min(starts)
    xs = xmine[xrows["wall_time"][xmine] >= begin]
    complete = len(xs) + len(tbad) <= DECODE_LIMIT
    events: list[tuple[float, int, int]] = []
    for e in xs.tolist():
        events.append((float(xrows["wall_time"][e]), 1, e))
    for i in tbad.tolist():
        r = runs[int(run_of[i])]
        at = float(xrows["wall_time"][r.execution]) if r.execution is not None else r.wall
        events.append((at, 0, i))
    events.sort()
    events = events[:DECODE_LIMIT]
    xgaps = [a for p, a, _ in reader.gaps(EXECUTIONS) if p == process]
    tgaps = [a for p, a, _ in reader.gaps(TRACES) if p == process]
    done_runs: set[int] = set()
    call_of_execution = {r.execution: k for k, r in enumerate(runs) if r.execution is not None}
    for _, kind, index in events:
        if kind == 0:
            _trace(j, index, runs, run_of, tgaps)
        else:
            k = call_of_execution.get(index)
            _execution(j, index, runs[k] if k is not None else None, xgaps)
            if k is not None:
                done_runs.add(k)
    # Calls whose Execution was not kept: what reached their outputs cannot be followed.
    for k, r in enumerate(runs):
        if k not in done_runs and r.left:
            for li in r.left:
                j.lineages[li].reach(GRAPH_OUTPUT)
    last_x = xgaps[-1] if xgaps else -1
    last_t = tgaps[-1] if tgaps else -1
    for t, held in j.unread.items():
        made = j.producer.get(t, -1)
        for li in held:
            if j.lineages[li].absorbed_at is not None:
                # Absorbed where it was read, and still held (a mask kept in a module's
                # state, returned by the last step): no harm for being held.
                continue
            last_kind, at = j.last.get(li, (EXECUTIONS, made))
            after = at > (last_x if last_kind == EXECUTIONS else last_t)
            if complete and made > last_x and after:
                j.lineages[li].reach(END)
    for lin in j.lineages:
        lin.verdict = verdict_of(lin)
    return j.lineages, complete


def _runs(
    trows: np.ndarray, tmine: np.ndarray, xrows: np.ndarray, xmine: np.ndarray
) -> tuple[list[_Run], np.ndarray]:
    """Each call's traces (a run: consecutive traces of one graph with one wall time), matched
    with the call's Execution (the first call of that graph at or after the run); and each
    trace's run (-1: none)."""
    run_of = np.full(len(trows), -1, dtype=np.int64)
    runs: list[_Run] = []
    if tmine.size:
        g, w = trows["graph"][tmine], trows["wall_time"][tmine]
        cut = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (w[1:] != w[:-1])])
        ends = np.r_[cut[1:], len(tmine)]
        for a, b in zip(cut.tolist(), ends.tolist(), strict=True):
            runs.append(_Run(int(g[a]), float(w[a]), int(tmine[a])))
            run_of[tmine[a:b]] = len(runs) - 1
    calls: dict[int, list[int]] = {}
    for e in xmine[xrows["graph"][xmine] != 0].tolist():
        calls.setdefault(int(xrows["graph"][e]), []).append(e)
    # A call's Execution is written after its traces and before the next call's traces: one
    # whose Execution the circular buffer dropped matches none (not the next call's).
    by_graph: dict[int, list[_Run]] = {}
    for r in runs:
        by_graph.setdefault(r.graph, []).append(r)
    for graph, mine_runs in by_graph.items():
        mine = calls.get(graph, [])
        walls = [float(xrows["wall_time"][e]) for e in mine]
        k = 0
        for n, r in enumerate(mine_runs):
            until = mine_runs[n + 1].wall if n + 1 < len(mine_runs) else float("inf")
            while k < len(mine) and walls[k] < r.wall:
                k += 1
            if k < len(mine) and walls[k] < until:
                r.execution = mine[k]
                k += 1
    return runs, run_of


def _trace(j: _Joint, i: int, runs: list[_Run], run_of: np.ndarray, gaps: list[int]) -> None:
    reader, process = j.reader, j.process
    try:
        tr = reader.trace(i)
    except UNREADABLE:
        return
    k = int(run_of[i])
    run = runs[k] if k >= 0 else None
    graph = j.graph(tr.graph_id)
    op = graph.ops.get(tr.op_name) if graph else None
    out = nonfinite_kinds(tr.health)
    contributors: set[int] = set()
    untraced = False  # an input computed in this call has no trace in it (a guarded call)
    entered = False
    call = None
    if run is not None and run.execution is not None:
        try:
            call = reader.execution(run.execution)
        except UNREADABLE:
            call = None
    if op is not None and graph is not None and op.inputs:
        for src, slot in op.inputs:
            src_op = graph.ops.get(src)
            at = input_trace(reader, process, graph, src, slot, i - 1)
            if at is None or int(run_of[at]) != k:
                # A number in the program is never traced; anything else was not traced in
                # this call (a guarded call that was not replayed).
                untraced |= src_op is None or src_op.op_type != "Const"
                continue
            contributors |= j.member_of.get(at, set())
    elif op is not None and graph is not None and op.op_type == "Placeholder":
        entered = True
        if call is not None:
            names = j.placeholders(graph)
            ids = call.input_tensor_ids
            if len(names) == len(ids) and tr.op_name in names:
                t = ids[names[tr.op_name]]
                contributors = set(j.bad.get(t, ()))
                j.unread.pop(t, None)
            else:  # the arguments cannot be told apart: any that held Inf/NaN
                for t in ids:
                    contributors |= j.bad.get(t, set())
    elif op is not None and op.op_type == "Const":
        entered = True
    if not contributors and untraced and run is not None:
        # A guard of a call that was not replayed: its inputs were not traced. Its values
        # came from the call's arguments, or from what the call traced before.
        if call is not None:
            for t in call.input_tensor_ids:
                contributors |= j.bad.get(t, set())
        contributors |= run.inside
    backward = bool(graph and j.backward(graph, tr.op_name))
    kinds: dict[int, set[NonFinite]] = {}
    if contributors:
        passed = passed_on(contributors, out, j.lineages)
        kinds = {li: _explained(j, li, contributors, out) for li in passed}
        for li in contributors - passed:
            j.absorb(li, TRACES, i)
    else:
        after_gap = entered and any(g < i for g in gaps)
        phase = Phase.BACKWARD if backward else Phase.FORWARD
        passed = {
            j.new(
                TRACES,
                i,
                tr.step,
                phase,
                tr.wall_time,
                (tr.graph_id, tr.op_name),
                entered,
                after_gap,
            )
        }
    j.member_of[i] = passed
    for li in passed:
        j.note(li, TRACES, i, kinds.get(li, out), tr.step, backward)
    if run is not None:
        run.inside |= passed
        key = _health_key(tr.health)
        run.by_health.setdefault(key, set()).update(passed)
        if op is not None and graph is not None and op.op_type == "Placeholder":
            run.arguments[key] = j.placeholders(graph).get(tr.op_name, -1)
    if op is None or graph is None:
        if run is not None:
            run.left |= passed
        return
    consumers = [(dst, s) for s, dst, _ in graph.consumers(tr.op_name) if s == tr.output_slot]
    if not consumers:
        if run is not None:
            run.left |= passed  # a result of the call (or a value nothing used)
        else:
            for li in passed:
                j.lineages[li].reach(GRAPH_OUTPUT)
        return
    rows = reader.index(TRACES)
    for dst, _ in consumers:
        at = nearest_trace(reader, process, tr.graph_id, dst, None, i, later=True)
        if at is None or int(run_of[at]) != k or rows["nonfinite"][at] == 1:
            continue  # not traced in this call (decided at the call), or it holds them too
        dst_op = graph.ops.get(dst)
        if (
            dst_op is not None
            and dst_op.num_outputs > 1
            and any(
                (o := nearest_trace(reader, process, tr.graph_id, dst, slot, i, later=True))
                is not None
                and int(run_of[o]) == k
                and rows["nonfinite"][o] == 1
                for slot in range(min(dst_op.num_outputs, 64))
            )
        ):
            # One output of a several-output op (a scan's stacked results beside its carry)
            # holds Inf/NaN: which output these values went to is not known, so none absorbs.
            continue
        for li in passed:
            j.absorb(li, TRACES, at)


def _execution(j: _Joint, e: int, run: _Run | None, gaps: list[int]) -> None:
    try:
        ex = j.reader.execution(e)
    except UNREADABLE:
        return
    read = [t for t in ex.input_tensor_ids if j.bad.get(t)]
    contributors: set[int] = set()
    for t in read:
        contributors |= j.bad[t]
    training = bool(ex.graph_id) and j.training(ex.graph_id)
    if run is not None:
        _call(j, ex, run, read, contributors, training)
        return
    if not ex.health.any_nonfinite:
        if absorbs(ex):
            for t in read:
                j.unread.pop(t, None)
            for li in contributors:
                j.absorb(li, EXECUTIONS, e)
        _clear(j, ex.output_tensor_ids)
        return
    for t in read:
        j.unread.pop(t, None)
    out = nonfinite_kinds(ex.health)
    group = contributors
    if contributors:
        passed = passed_on(contributors, out, j.lineages)
        for li in contributors - passed:
            j.absorb(li, EXECUTIONS, e)
    else:
        came_in = any(nonfinite_kinds(h) for h in ex.input_health)
        after_gap = came_in and any(g < e for g in gaps)
        passed = {
            j.new(
                EXECUTIONS,
                e,
                ex.step,
                ex.phase,
                ex.wall_time,
                (ex.op_type, ex.stack_frame_ids, ex.module_path),
                came_in,
                after_gap,
            )
        }
    _returned(
        j, ex, group or passed, training, lambda slot, h: passed if nonfinite_kinds(h) else set()
    )


def _call(
    j: _Joint, ex: Execution, run: _Run, read: list[int], contributors: set[int], training: bool
) -> None:
    """A call whose traces were followed: its results carry what reached its outputs."""
    for t in read:
        j.unread.pop(t, None)
    # What the call's values carried: reached an output, else anything inside it (a guard's
    # consumers untraced), else its non-finite arguments.
    pool = run.left or run.inside or contributors
    born: int | None = None
    if ex.health.any_nonfinite and not pool:
        came_in = any(nonfinite_kinds(h) for h in ex.input_health)
        born = j.new(
            EXECUTIONS,
            ex.index,
            ex.step,
            ex.phase,
            ex.wall_time,
            (ex.op_type, ex.stack_frame_ids, ex.module_path),
            came_in,
            False,
        )
        pool = {born}

    def carried(slot: int, h: Health | None) -> set[int]:
        key = (ex.graph_id, slot)
        if h is not None:
            out = j.held[key] = nonfinite_kinds(h)
            found = run.by_health.get(_health_key(h)) if out else None
            if found:
                # The traced value with this output's own counts: what made it.
                j.returns[key] = run.arguments.get(_health_key(h), -1)
                return set(found)
        elif run.inside and j.returns.get(key, -1) >= 0:
            # An argument returned as it was (a mask in a module's state), not summarised
            # in this guarded call: it holds what that argument held.
            arg = j.returns[key]
            ids = ex.input_tensor_ids
            return set(j.bad.get(ids[arg], ())) if arg < len(ids) else set()
        elif run.inside:
            # Not summarised: a guarded call that was not replayed, its guards holding the
            # same pattern of Inf/NaN as a call that was (else it would have been). Its
            # results that are not guards (an argument returned as it was, like a mask in
            # a module's state; a result it also used) hold what they held then.
            out = j.held.get(key, set())
        else:
            out = set()  # no Inf/NaN in the guards: none anywhere in the call
        return passed_on(pool, out, j.lineages) if out else set()

    kept = _returned(j, ex, pool, training, carried, run.left)
    # What the call read or computed and did not return was absorbed inside it.
    for li in (run.inside | contributors) - kept:
        j.absorb(li, EXECUTIONS, ex.index)


def _returned(
    j: _Joint,
    ex: Execution,
    passed: set[int],
    training: bool,
    carried: Callable[[int, Health | None], set[int]],
    computed: set[int] | None = None,
) -> set[int]:
    """Mark the outputs of ``ex`` with the lineages each carries (``carried(slot, health)``,
    chosen among ``passed``); the lineages returned."""
    kept: set[int] = set()
    kinds: dict[int, set[NonFinite]] = {}
    for slot, t in enumerate(ex.output_tensor_ids):
        h = ex.output_health[slot] if slot < len(ex.output_health) else ex.health
        lins = carried(slot, h)
        out = (
            nonfinite_kinds(h)
            if h is not None
            else set().union(*(j.lineages[k].carries for k in lins))
        )
        for li in lins:
            kinds.setdefault(li, set()).update(_explained(j, li, passed, out))
        if t:
            j.producer[t] = ex.index
            if lins:
                j.bad[t] = set(lins)
                j.unread[t] = set(lins)
            else:
                j.bad.pop(t, None)
                j.unread.pop(t, None)
        kept |= lins
    for li in kept:
        j.note(li, EXECUTIONS, ex.index, kinds[li], ex.step, ex.phase == Phase.BACKWARD)
        # A training step that computed them into its results (not an argument it returned
        # as it was, like a mask kept in a module's state) at a step after their birth.
        if training and ex.step > j.lineages[li].birth_step and li in (computed or ()):
            j.lineages[li].reach(LATER_STEP)
    return kept


def _health_key(h: Health) -> tuple[object, ...]:
    return (h.size, h.neg_inf, h.pos_inf, h.nan, h.neg, h.zero, h.pos, h.dtype)


def _explained(j: _Joint, li: int, group: set[int], out: set[NonFinite]) -> set[NonFinite]:
    """What lineage ``li`` carries on out of an output holding ``out``, met there by the
    lineages ``group``: a NaN only if it carried NaN already, or none of them did (then
    the op made it, from their infinities)."""
    lineages = j.lineages
    if (
        NonFinite.NAN in out
        and NonFinite.NAN not in lineages[li].carries
        and any(NonFinite.NAN in lineages[k].carries for k in group)
    ):
        return out - {NonFinite.NAN}
    return out


def _clear(j: _Joint, outputs: tuple[int, ...]) -> None:
    for t in outputs:
        if t:
            j.bad.pop(t, None)
            j.unread.pop(t, None)
