"""Lineages: births of Inf/NaN followed along real data edges, and what became of them.

A *birth* is an event whose output holds Inf/NaN while none of its inputs did
(by the recorded data edges, or by the input summaries recorded with it). Its
*lineage* is every later event that received those values through a data
edge (tensor ids for eager ops, ``producer:slot`` inputs in graphs). Each
lineage is then classified (docs/ROOT_CAUSE.md has the rules and what each
mode can tell):

* ``harmful``: its values reach the loss and the gradients (born in the forward
  pass, seen in the backward pass), a later training step (a parameter or an
  optimizer state kept them), an in-place update inside the optimizer phase,
  or the end of the recording unread (for graphs: a graph output, a variable, or the
  backward pass for values born in the forward pass);
* ``handled``: GradScaler's inf check (``_amp_foreach_non_finite_check_and_unscale_``),
  or in a TensorFlow graph a loss scaler's finiteness check (``analysis/_tf_graphs.py``),
  saw them and nothing harmful followed: the step was skipped;
* ``benign``: every value was absorbed by a later op whose output was finite
  (a softmax, ``where``, a masked reduction), as intended masks are.

Where several lineages meet in one op, a lineage is passed on only if it can
explain the output: NaN is passed on by the lineages that already carried NaN
(when none did, the op made it, from infinities: all are passed on), and
infinities by those that carried infinities.
"""

from __future__ import annotations

import numpy as np

from nanscope.analysis._aliases import is_load, is_row_softmax, is_view
from nanscope.analysis._boundaries import is_jax, joint_lineages
from nanscope.analysis._dataflow import nearest_trace
from nanscope.analysis._explain import short_name
from nanscope.analysis._graph_inputs import CAME_IN, CallInputs, came_in_from, moves_values
from nanscope.analysis._lineage import (
    DECODE_LIMIT,
    END,
    GRADIENTS,
    GRAPH_OUTPUT,
    LATER_STEP,
    LOSS,
    OPTIMIZER_UPDATE,
    VARIABLE,
    Lineage,
    absorbs,
    in_place,
    nonfinite_kinds,
    passed_on,
    reaches_backward,
    verdict_of,
)
from nanscope.analysis._recompute import Recomputations
from nanscope.analysis._tf_graphs import (
    LossScaleChecks,
    consumers_through,
    input_trace,
    is_backward_op,
    writes_variable,
)
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader, Execution
from nanscope.vocabulary import NonFinite, Phase

# Non-finite graph traces followed per process (each costs a few index scans).
TRACE_LIMIT = 500
UNSCALE_OP = "aten._amp_foreach_non_finite_check_and_unscale_"
SEED_OP = "aten.ones_like"

# Re-exported for the callers that find lineages here.
__all__ = ["DECODE_LIMIT", "Lineage", "execution_lineages", "find_lineages", "trace_lineages"]


def _shape_only(op_type: str) -> bool:
    """Ops that read a tensor's shape and dtype but not its values (``ones_like``,
    ``new_zeros``, ``empty_like``): they neither absorb nor pass on Inf/NaN."""
    name = short_name(op_type)
    return name.endswith("_like") or name.startswith(("new_", "empty", "sym_size", "sym_stride"))


def _next_is_backward(reader: DumpReader, order: np.ndarray, i: int) -> bool:
    """Whether the event after ``i`` (in its process) ran in the backward pass."""
    rows = reader.index(EXECUTIONS)
    j = int(np.searchsorted(order, i)) + 1
    return j < len(order) and int(rows["phase"][order[j]]) == Phase.BACKWARD


def _masked_row(ex: Execution, out: set[NonFinite]) -> bool:
    """Whether a softmax made NaN from -inf alone: its inputs held -inf and no +inf or NaN
    (by their recorded summaries), so some row was -inf throughout."""
    if NonFinite.NAN not in out or not is_row_softmax(ex.op_type):
        return False
    held = [h for h in ex.input_health if h is not None and h.any_nonfinite]
    return bool(held) and all(
        h.known and (h.neg_inf or 0) > 0 and not h.pos_inf and not h.nan for h in held
    )


def execution_lineages(reader: DumpReader, process: int) -> tuple[list[Lineage], bool]:
    """The lineages of one process's executions, and whether they were followed to the end
    (False when the decode limit was reached)."""
    rows = reader.index(EXECUTIONS)
    procs = reader.processes_of(EXECUTIONS)
    mine = np.flatnonzero(procs == process)
    flags = rows["nonfinite"][mine]
    hits = np.flatnonzero(flags == 1)
    if not hits.size:
        return [], True
    order = mine[hits[0] :]
    complete = len(order) <= DECODE_LIMIT
    order = order[:DECODE_LIMIT]
    # Where the circular buffer dropped events, after the first Inf/NaN: the event after
    # which each gap opens.
    gaps = [after for p, after, _ in reader.gaps(EXECUTIONS) if p == process and after >= order[0]]
    first_gap, last_gap = (gaps[0], gaps[-1]) if gaps else (-1, -1)
    gap_set = set(gaps)
    lineages: list[Lineage] = []
    bad: dict[int, set[int]] = {}  # tensor id -> lineages whose values it holds
    unread: dict[int, set[int]] = {}  # bad tensor ids no later event has read yet
    # Lineages with values nothing had read yet when events were dropped: what comes after
    # the gap with non-finite inputs but no recorded producer most likely continues them
    # (values already read, like a mask that its softmax absorbed, are not followed).
    alive_at_gap: set[int] = set()
    seen: set[int] = set()  # tensor ids some decoded event produced
    from_graph: set[int] = set()  # non-finite tensor ids that traced graph calls returned
    rerun = Recomputations(reader, process)  # activation checkpointing's recomputed ops
    # Tensors that share a storage (views of one base, and the versions in-place writes
    # give them): tensor id -> the id of the group's first tensor, and its members.
    alias_of: dict[int, int] = {}
    aliases: dict[int, set[int]] = {}

    def storage_of(t: int) -> set[int]:
        return aliases.get(alias_of.get(t, t), {t})

    def join(t: int, base: int) -> None:
        root = alias_of.get(base, base)
        alias_of[t] = root
        aliases.setdefault(root, {root}).add(t)

    previous = -1
    for i in order.tolist():
        if previous in gap_set:
            alive_at_gap = set().union(*unread.values()) if unread else set()
        previous = i
        try:
            ex = reader.execution(i)
        except UNREADABLE:
            continue
        if is_view(ex.op_type) and ex.input_tensor_ids and ex.input_tensor_ids[0]:
            # A view moves no value: its outputs hold what its input holds, and share its
            # storage (a write into one is a write into all).
            base = ex.input_tensor_ids[0]
            for t in ex.output_tensor_ids:
                if not t:
                    continue
                seen.add(t)
                join(t, base)
                if bad.get(base):
                    bad[t] = set(bad[base])
                else:
                    bad.pop(t, None)
                if base in from_graph:
                    from_graph.add(t)  # a traced graph's output (a gradient it returned)
                unread.pop(t, None)
            continue
        if _shape_only(ex.op_type):
            # ones_like(loss) seeds loss.backward(): the values it was given are the loss.
            if ex.op_type.startswith(SEED_OP) and _next_is_backward(reader, order, i):
                for t in ex.input_tensor_ids:
                    for li in bad.get(t, ()):
                        lineages[li].reach(LOSS)
                        unread.pop(t, None)
            for t in ex.output_tensor_ids:
                bad.pop(t, None)
                unread.pop(t, None)
                seen.add(t)
            continue
        contributors: set[int] = set()
        read = [t for t in ex.input_tensor_ids if bad.get(t)]
        for t in read:
            contributors |= bad[t]
        # Values read through any view of a storage are read: the storage's are.
        read = list({a for t in read for a in storage_of(t)})
        if ex.op_type.startswith(UNSCALE_OP):
            for li in contributors:
                lin = lineages[li]
                if lin.handled_at is None:
                    lin.handled_at = i
        if not ex.health.any_nonfinite:
            # Only an op that turns the values into finite numbers absorbs them; a check
            # (isnan, eq, .item(): booleans, integers, Python numbers) leaves them as they were.
            if absorbs(ex):
                for t in read:
                    unread.pop(t, None)
                for li in contributors:
                    if lineages[li].absorbed_at is None:
                        lineages[li].absorbed_at = i
            for t in ex.output_tensor_ids:
                bad.pop(t, None)
                unread.pop(t, None)
                seen.add(t)
            continue
        for t in read:
            unread.pop(t, None)
        out = nonfinite_kinds(ex.health)
        # The inputs' own summaries (recorded with every op that made Inf/NaN) tell
        # whether non-finite values came in, even when their producer is not in the dump.
        # (Python numbers, id 0, are part of the op: ``full(-inf)`` is a birth.)
        # (input_health is empty where the inputs' summaries were not recorded.)
        came_in = any(
            nonfinite_kinds(h)
            for t, h in zip(ex.input_tensor_ids, ex.input_health, strict=False)
            if t
        )
        # An in-place op's written input has no summary of its own (the op overwrote it):
        # after dropped events, an unknown producer may have put Inf/NaN there.
        if not came_in and 0 <= first_gap < i and in_place(ex.op_type):
            came_in = any(t and t not in seen for t in ex.input_tensor_ids)
        if not contributors and came_in and alive_at_gap:
            contributors = set(alive_at_gap)
        if not contributors and came_in and ex.collective is not None and bad:
            # What a rank sends in a collective was gathered into a buffer of its own
            # (DDP's gradient buckets), by copies into views that leave no data edge:
            # the values came from the lineages this rank holds now.
            contributors = set().union(*bad.values())
        if contributors and _masked_row(ex, out):
            # A softmax over a row that its mask filled with -inf alone (a sequence with no
            # unmasked position) makes 0/0 = NaN: that NaN is born here; the mask's -inf
            # is intended, and ends here as it does in every other row.
            for li in contributors:
                if lineages[li].absorbed_at is None:
                    lineages[li].absorbed_at = i
            contributors = set()
            came_in = False
        if contributors:
            passed = passed_on(contributors, out, lineages)
            for li in contributors - passed:
                if lineages[li].absorbed_at is None:
                    lineages[li].absorbed_at = i
        elif _traced_graph(reader, ex, process) or any(
            t in from_graph for t in ex.input_tensor_ids
        ):
            # A graph call whose values inside were traced: its Inf/NaN were born in there,
            # in the lineages of its traces (trace_lineages), not at the call; and so were
            # the Inf/NaN that later ops read from what it returned.
            passed = set()
            from_graph.update(t for t in ex.output_tensor_ids if t)
        elif (again := rerun.repeats(ex)) is not None:
            # A checkpointed function's rerun in the backward pass: the forward birth again.
            lineages[again].recomputed.append(i)
            passed = {again}
        else:
            lineages.append(
                Lineage(
                    EXECUTIONS,
                    process,
                    i,
                    ex.step,
                    Phase.FORWARD if rerun.recomputed(ex) else ex.phase,
                    ex.wall_time,
                    (ex.op_type, ex.stack_frame_ids, ex.module_path),
                    came_in,
                    after_gap=came_in and 0 <= first_gap < i,
                )
            )
            passed = {len(lineages) - 1}
            rerun.born(ex, len(lineages) - 1)
        phase = Phase.FORWARD if rerun.recomputed(ex) else ex.phase  # a rerun is forward work
        for li in passed:
            _note_member(lineages[li], ex, out, phase)
        writes = in_place(ex.op_type)
        for slot, t in enumerate(ex.output_tensor_ids):
            seen.add(t)
            h = ex.output_health[slot] if slot < len(ex.output_health) else ex.health
            written = ex.input_tensor_ids[slot] if writes and slot < len(ex.input_tensor_ids) else 0
            if t and written:
                join(t, written)  # the written tensor's new version shares its storage
            if t and nonfinite_kinds(h):
                bad[t] = set(passed)
                unread[t] = set(passed)
                if written:
                    # A write into a view is a write into its base and every other view.
                    for a in storage_of(t) - {t}:
                        bad[a] = bad.get(a, set()) | set(passed)
            elif t:
                bad.pop(t, None)
                unread.pop(t, None)
    # Values nothing read by the end of the recording, unless events after the lineage's
    # last one were dropped (what read them may have been evicted) or not decoded. Only a
    # lineage that nothing ever absorbed, and that was computed here, counts: that is the
    # program that stopped right after the birth. Values that every reader so far absorbed
    # and that are still held (a cached mask, a buffer), or that were loaded (``torch.load``,
    # ``load_state_dict``: values brought in, not made), are not harm for being held.
    for held in unread.values():
        for li in held:
            lin = lineages[li]
            if lin.absorbed_at is not None or (lin.signature and is_load(str(lin.signature[0]))):
                continue
            if complete and lin.members[-1] > last_gap:
                lin.reach(END)
    for lin in lineages:
        lin.verdict = verdict_of(lin)
    return lineages, complete


def _traced_graph(reader: DumpReader, ex: Execution, process: int) -> bool:
    """Whether ``ex`` is a call of a graph whose ops' outputs were traced."""
    if not ex.graph_id:
        return False
    graph = reader.graph(ex.graph_id, process)
    return graph is not None and bool(graph.ops)


def _note_member(
    lin: Lineage, ex: Execution, out: set[NonFinite], phase: int | None = None
) -> None:
    lin.add(ex.index, out)
    phase = ex.phase if phase is None else phase
    if reaches_backward(lin) and phase == Phase.BACKWARD:
        lin.reach(GRADIENTS)
    # Values held into a later step are harm only where they are held: a parameter or an
    # optimizer state (written in place in the optimizer step, below), not a cached mask.
    if ex.phase == Phase.OPTIMIZER and in_place(ex.op_type) and lin.handled_at is None:
        lin.reach(OPTIMIZER_UPDATE)


def trace_lineages(reader: DumpReader, process: int) -> list[Lineage]:
    """Lineages of one process's graph traces, along the graphs' ``producer:slot`` edges.

    A lineage that reaches a graph output (an op nothing in the graph consumes) or a
    variable (an op that writes one: a parameter, an optimizer state, a metric) is
    harmful: it leaves the graph (as a loss, a gradient or an update); so is one born
    in the forward pass that reaches the backward pass (the loss and the gradients).
    One whose every value meets a consumer with a finite output is benign. One that a
    loss scaler's finiteness check read (``IsFinite`` into the predicate of the ``If``
    that applies the gradients only when all are finite) and that went nowhere else
    was handled: that update was skipped (``analysis/_tf_graphs.py``).
    """
    rows = reader.index(TRACES)
    procs = reader.processes_of(TRACES)
    hits = np.flatnonzero((rows["nonfinite"] == 1) & (procs == process))[:TRACE_LIMIT]
    lineages: list[Lineage] = []
    member_of: dict[int, set[int]] = {}  # trace index -> lineages
    # (graph id, resource) -> lineages whose values a graph op wrote into that variable.
    written: dict[tuple[str, str], set[int]] = {}
    scaler = LossScaleChecks(reader, process)
    came_in = -1  # the lineage of values that came in through graph inputs, linked to none
    call_inputs = CallInputs(reader, process)  # what graph calls' inputs held, where recorded
    dropped = _Dropped(reader, process)
    # Lineage -> (trace, graph, op, output slot) of each member whose consumer's trace
    # was dropped.
    lost: dict[int, list[tuple[int, str, str, int]]] = {}
    for i in hits.tolist():
        try:
            tr = reader.trace(i)
        except UNREADABLE:
            continue
        graph = reader.graph(tr.graph_id, process)
        op = graph.ops.get(tr.op_name) if graph else None
        contributors: set[int] = set()
        if op is not None and graph is not None:
            for src, slot in op.inputs:
                j = input_trace(reader, process, graph, src, slot, i - 1)
                # Across dropped traces the trace found may be an earlier call's: its
                # lineage is not this call's (the input's values here were not recorded).
                if j is not None and not dropped.between(j, i):
                    contributors |= member_of.get(j, set())
        out = nonfinite_kinds(tr.health)
        if not contributors and op is not None and op.op_type == "ReadVariableOp" and op.inputs:
            # A variable that a graph op of this graph wrote Inf/NaN into (in this call or
            # an earlier one): the values read back are that lineage's.
            contributors = set(written.get((tr.graph_id, op.inputs[0][0]), ()))
        if not contributors and op is not None and op.op_type == "Placeholder" and not op.inputs:
            # A graph argument holding Inf/NaN that an earlier graph call returned (a
            # parameter a training step updated): that lineage goes on, into a later call.
            left = [k for k, lin in enumerate(lineages) if _left_graph(lin) and lin.birth < i]
            if left:
                contributors = {left[-1]}
                if tr.step > lineages[left[-1]].birth_step:
                    lineages[left[-1]].reach(LATER_STEP)
        if (
            not contributors
            and op is not None
            and graph is not None
            and (moves_values(op.op_type) or call_inputs.came_in(graph, op, tr))
        ):
            # Moving or selecting values makes none: they came in through the graph's
            # inputs, which are not traced (analysis/_graph_inputs.py).
            k = came_in_from(lineages, i, _left_graph)
            if k is None:
                if came_in < 0:
                    lineages.append(
                        Lineage(
                            TRACES,
                            process,
                            i,
                            tr.step,
                            Phase.FORWARD,
                            tr.wall_time,
                            (CAME_IN,),
                            entered=True,
                        )
                    )
                    came_in = len(lineages) - 1
                k = came_in
            elif tr.step > lineages[k].birth_step:
                lineages[k].reach(LATER_STEP)
            contributors = {k}
        if contributors:
            passed = passed_on(contributors, out, lineages)
        else:
            phase = Phase.BACKWARD if is_backward_op(tr.op_name) else Phase.FORWARD
            lineages.append(
                Lineage(TRACES, process, i, tr.step, phase, tr.wall_time, (tr.graph_id, tr.op_name))
            )
            passed = {len(lineages) - 1}
        member_of[i] = passed
        for li in passed:
            lineages[li].add(i, out)
            if lineages[li].birth_phase == Phase.FORWARD and is_backward_op(tr.op_name):
                lineages[li].reach(GRADIENTS)
        consumers, leaves = (
            consumers_through(graph, tr.op_name, tr.output_slot) if graph else ([], False)
        )
        if op is None or graph is None or not consumers or leaves:
            for li in passed:
                lineages[li].reach(GRAPH_OUTPUT)
        if op is None or graph is None:
            continue
        for dst, in_slot in consumers:
            dst_op = graph.ops.get(dst)
            if dst_op is not None:
                if scaler.is_check(graph, dst):
                    # The loss scaler's finiteness check: it skips the update these are in.
                    for cond in scaler.checks(graph, tr.op_name, tr.output_slot):
                        skip = scaler.skip_run(graph, cond, tr.op_name, tr.output_slot, i)
                        for li in passed:
                            if lineages[li].handled_at is None:
                                lineages[li].handled_at = skip if skip >= 0 else i
                    continue
                if dst_op.op_type in ("If", "StatelessIf") and scaler.guards(
                    graph, dst, tr.op_name, tr.output_slot
                ):
                    continue  # handed to the applying branch only if finite
                if writes_variable(dst_op.op_type) and in_slot > 0:
                    for li in passed:
                        lineages[li].reach(VARIABLE)
                    if dst_op.inputs:
                        written.setdefault((tr.graph_id, dst_op.inputs[0][0]), set()).update(passed)
                    continue
            j = nearest_trace(reader, process, tr.graph_id, dst, None, i, later=True)
            if dropped.between(i, j):
                # The consumer's trace of this call may be among the dropped events (the one
                # found, if any, is a later call's): what it made of the values is unknown.
                for li in passed:
                    lost.setdefault(li, []).append((i, tr.graph_id, tr.op_name, tr.output_slot))
                continue
            if j is None or rows["nonfinite"][j] == 1:
                continue
            for li in passed:
                if lineages[li].absorbed_at is None:
                    lineages[li].absorbed_at = j
    for li, points in lost.items():
        # The graph may still tell: values that can only meet the loss scaler's checks did
        # no harm, whatever the dropped traces held.
        lin = lineages[li]
        for at, graph_id, name, slot in points:
            graph = reader.graph(graph_id, process)
            if graph is not None and scaler.contains(graph, name, slot):
                if lin.handled_at is None:
                    lin.handled_at = at
            else:
                lin.lost.append(at)
    for lin in lineages:
        if lin.absorbed_at is None and not lin.reaches and lin.handled_at is None and not lin.lost:
            lin.reach(GRAPH_OUTPUT)
        lin.verdict = verdict_of(lin)
    return lineages


class _Dropped:
    """Where a circular buffer dropped one process's graph traces, for following lineages
    across them: a consumer's trace or an input's trace of the same graph call may be
    among the dropped ones."""

    def __init__(self, reader: DumpReader, process: int) -> None:
        # Each gap opens after this trace (the reader gives them in index order): the
        # dropped traces came between it and the next.
        self.gaps = np.array(
            [after for p, after, _ in reader.gaps(TRACES) if p == process], dtype=np.int64
        )

    def between(self, i: int, j: int | None) -> bool:
        """Whether traces were dropped after trace ``i`` and before trace ``j`` (before
        the end when ``j`` is None)."""
        if not self.gaps.size:
            return False
        k = int(np.searchsorted(self.gaps, i, side="left"))  # the first gap at or after i
        return k < self.gaps.size and (j is None or int(self.gaps[k]) < j)


def _left_graph(lin: Lineage) -> bool:
    """Whether a graph lineage's values left their graph: returned, or kept in a variable."""
    return GRAPH_OUTPUT in lin.reaches or VARIABLE in lin.reaches


def find_lineages(reader: DumpReader, skip: set[int] | None = None) -> tuple[list[Lineage], bool]:
    """Every lineage of the dump (but those of the processes in ``skip``), births in order of
    wall time, and whether all were followed to the end."""
    out: list[Lineage] = []
    complete = True
    for p in range(len(reader.processes)):
        if skip and p in skip:
            continue
        if is_jax(reader, p):
            # Eager ops and jitted calls are one data flow (analysis/_boundaries.py).
            lins, done = joint_lineages(reader, p)
            out.extend(lins)
            complete &= done
            continue
        lins, done = execution_lineages(reader, p)
        out.extend(lins)
        complete &= done
        out.extend(trace_lineages(reader, p))
    out.sort(key=lambda lin: (lin.wall_time, lin.kind, lin.birth))
    return out, complete
