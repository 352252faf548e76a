"""The analysis every surface renders: alerts, the origin of the first Inf/NaN, and why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.analysis._explain import born_from_output
from nanscope.analysis._headroom import Headroom, analyze_headroom
from nanscope.analysis._lineages import Lineage, find_lineages
from nanscope.analysis._ranks import RankVerdict, analyze_ranks
from nanscope.analysis._views import EventView, ViewBuilder
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

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "birth": self.birth.to_json(), "count": self.count,
                "reaches": self.reaches, "absorbed_at": self.absorbed_at,
                "handled_at": self.handled_at, "skipped_steps": self.skipped_steps}  # fmt: skip


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
    found_harmful: bool = False
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
            if not self.found or self.found_harmful:
                return None
            kinds = Counter(g.kind for g in self.lineages for _ in range(g.count))
            told = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            return f"no harmful Inf/NaN: every lineage was absorbed or handled ({told})"
        c = o.counts
        if c.nan:
            what = "NaN"
        elif c.neg_inf and not c.pos_inf:
            what = "-inf"
        elif c.pos_inf and not c.neg_inf:
            what = "+inf"
        else:
            what = "Inf/NaN"
        verb = "passed on" if self.origin_kind == "entered" else "produced"
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
            return v.to_json() if v is not None else None

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
            "first_inf": ev(self.first_inf),
            "first_nan": ev(self.first_nan),
            "lineages": [g.to_json() for g in self.lineages],
            "evicted": self.evicted,
            "chain": [c.to_json() for c in self.chain],
            "ranks": self.ranks.to_json() if self.ranks is not None else None,
            "headroom": self.headroom.to_json() if self.headroom is not None else None,
            "notes": self.notes,
            "problems": self.problems,
        }


NOTHING_HARMFUL = (
    "Every Inf/NaN recorded was absorbed by a later op or handled by the program "
    "(see the lineages): nothing harmful."
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
    lineages = [lin for lin in lineages if not lin.after_gap]
    harmful = [lin for lin in lineages if lin.verdict == "harmful"]
    result.lineages = _groups(reader, lineages, view)
    first_nan = result.first_nan
    cause: Lineage | None = None
    if first_nan is not None:
        cause = next(
            (lin for lin in harmful
             if lin.kind == first_nan.kind and first_nan.index in lin.members),
            None,
        )  # fmt: skip
    if cause is None:
        with_nan = [lin for lin in harmful if lin.first_nan is not None]
        cause = (min(with_nan, key=lambda lin: (lin.kind, lin.first_nan or 0)) if with_nan
                 else harmful[0] if harmful else None)  # fmt: skip
    if cause is not None:
        result.cause = view(cause.kind, cause.birth)
        # The lineage's own first NaN (the first NaN of all when it is in this lineage).
        end = view(cause.kind, cause.first_nan) if cause.first_nan is not None else None
        if result.cause is not None:
            result.chain = _chain(reader, result.cause, end, view) if end else [result.cause]
        origin = result.origin
        if (
            origin is not None
            and result.first_nan is not None
            and (origin.kind, origin.index) != (cause.kind, cause.birth)
        ):
            result.notes.append(
                f"The first Inf/NaN ({origin.op_name} #{origin.index}) is not what made the "
                f"harmful values: the cause is {result.cause.op_name if result.cause else '?'} "
                f"#{cause.birth}, born separately."
            )
    elif result.found:
        result.notes.append(NOTHING_HARMFUL)


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
                absorbed_at=_ref(lin.kind, lin.absorbed_at),
                handled_at=_ref(lin.kind, lin.handled_at),
            )
        g.count += 1
        g.reaches.extend(r for r in lin.reaches if r not in g.reaches)
        if lin.verdict == "handled" and lin.handled_at is not None:
            step = int(reader.index(lin.kind)["step"][lin.handled_at])
            if step not in g.skipped_steps:
                g.skipped_steps.append(step)
    return list(groups.values())


def _ref(kind: str, index: int | None) -> dict[str, Any] | None:
    return None if index is None else {"kind": kind, "index": index}


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
