"""Across ranks: where an Inf/NaN was born, told by the collectives that carried it, not by clocks.

A rank's values reach another rank only through a collective or a send and its
receive. nanscope records each such operation with its group and its number in
the group's order (``Execution.collective``), and the values each rank put into
it (its input summaries, taken before it ran). So for every rank whose Inf/NaN
arrived from outside, the report can name the operation that brought them and
the ranks that sent them; the rank left, whose Inf/NaN nothing brought, is where
it was born. Wall clocks are used only where no operation orders two births (two
ranks went bad between the same collectives), after aligning them on the
collectives the ranks shared, and the report says so.

Only the index and a few records per rank are read: the rank's first alerts, the
first collective that held Inf/NaN, and that collective's copy on the other ranks
(found by a search over each rank's distributed operations); docs/SCALE.md has
the figures. Rules and limits are in docs/ROOT_CAUSE.md, "Many ranks".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.analysis import _notes as note
from nanscope.analysis._notes import RankNote
from nanscope.format.collectives import OP_PREFIXES
from nanscope.format.health import Health
from nanscope.reader import EXECUTIONS, UNREADABLE, Collective, DumpReader, EventRef
from nanscope.vocabulary import RankDecision, RankRole

# Records decoded while searching one rank for one operation, and around a birth.
SEARCH_LIMIT = 64
NEAR_LIMIT = 16


@dataclass(frozen=True)
class OpCopy:
    """One rank's copy of a distributed operation: where it is and what went in and out."""

    process: int
    index: int  # the execution's index
    collective: Collective
    wall_time: float
    step: int
    op_type: str
    sent: bool | None  # this rank's input held Inf/NaN (None: not recorded)
    came_out: bool  # its output held Inf/NaN
    tensors: tuple[int, ...] = ()  # its input tensor ids (a receive: the tensor it writes)

    @property
    def key(self) -> tuple[str, str, int]:
        """What names the operation on every member (a send and a receive also need their peers)."""
        return (self.collective.group, self.collective.kind, self.collective.sequence)

    def to_json(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "index": self.index,
            "op_type": self.op_type,
            "step": self.step,
            "wall_time": self.wall_time,
            "sent_nonfinite": self.sent,
            "collective": self.collective.to_json(),
        }


@dataclass
class RankState:
    """One process in the cross-rank verdict."""

    process: int
    rank: int | None
    label: str
    first: EventRef | None  # its first Inf/NaN (any kind)
    first_nan: EventRef | None
    first_op: str = ""  # the first Inf/NaN's op type and step
    first_step: int | None = None
    role: RankRole = RankRole.CLEAN
    via: OpCopy | None = None  # received: its copy of the operation that brought it
    source: OpCopy | None = None  # received: the (first) sender's copy of that operation
    senders: list[int] = field(default_factory=list)  # received: the processes that sent it
    birth: EventRef | None = None  # born: the event it was born at
    clock_offset: float | None = None  # seconds to add to its wall times (the origin's clock)

    def aligned(self, wall_time: float) -> float | None:
        return None if self.clock_offset is None else wall_time + self.clock_offset

    def to_json(self) -> dict[str, Any]:
        def ref(r: EventRef | None) -> dict[str, Any] | None:
            if r is None:
                return None
            return {
                "kind": r.kind,
                "index": r.index,
                "wall_time": r.wall_time,
                "aligned_time": self.aligned(r.wall_time),
            }

        return {
            "process": self.process,
            "rank": self.rank,
            "label": self.label,
            "role": self.role,
            "first": ref(self.first),
            "first_op": self.first_op,
            "first_step": self.first_step,
            "first_nan": ref(self.first_nan),
            "birth": ref(self.birth),
            "via": self.via.to_json() if self.via else None,
            "senders": self.senders,
            "clock_offset": self.clock_offset,
        }


@dataclass
class RankVerdict:
    """Where the Inf/NaN of a many-process dump was born, and how it spread."""

    origin_process: int | None
    origin: EventRef | None  # the origin rank's first Inf/NaN
    decided_by: RankDecision
    states: list[RankState]
    # The operation that first carried it off the origin's rank: each rank's copy, and
    # the processes it brought Inf/NaN to.
    spread: list[OpCopy] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)
    notes: list[RankNote] = field(default_factory=list)  # worded by the reporters

    @property
    def received(self) -> set[tuple[int, int]]:
        """(process, execution index) of the operations through which ranks received it."""
        return {(s.process, s.via.index) for s in self.states if s.via is not None}

    def to_json(self) -> dict[str, Any]:
        """The verdict's facts; the JSON report adds its ``notes``, worded
        (``nanscope.report``)."""
        spread = None
        if self.spread:
            first = self.spread[0]
            reached = self.reached
            spread = {
                "collective": first.collective.to_json(),
                "op_type": first.op_type,
                "step": first.step,
                "copies": [c.to_json() for c in self.spread],
                "from": [c.process for c in self.spread if c.sent],
                "reached": reached,
            }
        return {
            "origin_process": self.origin_process,
            "origin": None
            if self.origin is None
            else {"kind": self.origin.kind, "index": self.origin.index},
            "decided_by": self.decided_by,
            "spread": spread,
            "processes": [s.to_json() for s in self.states],
        }


def _any(healths: tuple[Health | None, ...]) -> bool | None:
    known = [h for h in healths if h is not None]
    return any(h.any_nonfinite for h in known) if known else None


class _Ops:
    """Each process's distributed operations, found in the index and decoded on demand."""

    def __init__(self, reader: DumpReader) -> None:
        self.reader = reader
        rows = reader.index(EXECUTIONS)
        procs = reader.processes_of(EXECUTIONS)
        ids = reader.string_ids(OP_PREFIXES)
        where = np.flatnonzero(np.isin(rows["name"], ids)) if ids.size else np.zeros(0, np.int64)
        self.rows = where
        # The index holds each process's events together: one slice of `where` per process.
        self.bounds: dict[int, tuple[int, int]] = {}
        if where.size:
            owners = procs[where]
            change = np.flatnonzero(np.diff(owners)) + 1
            starts = np.concatenate([[0], change])
            ends = np.concatenate([change, [where.size]])
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
                self.bounds[int(owners[s])] = (s, e)
        self.nonfinite = rows["nonfinite"][where] == 1 if where.size else np.zeros(0, bool)
        self._cache: dict[int, OpCopy | None] = {}

    def of(self, process: int) -> np.ndarray:
        s, e = self.bounds.get(process, (0, 0))
        return self.rows[s:e]

    def copy(self, process: int, index: int) -> OpCopy | None:
        """Execution ``index`` as a distributed operation (None: untagged or unreadable)."""
        if index in self._cache:
            return self._cache[index]
        op: OpCopy | None = None
        try:
            ex = self.reader.execution(index)
        except UNREADABLE:
            ex = None
        if ex is not None and ex.collective is not None:
            # A receive's input is the buffer it writes into (torch.empty: garbage, NaN at
            # times), not anything this rank sent.
            sent = _any(ex.input_health) if ex.collective.kind != "recv" else None
            op = OpCopy(
                process,
                index,
                ex.collective,
                ex.wall_time,
                ex.step,
                ex.op_type,
                sent,
                bool(ex.health.any_nonfinite),
                ex.input_tensor_ids,
            )
        self._cache[index] = op
        return op

    def first_nonfinite(self, process: int) -> OpCopy | None:
        """The process's first distributed operation whose output held Inf/NaN."""
        s, e = self.bounds.get(process, (0, 0))
        hits = np.flatnonzero(self.nonfinite[s:e])
        for h in hits[:NEAR_LIMIT].tolist():
            op = self.copy(process, int(self.rows[s + h]))
            if op is not None and op.collective.kind == "collective":
                return op
        return None

    def find(self, process: int, key: tuple[str, str, int], near: int | None) -> OpCopy | None:
        """The process's copy of the operation ``key`` (group, kind, sequence), by a search
        over its operations (each group's are numbered in order), starting near
        position ``near`` among them."""
        mine = self.of(process)
        if not mine.size:
            return None
        group, kind, seq = key
        lo, hi = 0, len(mine) - 1
        guess = min(max(near if near is not None else len(mine) // 2, lo), hi)
        decoded = 0
        while lo <= hi and decoded < SEARCH_LIMIT:
            # From the guess, the nearest operation of the same group and kind.
            j, op = guess, None
            while j <= hi and decoded < SEARCH_LIMIT:
                decoded += 1
                cand = self.copy(process, int(mine[j]))
                if cand is not None and (cand.collective.group, cand.collective.kind) == (
                    group,
                    kind,
                ):
                    op = cand
                    break
                j += 1
            if op is None:
                # Nothing of the group to the right of the guess: search the left half.
                hi = guess - 1
                guess = (lo + hi) // 2
                continue
            if op.collective.sequence == seq:
                return op
            if op.collective.sequence < seq:
                lo = j + 1
            else:
                hi = guess - 1
            guess = (lo + hi) // 2
        return None

    def find_send(self, process: int, to_rank: int | None, seq: int, group: str) -> OpCopy | None:
        """The process's send numbered ``seq`` to ``to_rank`` in ``group``."""
        for i in self.of(process)[: SEARCH_LIMIT * 64].tolist():
            op = self.copy(process, int(i))
            c = op.collective if op else None
            if (
                c
                and c.kind == "send"
                and c.group == group
                and c.peer == to_rank
                and c.sequence == seq
            ):
                return op
        return None

    def position(self, process: int, index: int) -> int:
        return int(np.searchsorted(self.of(process), index))

    def near(self, process: int, index: int, after: bool) -> OpCopy | None:
        """The process's first collective after ``index`` (or the last at or before it)."""
        mine = self.of(process)
        pos = int(np.searchsorted(mine, index, side="right"))
        order = (
            range(pos, min(len(mine), pos + NEAR_LIMIT))
            if after
            else range(pos - 1, max(-1, pos - 1 - NEAR_LIMIT), -1)
        )
        for j in order:
            op = self.copy(process, int(mine[j]))
            if op is not None and op.collective.kind == "collective":
                return op
        return None


class _Copies:
    """Every rank's copy of a collective, found once per collective."""

    def __init__(self, ops: _Ops, processes: list[int]) -> None:
        self.ops = ops
        self.processes = processes
        self._found: dict[tuple[str, str, int], dict[int, OpCopy]] = {}

    def _of(self, op: OpCopy) -> dict[int, OpCopy]:
        got = self._found.get(op.key)
        if got is None:
            near = self.ops.position(op.process, op.index)
            got = {op.process: op}
            for p in self.processes:
                if p != op.process:
                    c = self.ops.find(p, op.key, near)
                    if c is not None:
                        got[p] = c
            got = dict(sorted(got.items()))
            self._found[op.key] = got
        return got

    def all(self, op: OpCopy) -> list[OpCopy]:
        """Every rank's copy of ``op``, by process."""
        return list(self._of(op).values())

    def on(self, op: OpCopy, process: int) -> OpCopy | None:
        """Process ``process``'s copy of ``op``."""
        return self._of(op).get(process)


def _birth(reader: DumpReader, ops: _Ops, mark: EventRef) -> EventRef:
    """Where a rank that went bad on its own did: its first Inf/NaN since the last collective
    before ``mark`` (its first NaN). A NaN often first shows in the collective the rank sent
    -inf into, or a step after a benign mask's -inf: the window keeps the birth and leaves
    the masks of earlier steps out."""
    if mark.kind != EXECUTIONS:
        return mark
    mine = ops.of(mark.process)
    pos = int(np.searchsorted(mine, mark.index, side="left"))
    start = int(mine[pos - 1]) + 1 if pos > 0 else None
    rows = reader.index(EXECUTIONS)
    procs = reader.processes_of(EXECUTIONS)
    if start is None:  # no collective before it: from the process's first event (the merged
        # index holds each process's events together, in process order)
        start = int(np.searchsorted(procs, mark.process))
    window = np.flatnonzero(rows["nonfinite"][start : mark.index + 1] == 1)
    if not window.size:
        return mark
    i = start + int(window[0])
    return EventRef(EXECUTIONS, i, mark.process, float(rows["wall_time"][i]))


def _not_after(op: OpCopy, mark: EventRef) -> bool:
    """Whether the operation ran no later than the event ``mark`` of the same process."""
    if mark.kind == EXECUTIONS:
        return op.index <= mark.index
    return op.wall_time <= mark.wall_time  # a graph trace: the process's own clock orders them


def _received_by_recv(reader: DumpReader, ops: _Ops, first: EventRef) -> OpCopy | None:
    """The receive that wrote Inf/NaN the event ``first`` read, if one did."""
    if first.kind != EXECUTIONS:
        return None
    try:
        ex = reader.execution(first.index)
    except UNREADABLE:
        return None
    bad_inputs = {
        t
        for t, h in zip(ex.input_tensor_ids, ex.input_health, strict=False)
        if t and h is not None and h.any_nonfinite
    }
    if not bad_inputs:
        return None
    mine = ops.of(first.process)
    pos = int(np.searchsorted(mine, first.index))
    for j in range(pos - 1, max(-1, pos - 1 - SEARCH_LIMIT), -1):
        op = ops.copy(first.process, int(mine[j]))
        if op is not None and op.collective.kind == "recv" and bad_inputs.intersection(op.tensors):
            return op
    return None


def analyze_ranks(reader: DumpReader) -> RankVerdict | None:
    """The cross-rank verdict of a dump written by several processes (None for one process,
    or when none had Inf/NaN)."""
    processes = reader.processes
    if len(processes) < 2:
        return None
    firsts = reader.first_by_process("nonfinite")
    if not firsts:
        return None
    nans = reader.first_by_process("nan")
    by_rank = {p.rank: p.index for p in processes if p.rank is not None}
    ops = _Ops(reader)
    states = [
        RankState(p.index, p.rank, p.label, firsts.get(p.index), nans.get(p.index))
        for p in processes
    ]
    for s in states:
        if s.first is not None:
            row = reader.index_json(s.first.kind, s.first.index)  # the index alone
            s.first_op, s.first_step = row["op_type"], row["step"]
    notes: list[RankNote] = []
    copies = _Copies(ops, [st.process for st in states])

    # 1. Who received their Inf/NaN, and from whom.
    for s in states:
        if s.first is None:
            continue
        # Its first NaN (else its first Inf/NaN): values a benign mask made earlier
        # never cross ranks, so they do not decide where harmful values came from.
        mark = s.first_nan or s.first
        entry = ops.first_nonfinite(s.process)
        # The first collective that gave it Inf/NaN, where its own contribution was finite.
        if entry is not None and _not_after(entry, mark) and not entry.sent:
            senders = [c for c in copies.all(entry) if c.process != s.process and c.sent]
            if senders:
                s.role, s.via, s.senders = RankRole.RECEIVED, entry, [c.process for c in senders]
                s.source = senders[0]
                continue
        recv = _received_by_recv(reader, ops, mark)
        if recv is not None:
            peer = by_rank.get(recv.collective.peer) if recv.collective.peer is not None else None
            send = (
                ops.find_send(peer, s.rank, recv.collective.sequence, recv.collective.group)
                if peer is not None
                else None
            )
            if send is not None and send.sent:
                s.role, s.via, s.senders, s.source = RankRole.RECEIVED, recv, [send.process], send
                continue
        s.role, s.birth = RankRole.BORN, _birth(reader, ops, mark)

    born = [s for s in states if s.role == RankRole.BORN]
    _received_by_order(ops, born, copies)
    born = [s for s in states if s.role == RankRole.BORN]
    received = [s for s in states if s.role == RankRole.RECEIVED]
    if not born:
        # Every rank received from another: a cycle only damaged or partial records make.
        notes.append(note.NoRankBorn())
        born = [s for s in states if s.first is not None]
        for s in born:
            s.birth = s.first_nan or s.first
    # 2. Among ranks that went bad on their own, the earliest by the collectives' order.
    origin, decided_by = _earliest(reader, ops, born, copies, notes)
    if len(born) == 1 and not received:
        decided_by = RankDecision.SINGLE
    for s in born:
        if s is not origin:
            s.role = RankRole.BORN
    origin.role = RankRole.ORIGIN
    # 3. Clocks aligned on the origin's, by the operations each rank shares with it.
    _align(ops, states, origin, copies)
    spread, reached = _spread(origin, received, copies)
    return RankVerdict(
        reached=reached,
        origin_process=origin.process,
        origin=origin.first if origin.first is not None else origin.birth,
        decided_by=decided_by,
        states=states,
        spread=spread,
        notes=notes,
    )


def _received_by_order(ops: _Ops, born: list[RankState], copies: _Copies) -> None:
    """Ranks whose Inf/NaN first showed in a collective that another rank joined already
    holding Inf/NaN received it there, when what the ranks put in was not recorded (dumps
    of older nanscope versions): the collectives' order tells it without the inputs."""
    at: dict[tuple[str, str, int], tuple[OpCopy, list[RankState]]] = {}
    for s in born:
        if s.birth is None or s.birth.kind != EXECUTIONS:
            continue
        op = ops.copy(s.process, s.birth.index)
        if op is not None and op.collective.kind == "collective" and op.sent is None:
            at.setdefault(op.key, (op, []))[1].append(s)
    for op, members in at.values():
        # Those that went bad before their own copy of the collective put Inf/NaN in.
        senders = []
        for other in born:
            theirs = copies.on(op, other.process)
            bad = other.birth
            if bad is not None and bad.kind == EXECUTIONS and theirs and bad.index < theirs.index:
                senders.append(theirs)
        if not senders:
            continue
        for s in members:
            assert s.birth is not None
            s.role, s.via, s.birth = RankRole.RECEIVED, ops.copy(s.process, s.birth.index), None
            s.senders, s.source = [c.process for c in senders], senders[0]


def _earliest(
    reader: DumpReader, ops: _Ops, born: list[RankState], copies: _Copies, notes: list[RankNote]
) -> tuple[RankState, RankDecision]:
    """The first of several births: one that a collective orders before every other, else
    the earliest by aligned clocks among those no collective orders."""
    if len(born) == 1:
        return born[0], RankDecision.COLLECTIVE
    births = {s.birth.index for s in born if s.birth is not None and s.birth.kind == EXECUTIONS}
    entries = [ops.copy(s.process, s.birth.index) for s in born if s.birth is not None]
    if len(births) == len(born) and all(e is not None for e in entries):
        keys = {e.key for e in entries if e is not None}
        if len(keys) == 1 and not any(e.sent for e in entries if e is not None):
            # Finite in, Inf/NaN out on every rank: the collective itself made it (a sum
            # that overflowed its dtype). Every rank's copy is a birth; the lowest rank is named.
            lowest = min(born, key=lambda s: (s.rank is None, s.rank or 0, s.process))
            label = next(e.collective.label for e in entries if e is not None)
            notes.append(note.CollectiveMadeIt(label))
            return lowest, RankDecision.COLLECTIVE
    after = {s.process: ops.near(s.process, s.birth.index, after=True) for s in born if s.birth}
    before = {s.process: ops.near(s.process, s.birth.index, after=False) for s in born if s.birth}

    def precedes(a: RankState, b: RankState) -> bool:
        na, pb = after.get(a.process), before.get(b.process)
        return (
            na is not None
            and pb is not None
            and na.collective.group == pb.collective.group
            and na.collective.sequence <= pb.collective.sequence
        )

    earliest = [b for b in born if not any(precedes(a, b) for a in born if a is not b)]
    if len(earliest) == 1:
        return earliest[0], RankDecision.COLLECTIVE
    # Concurrent: the same collectives on either side. Their clocks, aligned on the
    # next collective they shared.
    ref = earliest[0]
    offsets: dict[int, float | None] = {ref.process: 0.0}
    ref_next = after.get(ref.process)
    for s in earliest[1:]:
        offsets[s.process] = None
        if ref_next is not None:
            mine = copies.on(ref_next, s.process)
            if mine is not None:
                offsets[s.process] = ref_next.wall_time - mine.wall_time

    def when(s: RankState) -> float:
        off = offsets.get(s.process)
        assert s.birth is not None
        return s.birth.wall_time + (off or 0.0)

    earliest.sort(key=when)
    aligned = all(offsets.get(s.process) is not None for s in earliest)
    notes.append(note.BornByClock(tuple(s.label for s in earliest), aligned))
    return earliest[0], RankDecision.CLOCK


def _align(ops: _Ops, states: list[RankState], origin: RankState, copies: _Copies) -> None:
    """Each rank's clock offset to the origin's, from one operation both took part in (the
    one it received through, else the first collective after the origin's birth)."""
    origin.clock_offset = 0.0
    anchor_at = origin.birth or origin.first
    anchor = ops.near(origin.process, anchor_at.index, after=True) if anchor_at else None
    shared = {c.process: c for c in copies.all(anchor)} if anchor is not None else {}
    for s in states:
        if s is origin:
            continue
        mine, theirs = None, None
        if s.via is not None and s.source is not None and s.source.process == origin.process:
            mine, theirs = s.via, s.source
        elif s.via is not None and s.via.collective.kind == "collective":
            mine = s.via
            theirs = copies.on(mine, origin.process)
        if theirs is None and s.process in shared:
            mine, theirs = shared[s.process], anchor
        if mine is not None and theirs is not None:
            # A collective ends at about the same moment on every member (a receive, soon
            # after its send).
            s.clock_offset = theirs.wall_time - mine.wall_time


def _spread(
    origin: RankState, received: list[RankState], copies: _Copies
) -> tuple[list[OpCopy], list[int]]:
    """Every rank's copy of the first operation that carried the origin's values away, and
    the processes it brought them to."""
    direct = [s for s in received if s.via is not None and origin.process in s.senders]
    if not direct:
        return [], []
    first = min(direct, key=lambda s: (s.via.step, s.via.wall_time + (s.clock_offset or 0.0)))  # type: ignore[union-attr]
    via = first.via
    assert via is not None
    if via.collective.kind != "collective":
        return [c for c in (first.source, via) if c is not None], [first.process]
    reached = [s.process for s in direct if s.via is not None and s.via.key == via.key]
    return copies.all(via), sorted(reached)
