"""The analysis every surface renders: alerts, the origin of the first Inf/NaN, and why.

:func:`analyze` finds the facts with one helper each (the alerts, the origin, the
lineages and their verdicts, the cause, what the circular buffer dropped) and assembles
one frozen :class:`Analysis` from their results at the end. It holds facts only: its
notes are typed (``_notes.py``), and every sentence made of them (the headline, the
notes' words) is written by the reporters (``nanscope/report/_sentences.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from nanscope._paths import is_library_file, is_user_file
from nanscope.analysis import _notes as note
from nanscope.analysis._aliases import is_load
from nanscope.analysis._explain import (
    HARMFUL_MASK,
    MASK_GUESS,
    born_from_output,
    explain_dropped,
    short_name,
)
from nanscope.analysis._headroom import Headroom, analyze_headroom
from nanscope.analysis._lineage import Lineage, in_place
from nanscope.analysis._lineages import find_lineages
from nanscope.analysis._notes import TF_DEFAULT_BUFFER, Note
from nanscope.analysis._ranks import RankVerdict, analyze_ranks
from nanscope.analysis._views import EventView, Source, ViewBuilder
from nanscope.format.modes import HEALTH_MODES, TensorDebugMode
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader, Problem
from nanscope.vocabulary import LineageVerdict, NonFinite, OriginKind, Phase, RankRole, Verdict

SCHEMA = "nanscope.report/2"
CHAIN_LIMIT = 50

# The verdicts (docs/REPORT_JSON.md), under the names this package has always exported.
HARMFUL = Verdict.HARMFUL
INCOMPLETE = Verdict.INCOMPLETE
ABSORBED = Verdict.ABSORBED
CLEAN = Verdict.CLEAN
UNKNOWN = LineageVerdict.UNKNOWN

__all__ = ["Alerts", "Analysis", "LineageGroup", "analyze", "count_alerts"]


@dataclass
class Alerts:
    """Inf/NaN events: how many, of which op types, at which steps."""

    total: int = 0
    executions: int = 0
    graph_execution_traces: int = 0
    by_op_type: list[dict[str, Any]] = field(
        default_factory=list
    )  # op_type, kind, count, first_index
    by_step: list[dict[str, Any]] = field(default_factory=list)  # step, count, first


@dataclass(frozen=True)
class LineageGroup:
    """Lineages whose births are the same op at the same place, with the same verdict."""

    kind: LineageVerdict
    birth: EventView  # the first birth of the group
    count: int
    reaches: list[str]
    absorbed_at: dict[str, Any] | None  # {"kind", "index"}: where the first one was absorbed
    handled_at: dict[str, Any] | None  # where GradScaler's inf check saw the first one
    skipped_steps: list[int] = field(default_factory=list)  # handled: the steps skipped
    # The circular buffer dropped the real birth: ``birth`` is the earliest event kept.
    birth_evicted: bool = False
    # Events of activation checkpointing's rerun that repeated these births (no births).
    recomputed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "birth": self.birth.to_json(),
            "count": self.count,
            "reaches": self.reaches,
            "absorbed_at": self.absorbed_at,
            "handled_at": self.handled_at,
            "skipped_steps": self.skipped_steps,
            "birth_evicted": self.birth_evicted,
            "recomputed": self.recomputed,
        }


@dataclass(frozen=True)
class Analysis:
    """The one result that the terminal report, the JSON report and the GUI render."""

    logdir: str
    run_id: str
    framework: str
    tensor_debug_mode: str | None
    processes: list[dict[str, Any]]
    num_executions: int
    num_graph_execution_traces: int
    steps: list[int] | None
    alerts: Alerts
    # The last step holds only work after the program's last optimizer step (an evaluation,
    # a final print): a step ends when the optimizer step returns, so a loop of n steps
    # records steps 0..n. Not in the JSON; the text report's header says it.
    after_last_step: bool = False
    origin: EventView | None = None
    origin_kind: OriginKind | None = None
    # The cause's own kind (entered, born, unknown): the cause may be another event than
    # the origin. Not in the JSON; the headline says it ("passed on" or "produced").
    cause_kind: OriginKind | None = None
    first_inf: EventView | None = None
    first_nan: EventView | None = None
    # The birth to fix: of the harmful lineage that made the first NaN, else of the first
    # harmful lineage; None when every Inf/NaN was benign or handled.
    cause: EventView | None = None
    # The cause's real birth was dropped (a circular buffer): ``cause`` is then the earliest
    # event kept of its lineage, and this says what was lost: {"kind", "process", "steps":
    # [first, last], "events"}.
    cause_evicted: dict[str, Any] | None = None
    # (kind, index) of a shown event -> the innermost frame of library code (the model's,
    # the optimizer's) under the user's own frame; for a backward op, its forward op's.
    library_sources: dict[tuple[str, int], Source] = field(default_factory=dict)
    # (kind, index) of each birth -> its lineage's verdict: what every note says of a birth.
    birth_verdicts: dict[tuple[str, int], LineageVerdict] = field(default_factory=dict)
    found_harmful: bool = False
    # When parameters or optimizer state became non-finite: the in-place write of the
    # optimizer phase (``_fused_adamw_``, ``_foreach_addcdiv_``, ``addcdiv_``) whose Inf/NaN
    # a later step read back (its ``step`` is the step); None when none did.
    state_nonfinite: EventView | None = None
    lineages: list[LineageGroup] = field(default_factory=list)
    evicted: dict[str, int] = field(default_factory=dict)
    chain: list[EventView] = field(default_factory=list)
    # What the analysis notes beside the verdict, in the order found: facts, worded by the
    # reporters (``nanscope.report.note_texts``).
    notes: list[Note] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)
    # Several processes: which rank it was born on, how that was told, how it spread.
    ranks: RankVerdict | None = None
    logdirs: list[str] = field(default_factory=list)  # every dump root read (logdir: the first)
    # How close values came to their format's limits (None: the dump records no ranges).
    headroom: Headroom | None = None
    # What may be missing from the recording (a damaged, cut or missing event file, events
    # the writer lost, a writer that never closed): each a problem's JSON. A dump with any
    # is never called clean.
    incomplete: list[dict[str, Any]] = field(default_factory=list)

    @property
    def found(self) -> bool:
        """Whether any Inf/NaN was recorded, harmful or not."""
        return self.alerts.total > 0

    @property
    def verdict(self) -> Verdict:
        """:data:`HARMFUL`, :data:`INCOMPLETE`, :data:`ABSORBED` or :data:`CLEAN`.

        Harm found is harm whatever else is missing; without it, a dump that lost events
        gets no all-clear, since what is missing may be the Inf/NaN."""
        if self.found_harmful:
            return Verdict.HARMFUL
        if self.incomplete:
            return Verdict.INCOMPLETE
        return Verdict.ABSORBED if self.found else Verdict.CLEAN

    @property
    def exit_status(self) -> int:
        """``nanscope report``'s exit status: 1 harmful, 2 incomplete, 0 otherwise."""
        return self.verdict.exit_status

    @property
    def first_harm(self) -> tuple[int, int, int] | None:
        """``(process, step, index)`` of the first harmful execution with Inf/NaN, if any:
        where headroom's trend is judged up to."""
        if not self.found_harmful:
            return None
        for v in (self.cause, self.first_inf, self.first_nan, self.origin):
            if v is not None and v.kind == EXECUTIONS:
                return v.process, v.step, v.index
        return None


def count_alerts(reader: DumpReader, process: int | None = None) -> Alerts:
    """Inf/NaN events counted by op type and by step, from the index alone.

    ``process`` counts only that process's events (an index into ``reader.processes``).
    """
    a = Alerts()
    per_op: dict[tuple[str, str], list[int]] = {}
    # step -> [count, (wall time, kind, index) of its first event]
    steps: dict[int, list[Any]] = {}
    for kind in (EXECUTIONS, TRACES):
        rows = reader.index(kind)
        mask = rows["nonfinite"] == 1
        if process is not None:
            mask &= reader.processes_of(kind) == process
        hits = np.flatnonzero(mask)
        if kind == EXECUTIONS:
            a.executions = int(hits.size)
            names = rows["name"][hits]
        else:
            a.graph_execution_traces = int(hits.size)
            names = reader.trace_op_types(hits)
        # One sort for every op type at once (hits are in index order: each type's first
        # position in the sort is its first event).
        sids, firsts, counts = np.unique(names, return_index=True, return_counts=True)
        for sid, f, n in zip(sids.tolist(), firsts.tolist(), counts.tolist(), strict=True):
            per_op[(reader.string(sid), kind)] = [n, int(hits[f])]
        s_vals, s_first, s_counts = np.unique(
            rows["step"][hits], return_index=True, return_counts=True
        )
        for s, f, c in zip(s_vals.tolist(), s_first.tolist(), s_counts.tolist(), strict=True):
            i = int(hits[f])
            first = (float(rows["wall_time"][i]), kind, i)
            entry = steps.setdefault(s, [0, first])
            entry[0] += c
            entry[1] = min(entry[1], first)
    a.total = a.executions + a.graph_execution_traces
    a.by_op_type = sorted(
        (
            {"op_type": op, "kind": kind, "count": n, "first_index": first}
            for (op, kind), (n, first) in per_op.items()
        ),
        key=lambda d: (-d["count"], d["op_type"]),
    )
    a.by_step = [
        {
            "step": s,
            "count": steps[s][0],
            "first": {"kind": steps[s][1][1], "index": steps[s][1][2]},
        }
        for s in sorted(steps)
    ]
    return a


def _origin_kind(origin: EventView) -> OriginKind:
    """Entered (from outside the recorded ops), born here, or unknown."""
    if origin.external_input:
        return OriginKind.ENTERED
    # Inputs made by a recorded op but not summarised are integers or booleans
    # (or filtered out); only inputs from nowhere with no values are unknown.
    unknown = [
        i
        for i in origin.inputs
        if i.producer is None
        and (i.counts is None or not i.counts.known)
        and not i.name.endswith("(a number)")
    ]
    if unknown and not born_from_output(origin.op_type, origin.counts):
        # An input whose values were not recorded may have carried the Inf/NaN in.
        return OriginKind.UNKNOWN
    return OriginKind.BORN


def analyze(
    reader: DumpReader, lookback: int = 5000, headroom_format: str | None = None
) -> Analysis:
    """Find the alerts, the origin, the first -inf/+inf, the first NaN and the chain between,
    and how close values came to overflow and underflow (measured against
    ``headroom_format``, e.g. ``"float8_e4m3fn"``, or else each value's own format)."""
    found = _analyze(reader, lookback)
    # Again at the end: decoding the events found damage that indexing from a sidecar did not.
    incomplete = [p.to_json() for p in reader.incomplete] + found.incomplete
    notes = found.notes
    if incomplete and found.found and not found.found_harmful:
        # Said of what was read; what is missing may hold what it would change.
        notes = [
            note.NothingHarmful(incomplete=True) if isinstance(n, note.NothingHarmful) else n
            for n in notes
        ]
    return replace(
        found,
        headroom=analyze_headroom(reader, headroom_format, found.first_harm),
        problems=[p.to_json() for p in reader.problems],
        incomplete=incomplete,
        notes=notes,
    )


def _after_last_step(reader: DumpReader) -> bool:
    """Whether the last step holds only what ran after the last training step: nothing in
    it trained (no event of the backward pass or the optimizer phase, no call of a graph
    with backward equations), while an earlier step did."""
    last = max(
        (int(reader.index(k)["step"].max()) for k in (EXECUTIONS, TRACES) if reader.num(k)),
        default=0,
    )
    trained_before = False
    for kind in (EXECUTIONS, TRACES):
        rows = reader.index(kind)
        if not len(rows):
            continue
        training = rows["phase"] >= Phase.BACKWARD
        if kind == EXECUTIONS:
            training |= _calls_training_graph(reader, rows)
        at_last = rows["step"] == last
        if np.any(training & at_last):
            return False
        trained_before |= bool(np.any(training & ~at_last))
    return trained_before


def _calls_training_graph(reader: DumpReader, rows: np.ndarray) -> np.ndarray:
    """Which executions call a graph that holds backward equations (a jitted training
    step: JAX writes its backward equations with a forward source)."""
    out = np.zeros(len(rows), dtype=bool)
    processes = range(len(reader.processes))
    for sid in np.unique(rows["graph"]).tolist():
        graph_id = reader.string(sid)
        if not graph_id:
            continue  # eager ops
        trains = [
            p
            for p in processes
            if (g := reader.graph(graph_id, p)) is not None
            and any(op.forward_stack_frame_ids for op in g.ops.values())
        ]
        if trains:
            hit = rows["graph"] == sid
            if len(trains) < len(processes):
                hit &= np.isin(reader.processes_of(EXECUTIONS), trains)
            out |= hit
    return out


def _dump_facts(reader: DumpReader) -> dict[str, Any]:
    """What every analysis says of its dump, Inf/NaN or not: which run, what was recorded,
    the steps, and the alerts."""
    mode = reader.tensor_debug_mode
    rows_e = reader.index(EXECUTIONS)
    rows_t = reader.index(TRACES)
    # Each kind's own min and max: no copy of every step (25M of them at 256 ranks).
    bounds = [(int(r["step"].min()), int(r["step"].max())) for r in (rows_e, rows_t) if len(r)]
    # Steps nobody counted (TensorFlow's dumps without a training function): say
    # "unknown" rather than "step 0".
    steps = (
        [min(b[0] for b in bounds), max(b[1] for b in bounds)]
        if bounds and reader.steps_known
        else None
    )
    alerts = count_alerts(reader)
    if steps is None:
        alerts = replace(alerts, by_step=[])  # every event reads step 0: no step to name
    return {
        "logdir": str(reader.logdir),
        "logdirs": [str(d) for d in reader.logdirs],
        "run_id": reader.run_id,
        "framework": reader.framework,
        "tensor_debug_mode": mode.name if mode is not None else None,
        "processes": [p.to_json() for p in reader.processes],
        "num_executions": reader.num_executions(),
        "num_graph_execution_traces": reader.num_graph_execution_traces(),
        "steps": steps,
        "alerts": alerts,
        "problems": [p.to_json() for p in reader.problems],
        "after_last_step": steps is not None and _after_last_step(reader),
    }


class _Views:
    """The analysis's event views, each built once; an event that cannot be decoded is
    None, and noted."""

    def __init__(self, reader: DumpReader, lookback: int, notes: list[Note]) -> None:
        self.builder = ViewBuilder(reader, lookback)
        self.notes = notes
        self.cache: dict[tuple[str, int], EventView] = {}

    def __call__(self, kind: str, index: int) -> EventView | None:
        key = (kind, index)
        if key not in self.cache:
            try:
                self.cache[key] = self.builder.view(kind, index)
            except UNREADABLE as exc:
                self.notes.append(note.Undecodable(kind, index, str(exc)))
                return None
        return self.cache[key]


def _analyze(reader: DumpReader, lookback: int) -> Analysis:
    facts = _dump_facts(reader)
    mode = reader.tensor_debug_mode
    if mode is not None and mode not in HEALTH_MODES and mode != TensorDebugMode.FULL_TENSOR:
        return Analysis(**facts, notes=[note.NoHealth(mode.name)])
    # The notes in the order they are found; each helper adds its own.
    notes: list[Note] = [note.CurtHealth()] if mode == TensorDebugMode.CURT_HEALTH else []
    evicted, dropped = _eviction(reader)
    notes += dropped
    first = reader.first_nonfinite()
    notes += _tensorflow_buffer(reader, found=first is not None)
    if first is None:
        return Analysis(**facts, evicted=evicted, notes=notes)
    # Several processes: the rank where it was born, by the collectives that carried it.
    ranks = analyze_ranks(reader)
    origin_process: int | None = None
    if ranks is not None and ranks.origin is not None:
        first = ranks.origin
        origin_process = ranks.origin_process
    view = _Views(reader, lookback, notes)
    try:
        origin = view.builder.view(first.kind, first.index)
    except UNREADABLE as exc:
        notes.append(note.UndecodableOrigin(str(exc)))
        return Analysis(**facts, evicted=evicted, ranks=ranks, notes=notes)
    view.cache[(origin.kind, origin.index)] = origin
    # A circular buffer may have evicted the producer: say when the inputs are unknown.
    if (
        origin.kind == EXECUTIONS
        and not origin.external_input
        and any(i.producer is None and i.counts is None for i in origin.inputs)
    ):
        notes.append(note.OriginInputsUnknown())
    # The first -inf/+inf and NaN: the origin's rank's (every other rank's came later).
    inf_at = (
        reader.first_where(NonFinite.INF, process=origin_process)[1]
        or reader.first_where(NonFinite.INF)[1]
    )
    nan_at = (
        reader.first_where(NonFinite.NAN, process=origin_process)[1]
        or reader.first_where(NonFinite.NAN)[1]
    )
    first_inf = view(inf_at.kind, inf_at.index) if inf_at else None
    first_nan = view(nan_at.kind, nan_at.index) if nan_at else None
    judged = _judge(reader, view, ranks, first_nan, found=facts["alerts"].total > 0)
    notes += _verdict_notes(judged, origin, first_nan, found=facts["alerts"].total > 0)
    if ranks is not None and judged.found_harmful:
        # Where benign masks were made on every rank is no news: only harm gets the ranks' say.
        notes += ranks.notes
    for v in (origin, judged.cause, first_inf, first_nan):
        if v is not None:
            view.builder.add_context(v)
    # Where in a library each event the report names ran (``library_source``).
    library_sources = {
        (v.kind, v.index): lib
        for v in (origin, judged.cause, first_inf, first_nan, judged.state_nonfinite)
        if v is not None and (lib := _library_source(reader, v)) is not None
    }
    return Analysis(
        **facts,
        origin=origin,
        origin_kind=_origin_kind(origin),
        cause_kind=_origin_kind(judged.cause) if judged.cause is not None else None,
        first_inf=first_inf,
        first_nan=first_nan,
        cause=judged.cause,
        cause_evicted=judged.cause_evicted,
        library_sources=library_sources,
        birth_verdicts=judged.birth_verdicts,
        found_harmful=judged.found_harmful,
        state_nonfinite=judged.state_nonfinite,
        lineages=judged.lineages,
        evicted=evicted,
        chain=judged.chain,
        notes=notes,
        ranks=ranks,
        incomplete=judged.unknown,
    )


class _Judged(NamedTuple):
    """The lineages' verdicts, and the cause they point to."""

    found_harmful: bool
    birth_verdicts: dict[tuple[str, int], LineageVerdict]
    lineages: list[LineageGroup]
    cause_lineage: Lineage | None
    cause: EventView | None
    cause_evicted: dict[str, Any] | None
    state_nonfinite: EventView | None
    chain: list[EventView]
    # A problem's JSON for each lineage whose values went into dropped events that nothing
    # recorded can follow them through: no all-clear while any is left.
    unknown: list[dict[str, Any]]


def _judge(
    reader: DumpReader,
    view: _Views,
    ranks: RankVerdict | None,
    first_nan: EventView | None,
    *,
    found: bool,
) -> _Judged:
    """Lineages, the cause, whether any Inf/NaN was harmful, and the chain to the first NaN."""
    notes = view.notes
    # Ranks that received their Inf/NaN from another need no lineages of their own: their
    # values are the origin's (and following them on every rank of a large run is slow).
    skip = {st.process for st in ranks.states if st.role == RankRole.RECEIVED} if ranks else set()
    lineages, complete = find_lineages(reader, skip=skip)
    written = _state_write(reader, lineages)
    state_nonfinite = view(EXECUTIONS, written) if written is not None else None
    if not complete:
        notes.append(note.LineagesCutShort())
    # Lineages first seen after events the circular buffer dropped: their births are gone.
    cut = [lin for lin in lineages if lin.after_gap]
    if cut:
        notes.append(note.BirthsDropped(len(cut)))
    # Where no lineage could be built (undecodable events), stay on the safe side.
    found_harmful = any(lin.verdict == LineageVerdict.HARMFUL for lin in lineages) or (
        found and not lineages
    )
    kept = [lin for lin in lineages if not lin.after_gap]
    harmful = [lin for lin in kept if lin.verdict == LineageVerdict.HARMFUL]
    groups = _groups(reader, kept, view)
    cause = _pick_cause(harmful, first_nan)
    made = _made_elsewhere(cause, harmful)
    if cause is not None and made is not None:
        notes.append(
            note.MadeElsewhere(
                short_name(str(cause.signature[0])),
                cause.birth,
                reader.processes[cause.process].label,
                reader.processes[made.process].label,
            )
        )
        cause = made
    cause_evicted: dict[str, Any] | None = None
    if cause is None:
        # Harm whose birth was dropped: name the earliest event kept of it (the one that
        # holds the first NaN first), and what was lost (docs/ROOT_CAUSE.md, "Circular buffers").
        cause = _pick_cause(
            [lin for lin in cut if lin.verdict == LineageVerdict.HARMFUL], first_nan
        )
        if cause is not None:
            cause_evicted = _lost_before(reader, cause)
            evicted_groups = _groups(reader, [cause], view, evicted=cause_evicted is not None)
            if evicted_groups and cause_evicted is not None:
                groups.append(evicted_groups[0])
    cause_view: EventView | None = None
    chain: list[EventView] = []
    if cause is not None:
        cause_view = view(cause.kind, cause.birth)
        if cause_view is not None and cause_evicted is not None:
            # Its input's producer was dropped, not outside the program: say so, in every
            # place the event is shown (the cause box, the lineage list, the headline).
            cause_view.explanation = explain_dropped(cause_view.counts)
        elif cause_view is not None:
            _no_intended_mask(cause_view)
        # The lineage's own first NaN (the first NaN of all when it is in this lineage).
        end = view(cause.kind, cause.first_nan) if cause.first_nan is not None else None
        if cause_view is not None:
            chain = _chain(reader, cause_view, end, view) if end else [cause_view]
    for group in groups:
        if group.kind == LineageVerdict.HARMFUL:
            _no_intended_mask(group.birth)
    return _Judged(
        found_harmful=found_harmful,
        birth_verdicts={(lin.kind, lin.birth): lin.verdict for lin in lineages},
        lineages=groups,
        cause_lineage=cause,
        cause=cause_view,
        cause_evicted=cause_evicted,
        state_nonfinite=state_nonfinite,
        chain=chain,
        unknown=[_unknown_fate(reader, lin) for lin in lineages if lin.verdict == UNKNOWN],
    )


def _unknown_fate(reader: DumpReader, lin: Lineage) -> dict[str, Any]:
    """The problem that a lineage of unknown fate leaves: where it was last seen, and what
    would have kept what became of it."""
    name = str(lin.signature[-1]) if lin.signature else "?"
    lost = min(lin.lost)
    kind = "graph execution traces" if lin.kind == TRACES else "executions"
    message = (
        f"what became of the Inf/NaN born at {short_name(name)} #{lin.birth} is not in the "
        f"dump: its values went on from #{lost} into {kind} "
        "the circular buffer dropped; record with circular_buffer_size=-1 to keep everything"
    )
    where = str(reader.event_file(lin.process, lin.kind))
    return Problem("warning", message, incomplete=True, file=where).to_json()


def _no_intended_mask(v: EventView) -> None:
    """A harmful birth's explanation never guesses at an intended mask: a mask's values that
    nothing absorbed are harm."""
    if v.explanation.endswith(MASK_GUESS):
        v.explanation = v.explanation[: -len(MASK_GUESS)] + HARMFUL_MASK


# Library code that only passes a call on (module calls and torch's built-in layers, whose
# forward calls one functional op; functional wrappers, autograd, the optimizer's step
# wrapper, decorators): never the frame that says where in a model it ran.
_PLUMBING = re.compile(
    r"[\\/]torch[\\/](nn[\\/]modules[\\/]|nn[\\/]functional\.py|functional\.py"
    r"|_tensor\.py|_ops\.py|overrides\.py|_jit_internal\.py|_compile\.py"
    r"|optim[\\/]optimizer\.py|autograd[\\/]|utils[\\/]|_dynamo[\\/]|amp[\\/]|_prims"
    r"|_refs[\\/]|_decomp[\\/]|_library[\\/]|_higher_order_ops[\\/])"
    r"|[\\/]lib[\\/]python\d+(\.\d+)?[\\/](?!site-packages|dist-packages)"
    # JAX's and TensorFlow's dispatch, tracing and op wrappers; Keras's backend and ops.
    r"|[\\/](jax|jaxlib)[\\/]|[\\/]tensorflow[\\/]python[\\/]"
    r"|[\\/]keras[\\/]src[\\/](backend|ops|utils|trainers)[\\/]"
)


def library_frame(frames: list[Source]) -> Source | None:
    """The innermost frame of library code under the user's own innermost frame, where the
    op ran inside a library (a Hugging Face model's ``modeling_gpt2.py``, an optimizer's
    ``torch/optim/adamw.py``): what to show when the user's own line is only
    ``trainer.train()`` or ``optimizer.step()``. ``frames`` outermost first; None when the
    user's code called the op itself (through plumbing only: module calls, functional
    wrappers, autograd)."""
    below: list[Source] = []
    for f in reversed(frames):
        if is_user_file(f.file):
            break
        below.append(f)
    for f in below:  # innermost first
        if is_library_file(f.file) and not f.file.startswith("<") and not _PLUMBING.search(f.file):
            return Source(f.file, f.line, f.function)
    return None


def _library_source(reader: DumpReader, v: EventView) -> Source | None:
    """:func:`library_frame` of ``v``; for a backward op, of its forward op's call."""
    frames = v.stack
    if v.kind == EXECUTIONS and v.forward_op:
        try:
            ex = reader.execution(v.index)
            if ex.forward_stack_frame_ids:
                frames = [
                    Source(f.file_path, f.lineno, f.function)
                    for f in reader.stack_frames(ex.forward_stack_frame_ids, v.process)
                ]
        except UNREADABLE:
            pass
    return library_frame(frames)


def _made_elsewhere(cause: Lineage | None, harmful: list[Lineage]) -> Lineage | None:
    """For a cause born at a load (``set_``: a batch a DataLoader worker put in shared memory,
    a tensor received from a child), the earliest harmful birth that computed values in
    another process before it, if any: the values were made there."""
    if cause is None or not cause.signature or not is_load(str(cause.signature[0])):
        return None
    made = [
        lin
        for lin in harmful
        if lin.process != cause.process
        and lin.wall_time <= cause.wall_time
        and not (lin.signature and is_load(str(lin.signature[0])))
    ]
    return min(made, key=lambda lin: lin.wall_time) if made else None


def _pick_cause(harmful: list[Lineage], first_nan: EventView | None) -> Lineage | None:
    """The harmful lineage that made the first NaN, else the one with the earliest NaN, else
    the first (docs/ROOT_CAUSE.md, "Verdicts")."""
    if first_nan is not None:
        for lin in harmful:
            if lin.kind == first_nan.kind and first_nan.index in lin.members:
                return lin
    with_nan = [lin for lin in harmful if lin.first_nan is not None]
    if with_nan:
        return min(with_nan, key=lambda lin: (lin.kind, lin.first_nan or 0))
    return harmful[0] if harmful else None


def _lost_before(reader: DumpReader, lin: Lineage) -> dict[str, Any] | None:
    """What the circular buffer dropped of ``lin``'s process before its first kept event:
    ``{"kind", "process", "steps": [first, last] or None, "events"}``; None if nothing."""
    gaps = [
        (after, n)
        for p, after, n in reader.gaps(lin.kind)
        if p == lin.process and after < lin.birth
    ]
    if not gaps:
        return None
    rows = reader.index(lin.kind)
    procs = reader.processes_of(lin.kind)
    mine = np.flatnonzero(procs == lin.process)
    after = gaps[0][0]
    # The dropped events ran between the event before the first gap and the one after the
    # last (steps from 0 when the gap opens the recording).
    following = mine[np.searchsorted(mine, gaps[-1][0], side="right")]
    first = int(rows["step"][after]) if after >= 0 else 0
    steps = [first, int(rows["step"][following])] if reader.steps_known else None
    return {
        "kind": lin.kind,
        "process": lin.process,
        "steps": steps,
        "events": sum(n for _, n in gaps),
    }


def _verdict_notes(
    judged: _Judged, origin: EventView, first_nan: EventView | None, *, found: bool
) -> list[Note]:
    """What the notes say of the verdict, each claim derived from the lineages' verdicts
    (``judged.birth_verdicts``) so that no note contradicts the lineage list."""
    cause = judged.cause_lineage
    if cause is None:
        if judged.found_harmful:
            return [note.LineagesNotFollowed()]
        return [note.NothingHarmful()] if found else []
    notes: list[Note] = []
    if judged.cause_evicted is not None:
        notes.append(note.CauseEvicted(judged.cause_evicted, judged.cause))
    if (origin.kind, origin.index) == (cause.kind, cause.birth):
        return notes
    made_first_nan = (
        first_nan.index
        if first_nan is not None
        and first_nan.kind == cause.kind
        and first_nan.index in cause.members
        else None
    )
    notes.append(
        note.FirstIsNotTheCause(
            origin,
            judged.birth_verdicts.get((origin.kind, origin.index)),
            judged.cause,
            made_first_nan,
            cause.birth,
        )
    )
    return notes


def _eviction(reader: DumpReader) -> tuple[dict[str, int], list[Note]]:
    """How many events the circular buffers dropped, and a note for each kind with gaps."""
    evicted = {kind: reader.evicted(kind) for kind in (EXECUTIONS, TRACES)}
    notes: list[Note] = [
        note.Evicted(kind, n, reader.num(kind), len(reader.gaps(kind)))
        for kind, n in evicted.items()
        if n
    ]
    return evicted, notes


def _tensorflow_buffer(reader: DumpReader, *, found: bool) -> list[Note]:
    """A note where TensorFlow wrote the dump itself and may have let go of its first events.

    Its files do not say whether a circular buffer was used (nanscope's reader reports
    the loss as incomplete where the calls and their traces show it). So a TensorFlow
    dump with no Inf/NaN never reads as clean without saying that the first events may
    be missing; one with Inf/NaN, when a file holds exactly as many events as the default
    buffer keeps, says that the first Inf/NaN may be among them.
    """
    for proc in reader.processes:
        if not proc.tensorflow_version or proc.nanscope_version:
            continue  # nanscope's writers say what they let go of
        if reader.incomplete_events(proc.index):
            continue  # the reader found what is missing: its problems say so
        if not found:
            return [note.TensorflowBufferUnknown()]
        counts = {
            kind: int(np.count_nonzero(reader.processes_of(kind) == proc.index))
            for kind in (EXECUTIONS, TRACES)
        }
        full = tuple(k for k, n in counts.items() if n == TF_DEFAULT_BUFFER)
        if full:
            return [note.TensorflowBufferFull(full)]
    return []


def _groups(
    reader: DumpReader, lineages: list[Lineage], view: _Views, *, evicted: bool = False
) -> list[LineageGroup]:
    """Lineages grouped by verdict and birth place, in order of their first birth (a birth
    that cannot be decoded starts no group: the next of its place does)."""
    births: dict[tuple[Any, ...], EventView] = {}
    members: dict[tuple[Any, ...], list[Lineage]] = {}
    for lin in lineages:
        key = (lin.verdict, lin.kind, lin.process, lin.signature)
        if key not in births:
            birth = view(lin.kind, lin.birth)
            if birth is None:
                continue
            births[key] = birth
            members[key] = []
        members[key].append(lin)
    return [_group(reader, births[key], lins, evicted) for key, lins in members.items()]


def _group(
    reader: DumpReader, birth: EventView, lins: list[Lineage], evicted: bool
) -> LineageGroup:
    first = lins[0]
    reaches: list[str] = []
    skipped: list[int] = []
    for lin in lins:
        reaches.extend(r for r in lin.reaches if r not in reaches)
        if lin.verdict == LineageVerdict.HANDLED and lin.handled_at is not None:
            step = int(reader.index(lin.kind)["step"][lin.handled_at])
            if step not in skipped:
                skipped.append(step)
    return LineageGroup(
        kind=first.verdict,
        birth=birth,
        count=len(lins),
        reaches=reaches,
        absorbed_at=_absorber(reader, first),
        handled_at=_ref(first.kind, first.handled_at),
        skipped_steps=skipped,
        birth_evicted=evicted,
        recomputed=sum(len(lin.recomputed) for lin in lins),
    )


# Events of a lineage looked at for the write that made the weights non-finite.
STATE_WRITE_LIMIT = 20_000


def _state_write(reader: DumpReader, lineages: list[Lineage]) -> int | None:
    """The first in-place write of the optimizer phase that left Inf/NaN in parameters or
    optimizer state: of a lineage's in-place optimizer-phase writes (clipping writes the
    gradients, the optimizer the parameters and their moments), the one whose written
    tensors an event of a later step read back (the next forward pass reads the weights,
    the next update the moments). Where the recording ends first (no later step), the
    last such write of the first step that had one."""
    found: int | None = None
    for lin in lineages:
        if lin.kind != EXECUTIONS or lin.verdict != LineageVerdict.HARMFUL:
            continue
        outputs: dict[int, tuple[int, int]] = {}  # tensor id -> (write, its step)
        last: tuple[int, int] | None = None  # the first step's last write
        for i in lin.members[:STATE_WRITE_LIMIT]:
            if found is not None and i >= found:
                break
            try:
                ex = reader.execution(i)
            except UNREADABLE:
                continue
            hit = [outputs[t] for t in ex.input_tensor_ids if t in outputs]
            if any(ex.step > step for _, step in hit):
                found = min(w for w, step in hit if ex.step > step)
                break
            if ex.phase == Phase.OPTIMIZER and in_place(ex.op_type):
                for t in ex.output_tensor_ids:
                    if t:
                        outputs[t] = (i, ex.step)
                if last is None or last[1] == ex.step:
                    last = (i, ex.step)
        else:
            if last is not None and (found is None or last[0] < found):
                found = last[0]
    return found


def _ref(kind: str, index: int | None) -> dict[str, Any] | None:
    return None if index is None else {"kind": kind, "index": index}


def _absorber(reader: DumpReader, lin: Lineage) -> dict[str, Any] | None:
    """Where a lineage's values were first absorbed, with that op's type (a cast to an
    integer, a comparison, a softmax...)."""
    ref = _ref(lin.kind, lin.absorbed_at)
    if ref is not None and lin.absorbed_at is not None:
        try:
            ev = (
                reader.execution(lin.absorbed_at)
                if lin.kind == EXECUTIONS
                else reader.trace(lin.absorbed_at)
            )
            ref["op_type"] = ev.op_type
        except UNREADABLE:
            pass
    return ref


def _chain(reader: DumpReader, origin: EventView, end: EventView, view: Any) -> list[EventView]:
    """The non-finite events that carry the origin's values to ``end`` (data edges only)."""
    # Only real data edges: across kinds or processes, or backwards, there is none to follow.
    if origin.kind != end.kind or origin.process != end.process or end.index <= origin.index:
        return [origin]
    kind = origin.kind
    rows = reader.index(kind)
    procs = reader.processes_of(kind)
    span = np.arange(origin.index + 1, end.index + 1)
    span = span[(rows["nonfinite"][span] == 1) & (procs[span] == origin.process)]
    chain = [origin]
    if kind == EXECUTIONS:
        live = set(reader.execution(origin.index).output_tensor_ids)
        for i in span.tolist()[: CHAIN_LIMIT * 20]:
            try:
                ex = reader.execution(i)
            except UNREADABLE:
                continue
            if live.intersection(ex.input_tensor_ids) and (v := view(kind, i)) is not None:
                live.update(ex.output_tensor_ids)
                chain.append(v)
                if i == end.index or len(chain) >= CHAIN_LIMIT:
                    break
    else:
        live_ops = {origin.op_name}
        for i in span.tolist()[: CHAIN_LIMIT * 20]:
            try:
                tr = reader.trace(i)
            except UNREADABLE:
                continue
            op = reader.graph_op(tr.graph_id, tr.op_name, tr.process)
            if (
                op is not None
                and live_ops.intersection(name for name, _ in op.inputs)
                and (v := view(kind, i)) is not None
            ):
                live_ops.add(tr.op_name)
                chain.append(v)
                if i == end.index or len(chain) >= CHAIN_LIMIT:
                    break
    return chain
