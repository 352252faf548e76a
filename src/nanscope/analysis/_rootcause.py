"""The analysis every surface renders: alerts, the origin of the first Inf/NaN, and why."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nanscope._paths import is_library_file, is_user_file
from nanscope.analysis._aliases import is_load
from nanscope.analysis._explain import (
    HARMFUL_MASK,
    MASK_GUESS,
    born_from_output,
    explain_dropped,
    short_name,
)
from nanscope.analysis._headroom import Headroom, analyze_headroom
from nanscope.analysis._lineages import OPTIMIZER, Lineage, _in_place, find_lineages
from nanscope.analysis._ranks import RankVerdict, analyze_ranks
from nanscope.analysis._views import EventView, Source, ViewBuilder
from nanscope.format.modes import HEALTH_MODES, TensorDebugMode
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader

SCHEMA = "nanscope.report/2"
CHAIN_LIMIT = 50

# The verdicts, and the exit status of ``nanscope report`` for each (docs/REPORT_JSON.md).
HARMFUL = "harmful"  # a harmful Inf/NaN was found: exit 1
INCOMPLETE = "incomplete"  # none found, but events are missing: no all-clear, exit 2
ABSORBED = "absorbed"  # Inf/NaN recorded, every lineage absorbed or handled: exit 0
CLEAN = "clean"  # no Inf/NaN recorded in a whole dump: exit 0
EXIT_STATUS = {HARMFUL: 1, INCOMPLETE: 2, ABSORBED: 0, CLEAN: 0}


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


@dataclass
class LineageGroup:
    """Lineages whose births are the same op at the same place, with the same verdict."""

    kind: str  # "harmful", "benign" or "handled"
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
        return {"kind": self.kind, "birth": self.birth.to_json(), "count": self.count,
                "reaches": self.reaches, "absorbed_at": self.absorbed_at,
                "handled_at": self.handled_at, "skipped_steps": self.skipped_steps,
                "birth_evicted": self.birth_evicted,
                "recomputed": self.recomputed}  # fmt: skip


@dataclass
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
    origin: EventView | None = None
    origin_kind: str | None = None  # "born" or "entered"
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
    birth_verdicts: dict[tuple[str, int], str] = field(default_factory=dict)
    found_harmful: bool = False
    # When parameters or optimizer state became non-finite: the in-place write of the
    # optimizer phase (``_fused_adamw_``, ``_foreach_addcdiv_``, ``addcdiv_``) whose Inf/NaN
    # a later step read back (its ``step`` is the step); None when none did.
    state_nonfinite: EventView | None = None
    lineages: list[LineageGroup] = field(default_factory=list)
    evicted: dict[str, int] = field(default_factory=dict)
    chain: list[EventView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
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
    def verdict(self) -> str:
        """:data:`HARMFUL`, :data:`INCOMPLETE`, :data:`ABSORBED` or :data:`CLEAN`.

        Harm found is harm whatever else is missing; without it, a dump that lost events
        gets no all-clear, since what is missing may be the Inf/NaN."""
        if self.found_harmful:
            return HARMFUL
        if self.incomplete:
            return INCOMPLETE
        return ABSORBED if self.found else CLEAN

    @property
    def exit_status(self) -> int:
        """``nanscope report``'s exit status: 1 harmful, 2 incomplete, 0 otherwise."""
        return EXIT_STATUS[self.verdict]

    @property
    def headline(self) -> str | None:
        """One sentence on the cause: ``aten.log.default produced -inf at step 3: log of zero...``;
        for a run whose Inf/NaN were all benign or handled, says so; for an incomplete dump
        with no harm found, says that no verdict can be given."""
        o = self.cause
        if o is None:
            if self.verdict == INCOMPLETE:
                n = len(self.incomplete)
                seen = "only absorbed or handled Inf/NaN" if self.found else "no Inf/NaN"
                return (
                    f"no verdict: the dump is incomplete ({n} problem{'s' if n != 1 else ''}); "
                    f"{seen} in the events that could be read"
                )
            if not self.found:
                return None
            if self.found_harmful:
                # No lineage to name (events that could not be decoded): harmful to be safe.
                first = self.first_nan or self.origin
                at = f" ({first.op_name} #{first.index})" if first is not None else ""
                return (
                    f"harmful Inf/NaN, counted so to be safe: its lineage could not be "
                    f"followed; the first {'NaN' if first is self.first_nan else 'Inf/NaN'}"
                    f"{at} is shown"
                )
            kinds = Counter(g.kind for g in self.lineages for _ in range(g.count))
            told = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            return f"no harmful Inf/NaN: every lineage was absorbed or handled ({told})"
        text = self._cause_sentence(o)
        if self.cause_evicted is not None:
            lost = self.cause_evicted
            return (
                f"the harmful Inf/NaN was born in {evicted_span(lost)}; the earliest kept: {text}"
            )
        fwd = o.forward_source
        if fwd is not None:
            # A backward op: the line to fix is the forward call the user wrote.
            code = f" `{fwd.code}`" if fwd.code else ""
            what = o.forward_op or "the op called there"
            return f"{Path(fwd.file).name}:{fwd.line}{code}: the backward of {what}: {text}"
        return text

    def _cause_sentence(self, o: EventView) -> str:
        """``aten.log.default produced -inf at step 3: log of zero...``."""
        c = o.counts
        if c.nan:
            what = "NaN"
        elif c.neg_inf and not c.pos_inf:
            what = "-inf"
        elif c.pos_inf and not c.neg_inf:
            what = "+inf"
        else:
            what = "Inf/NaN"
        # The cause's own kind, not the origin's: they may be different events.
        verb = "passed on" if _origin_kind(o) == "entered" else "produced"
        where = [f"step {o.step}"] if self.steps is not None else []
        if o.rank is not None and len(self.processes) > 1:
            where.append(f"rank {o.rank}")
        name = o.op_type if o.op_name == o.op_type else f"{o.op_name} ({o.op_type})"
        text = f"{name} {verb} {what}" + (f" at {', '.join(where)}" if where else "")
        return f"{text}: {o.explanation}" if o.explanation else text

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

    @property
    def warnings(self) -> list[str]:
        """Warnings beside the verdict, one sentence each: overflow or underflow coming."""
        return [w.message for w in self.headroom.warnings] if self.headroom is not None else []

    def to_json(self) -> dict[str, Any]:
        """The documented, stable JSON form (``docs/REPORT_JSON.md``)."""

        def ev(v: EventView | None) -> dict[str, Any] | None:
            if v is None:
                return None
            d = v.to_json()
            lib = self.library_sources.get((v.kind, v.index))
            d["library_source"] = asdict(lib) if lib is not None else None
            return d

        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "exit_status": self.exit_status,
            "headline": self.headline,
            "incomplete": self.incomplete,
            "logdir": self.logdir,
            "logdirs": self.logdirs or [self.logdir],
            "run_id": self.run_id,
            "framework": self.framework,
            "tensor_debug_mode": self.tensor_debug_mode,
            "processes": self.processes,
            "num_executions": self.num_executions,
            "num_graph_execution_traces": self.num_graph_execution_traces,
            "steps": self.steps,
            "found_nonfinite": self.found,
            "alerts": {
                "total": self.alerts.total,
                "executions": self.alerts.executions,
                "graph_execution_traces": self.alerts.graph_execution_traces,
                "by_op_type": self.alerts.by_op_type,
                "by_step": self.alerts.by_step,
            },
            "found_harmful": self.found_harmful,
            "origin": ev(self.origin),
            "origin_kind": self.origin_kind,
            "cause": ev(self.cause),
            "cause_evicted": self.cause_evicted,
            "first_inf": ev(self.first_inf),
            "first_nan": ev(self.first_nan),
            "state_nonfinite": ev(self.state_nonfinite),
            "lineages": [g.to_json() for g in self.lineages],
            "evicted": self.evicted,
            "chain": [c.to_json() for c in self.chain],
            "ranks": self.ranks.to_json() if self.ranks is not None else None,
            "headroom": self.headroom.to_json() if self.headroom is not None else None,
            "notes": self.notes,
            "problems": self.problems,
        }


def evicted_span(lost: dict[str, Any]) -> str:
    """``the 412 executions the circular buffer dropped (steps 2–38)``."""
    steps = lost.get("steps")
    span = ""
    if steps is not None:
        span = f" (steps {steps[0]}–{steps[1]})" if steps[0] != steps[1] else f" (step {steps[0]})"
    n, kind = lost["events"], lost["kind"].replace("_", " ")
    return f"the {n:,} {kind}{'s' if n != 1 else ''} the circular buffer dropped{span}"


NOTHING_HARMFUL = (
    "Every Inf/NaN recorded was absorbed by a later op or handled by the program "
    "(see the lineages): nothing harmful."
)
LINEAGES_NOT_FOLLOWED = (
    "The lineages of the Inf/NaN could not be followed (their events could not be decoded): "
    "they are counted harmful, to be safe."
)
NOTHING_HARMFUL_READ = (
    "Every Inf/NaN in the events that could be read was absorbed by a later op or handled by "
    "the program (see the lineages); the dump is incomplete, so this is no all-clear."
)


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
        ({"op_type": op, "kind": kind, "count": n, "first_index": first}
         for (op, kind), (n, first) in per_op.items()),
        key=lambda d: (-d["count"], d["op_type"]),
    )  # fmt: skip
    a.by_step = [
        {"step": s, "count": steps[s][0],
         "first": {"kind": steps[s][1][1], "index": steps[s][1][2]}}
        for s in sorted(steps)
    ]  # fmt: skip
    return a


def _origin_kind(origin: EventView) -> str:
    """``entered`` (from outside the recorded ops), ``born`` here, or ``unknown``."""
    if origin.external_input:
        return "entered"
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
        return "unknown"
    return "born"


def analyze(
    reader: DumpReader, lookback: int = 5000, headroom_format: str | None = None
) -> Analysis:
    """Find the alerts, the origin, the first -inf/+inf, the first NaN and the chain between,
    and how close values came to overflow and underflow (measured against
    ``headroom_format``, e.g. ``"float8_e4m3fn"``, or else each value's own format)."""
    result = _analyze(reader, lookback)
    result.headroom = analyze_headroom(reader, headroom_format, result.first_harm)
    # Again at the end: decoding the events found damage that indexing from a sidecar did not.
    result.problems = [p.to_json() for p in reader.problems]
    result.incomplete = [p.to_json() for p in reader.incomplete]
    if result.incomplete and result.found and not result.found_harmful:
        # Said of what was read; what is missing may hold what it would change.
        result.notes = [n.replace(NOTHING_HARMFUL, NOTHING_HARMFUL_READ) for n in result.notes]
    return result


def _analyze(reader: DumpReader, lookback: int) -> Analysis:
    mode = reader.tensor_debug_mode
    rows_e = reader.index(EXECUTIONS)
    rows_t = reader.index(TRACES)
    # Each kind's own min and max: no copy of every step (25M of them at 256 ranks).
    bounds = [(int(r["step"].min()), int(r["step"].max())) for r in (rows_e, rows_t) if len(r)]
    result = Analysis(
        logdir=str(reader.logdir),
        logdirs=[str(d) for d in reader.logdirs],
        run_id=reader.run_id,
        framework=reader.framework,
        tensor_debug_mode=mode.name if mode is not None else None,
        processes=[p.to_json() for p in reader.processes],
        num_executions=reader.num_executions(),
        num_graph_execution_traces=reader.num_graph_execution_traces(),
        # Steps nobody counted (TensorFlow's dumps without a training function): say
        # "unknown" rather than "step 0".
        steps=[min(b[0] for b in bounds), max(b[1] for b in bounds)]
        if bounds and reader.steps_known
        else None,
        alerts=count_alerts(reader),
        problems=[p.to_json() for p in reader.problems],
    )
    if result.steps is None:
        result.alerts.by_step = []  # every event reads step 0: no step to name
    if mode is not None and mode not in HEALTH_MODES and mode != TensorDebugMode.FULL_TENSOR:
        result.notes.append(
            f"This dump was written in {mode.name} mode, which records which ops ran but not "
            "whether their values were finite: no Inf/NaN can be found in it. Record again with "
            "tensor_debug_mode='FULL_HEALTH'."
        )
        return result
    if mode == TensorDebugMode.CURT_HEALTH:
        result.notes.append(
            "CURT_HEALTH records only whether each tensor had any Inf/NaN: counts, the first "
            "-inf/+inf versus the first NaN, and most explanations need CONCISE_HEALTH or FULL_HEALTH."
        )
    _eviction(reader, result)
    first = reader.first_nonfinite()
    _tensorflow_buffer(reader, result, found=first is not None)
    if first is None:
        return result
    # Several processes: the rank where it was born, by the collectives that carried it.
    result.ranks = analyze_ranks(reader)
    origin_process: int | None = None
    if result.ranks is not None and result.ranks.origin is not None:
        first = result.ranks.origin
        origin_process = result.ranks.origin_process
    views = ViewBuilder(reader, lookback)
    try:
        origin = views.view(first.kind, first.index)
    except UNREADABLE as exc:
        result.notes.append(f"The first event with Inf/NaN could not be decoded: {exc}")
        return result
    result.origin = origin
    result.origin_kind = _origin_kind(origin)
    # A circular buffer may have evicted the producer: say when the inputs are unknown.
    if (
        origin.kind == EXECUTIONS
        and not origin.external_input
        and any(i.producer is None and i.counts is None for i in origin.inputs)
    ):
        result.notes.append(
            "Some inputs of the origin were produced before the recorded window or outside "
            "the recorded ops; their values are unknown."
        )
    cache: dict[tuple[str, int], EventView] = {(origin.kind, origin.index): origin}

    def view(kind: str, index: int) -> EventView | None:
        key = (kind, index)
        if key not in cache:
            try:
                cache[key] = views.view(kind, index)
            except UNREADABLE as exc:
                result.notes.append(
                    f"{kind.replace('_', ' ')} #{index} could not be decoded: {exc}"
                )
                return None
        return cache[key]

    # The first -inf/+inf and NaN: the origin's rank's (every other rank's came later).
    inf_at = reader.first_where("inf", process=origin_process)[1] or reader.first_where("inf")[1]
    nan_at = reader.first_where("nan", process=origin_process)[1] or reader.first_where("nan")[1]
    result.first_inf = view(inf_at.kind, inf_at.index) if inf_at else None
    result.first_nan = view(nan_at.kind, nan_at.index) if nan_at else None
    _judge(reader, result, view)
    if result.ranks is not None and result.found_harmful:
        # Where benign masks were made on every rank is no news: only harm gets the ranks' say.
        result.notes.extend(result.ranks.notes)
    for v in (result.origin, result.cause, result.first_inf, result.first_nan):
        if v is not None:
            views.add_context(v)
    # Where in a library each event the report names ran (``library_source``).
    for v in (result.origin, result.cause, result.first_inf, result.first_nan,
              result.state_nonfinite):  # fmt: skip
        if v is not None and (lib := _library_source(reader, v)) is not None:
            result.library_sources[(v.kind, v.index)] = lib
    return result


def _judge(reader: DumpReader, result: Analysis, view: Any) -> None:
    """Lineages, the cause, whether any Inf/NaN was harmful, and the chain to the first NaN."""
    # Ranks that received their Inf/NaN from another need no lineages of their own: their
    # values are the origin's (and following them on every rank of a large run is slow).
    skip = (
        {st.process for st in result.ranks.states if st.role == "received"}
        if result.ranks
        else set()
    )
    lineages, complete = find_lineages(reader, skip=skip)
    written = _state_write(reader, lineages)
    result.state_nonfinite = view(EXECUTIONS, written) if written is not None else None
    if not complete:
        result.notes.append(
            "Lineages were followed through the first "
            "events after the first Inf/NaN only (the dump is very long); later events may "
            "change their verdict."
        )
    # Lineages first seen after events the circular buffer dropped: their births are gone.
    cut = [lin for lin in lineages if lin.after_gap]
    if cut:
        result.notes.append(
            f"{len(cut)} Inf/NaN value{'s' if len(cut) != 1 else ''} came from events the "
            "circular buffer dropped; record with circular_buffer_size=-1 to see their births."
        )
    # Where no lineage could be built (undecodable events), stay on the safe side.
    result.found_harmful = any(lin.verdict == "harmful" for lin in lineages) or (
        result.found and not lineages
    )
    result.birth_verdicts = {(lin.kind, lin.birth): lin.verdict for lin in lineages}
    kept = [lin for lin in lineages if not lin.after_gap]
    harmful = [lin for lin in kept if lin.verdict == "harmful"]
    result.lineages = _groups(reader, kept, view)
    cause = _pick_cause(harmful, result.first_nan)
    made = _made_elsewhere(cause, harmful)
    if cause is not None and made is not None:
        result.notes.append(
            f"The values that {short_name(str(cause.signature[0]))} #{cause.birth} brought into "
            f"{reader.processes[cause.process].label} were made in another process "
            f"({reader.processes[made.process].label}: a DataLoader worker or another process "
            "the program started); the cause is where that process made them."
        )
        cause = made
    if cause is None:
        # Harm whose birth was dropped: name the earliest event kept of it (the one that
        # holds the first NaN first), and what was lost (docs/ROOT_CAUSE.md, "Circular buffers").
        cause = _pick_cause([lin for lin in cut if lin.verdict == "harmful"], result.first_nan)
        if cause is not None:
            result.cause_evicted = _lost_before(reader, cause)
            if (g := _groups(reader, [cause], view)) and result.cause_evicted is not None:
                g[0].birth_evicted = True
                result.lineages.append(g[0])
    if cause is not None:
        result.cause = view(cause.kind, cause.birth)
        if result.cause is not None and result.cause_evicted is not None:
            # Its input's producer was dropped, not outside the program: say so, in every
            # place the event is shown (the cause box, the lineage list, the headline).
            result.cause.explanation = explain_dropped(result.cause.counts)
        elif result.cause is not None:
            _no_intended_mask(result.cause)
        # The lineage's own first NaN (the first NaN of all when it is in this lineage).
        end = view(cause.kind, cause.first_nan) if cause.first_nan is not None else None
        if result.cause is not None:
            result.chain = _chain(reader, result.cause, end, view) if end else [result.cause]
    for group in result.lineages:
        if group.kind == "harmful":
            _no_intended_mask(group.birth)
    result.notes.extend(_verdict_notes(result, cause))


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
        lin for lin in harmful
        if lin.process != cause.process and lin.wall_time <= cause.wall_time
        and not (lin.signature and is_load(str(lin.signature[0])))
    ]  # fmt: skip
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
    return {"kind": lin.kind, "process": lin.process, "steps": steps,
            "events": sum(n for _, n in gaps)}  # fmt: skip


def _verdict_notes(result: Analysis, cause: Lineage | None) -> list[str]:
    """What the notes say of the verdict, each claim derived from the lineages' verdicts
    (``result.birth_verdicts``) so that no note contradicts the lineage list."""
    notes: list[str] = []
    origin = result.origin
    if cause is None:
        if result.found_harmful:
            notes.append(LINEAGES_NOT_FOLLOWED)
        elif result.found:
            notes.append(NOTHING_HARMFUL)
        return notes
    if result.cause_evicted is not None:
        lost = result.cause_evicted
        notes.append(
            f"The cause's birth is not in the dump: it was among {evicted_span(lost)}. The "
            f"cause shown ({_name(result.cause)}) is the earliest event kept that holds its "
            "values; record with circular_buffer_size=-1 to see the birth."
        )
    if origin is None or (origin.kind, origin.index) == (cause.kind, cause.birth):
        return notes
    named = _name(result.cause)
    fnan = result.first_nan
    if fnan is not None and fnan.kind == cause.kind and fnan.index in cause.members:
        made = "which" if fnan.index == cause.birth else f"whose values (#{fnan.index})"
        named += f", {made} made the first NaN"
    verdict = result.birth_verdicts.get((origin.kind, origin.index))
    first = f"The first Inf/NaN ({_name(origin)})"
    if verdict == "harmful":
        notes.append(
            f"{first} is harmful too (see the lineages); the cause is a separate birth, {named}."
        )
    elif verdict in ("benign", "handled"):
        how = "absorbed by a later op" if verdict == "benign" else "handled by the loss scaler"
        notes.append(
            f"{first} was {verdict} ({how}); the harmful values were born separately: the "
            f"cause is {named}."
        )
    else:
        notes.append(f"{first} is not in the cause's lineage; the cause is {named}.")
    return notes


def _name(v: EventView | None) -> str:
    return f"{v.op_name} #{v.index}" if v is not None else "?"


def _eviction(reader: DumpReader, result: Analysis) -> None:
    """How many events the circular buffers dropped, and a note where the recording has gaps."""
    result.evicted = {kind: reader.evicted(kind) for kind in (EXECUTIONS, TRACES)}
    for kind, n in result.evicted.items():
        if not n:
            continue
        gaps = reader.gaps(kind)
        kept = reader.num(kind)
        result.notes.append(
            f"The circular buffer dropped {n:,} {kind.replace('_', ' ')}s of {n + kept:,} "
            f"({len(gaps)} gap{'s' if len(gaps) != 1 else ''}; windows around each new kind of "
            "Inf/NaN and the first NaN are kept). Record with circular_buffer_size=-1 to keep "
            "everything."
        )


# TensorFlow's enable_dump_debug_info keeps this many events of each kind by default.
TF_DEFAULT_BUFFER = 1000


def _tensorflow_buffer(reader: DumpReader, result: Analysis, *, found: bool) -> None:
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
        counts = {
            kind: int(np.count_nonzero(reader.processes_of(kind) == proc.index))
            for kind in (EXECUTIONS, TRACES)
        }
        if not found:
            result.notes.append(
                "TensorFlow wrote this dump, and its files do not say whether it kept every "
                "event: with a circular buffer (enable_dump_debug_info keeps the last "
                f"{TF_DEFAULT_BUFFER} executions and {TF_DEFAULT_BUFFER} graph execution traces "
                "by default) the first events may not have been kept, and an Inf/NaN among them "
                "is not seen here. Record with circular_buffer_size=-1, or with nanscope run, "
                "to be sure."
            )
            return
        full = [k for k, n in counts.items() if n == TF_DEFAULT_BUFFER]
        if full:
            what = " and ".join(f"{TF_DEFAULT_BUFFER} {k.replace('_', ' ')}s" for k in full)
            result.notes.append(
                f"TensorFlow wrote this dump, and it holds exactly {what}, as many as "
                "enable_dump_debug_info's circular buffer keeps by default: earlier events may "
                "not have been kept, and the first Inf/NaN of the run with them. Record with "
                "circular_buffer_size=-1, or with nanscope run, to be sure."
            )
            return


def _groups(reader: DumpReader, lineages: list[Lineage], view: Any) -> list[LineageGroup]:
    """Lineages grouped by verdict and birth place, in order of their first birth."""
    groups: dict[tuple[Any, ...], LineageGroup] = {}
    for lin in lineages:
        key = (lin.verdict, lin.kind, lin.process, lin.signature)
        g = groups.get(key)
        if g is None:
            birth = view(lin.kind, lin.birth)
            if birth is None:
                continue
            g = groups[key] = LineageGroup(
                kind=lin.verdict,
                birth=birth,
                count=0,
                reaches=list(lin.reaches),
                absorbed_at=_absorber(reader, lin),
                handled_at=_ref(lin.kind, lin.handled_at),
            )
        g.count += 1
        g.recomputed += len(lin.recomputed)
        g.reaches.extend(r for r in lin.reaches if r not in g.reaches)
        if lin.verdict == "handled" and lin.handled_at is not None:
            step = int(reader.index(lin.kind)["step"][lin.handled_at])
            if step not in g.skipped_steps:
                g.skipped_steps.append(step)
    return list(groups.values())


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
        if lin.kind != EXECUTIONS or lin.verdict != "harmful":
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
            if ex.phase == OPTIMIZER and _in_place(ex.op_type):
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
