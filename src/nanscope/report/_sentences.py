"""What the analysis says, in words: the headline and the notes of a report.

The analysis (``nanscope/analysis``) finds facts, its notes among them
(``analysis/_notes.py``); every sentence made of them is written here, once, so that the
logic holds no prose and each wording has one home. The JSON report's ``headline`` and
``notes`` are these sentences (``docs/REPORT_JSON.md``); the terminal report and the GUI
print them as they are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nanscope.analysis import Analysis, EventView, Note, RankVerdict
from nanscope.analysis import _notes as notes
from nanscope.analysis._notes import TF_DEFAULT_BUFFER
from nanscope.vocabulary import LineageVerdict, OriginKind, Verdict

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
CURT_HEALTH = (
    "CURT_HEALTH records only whether each tensor had any Inf/NaN: counts, the first "
    "-inf/+inf versus the first NaN, and most explanations need CONCISE_HEALTH or FULL_HEALTH."
)
ORIGIN_INPUTS_UNKNOWN = (
    "Some inputs of the origin were produced before the recorded window or outside "
    "the recorded ops; their values are unknown."
)
NO_RANK_BORN = (
    "Every rank with Inf/NaN received it from another (records are missing?); "
    "the origin is chosen by clock."
)
LINEAGES_CUT_SHORT = (
    "Lineages were followed through the first "
    "events after the first Inf/NaN only (the dump is very long); later events may "
    "change their verdict."
)


def _kind(kind: str, n: int = 1) -> str:
    """``execution``, ``graph execution traces``: an event kind as prose."""
    return kind.replace("_", " ") + ("s" if n != 1 else "")


def _name(v: EventView | None) -> str:
    return f"{v.op_name} #{v.index}" if v is not None else "?"


def evicted_span(lost: dict[str, Any]) -> str:
    """``the 412 executions the circular buffer dropped (steps 2–38)``."""
    steps = lost.get("steps")
    span = ""
    if steps is not None:
        span = f" (steps {steps[0]}–{steps[1]})" if steps[0] != steps[1] else f" (step {steps[0]})"
    n = lost["events"]
    return f"the {n:,} {_kind(lost['kind'], n)} the circular buffer dropped{span}"


# -- the headline ----------------------------------------------------------------------------


def headline(a: Analysis) -> str | None:
    """One sentence on the cause: ``aten.log.default produced -inf at step 3: log of zero...``;
    for a run whose Inf/NaN were all benign or handled, says so; for an incomplete dump
    with no harm found, says that no verdict can be given. None where no Inf/NaN was
    recorded (the JSON report's ``headline``)."""
    o = a.cause
    if o is None:
        if a.verdict == Verdict.INCOMPLETE:
            return no_verdict(len(a.incomplete), a.found)
        if not a.found:
            return None
        if a.found_harmful:
            # No lineage to name (events that could not be decoded): harmful to be safe.
            first = a.first_nan or a.origin
            return harmful_unfollowed(first, first is a.first_nan)
        return nothing_harmful([(g.kind, g.count) for g in a.lineages])
    # The cause's own kind, not the origin's: they may be different events.
    text = cause_sentence(
        o,
        a.cause_kind or OriginKind.BORN,
        steps_known=a.steps is not None,
        processes=len(a.processes),
    )
    return cause_headline(text, o, a.cause_evicted)


def cause_sentence(
    o: EventView, origin_kind: OriginKind, *, steps_known: bool, processes: int
) -> str:
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
    verb = "passed on" if origin_kind == OriginKind.ENTERED else "produced"
    where = [f"step {o.step}"] if steps_known else []
    if o.rank is not None and processes > 1:
        where.append(f"rank {o.rank}")
    name = o.op_type if o.op_name == o.op_type else f"{o.op_name} ({o.op_type})"
    text = f"{name} {verb} {what}" + (f" at {', '.join(where)}" if where else "")
    return f"{text}: {o.explanation}" if o.explanation else text


def cause_headline(text: str, cause: EventView, evicted: dict[str, Any] | None) -> str:
    """The headline of a harmful dump, from the cause's own sentence: led by what the
    circular buffer dropped, or for a backward op by the forward line the user wrote."""
    if evicted is not None:
        return f"the harmful Inf/NaN was born in {evicted_span(evicted)}; the earliest kept: {text}"
    fwd = cause.forward_source
    if fwd is not None:
        # A backward op: the line to fix is the forward call the user wrote.
        code = f" `{fwd.code}`" if fwd.code else ""
        what = cause.forward_op or "the op called there"
        return f"{Path(fwd.file).name}:{fwd.line}{code}: the backward of {what}: {text}"
    return text


def no_verdict(problems: int, found: bool) -> str:
    """The headline of an incomplete dump with no harm found."""
    seen = "only absorbed or handled Inf/NaN" if found else "no Inf/NaN"
    return (
        f"no verdict: the dump is incomplete ({problems} problem{'s' if problems != 1 else ''}); "
        f"{seen} in the events that could be read"
    )


def harmful_unfollowed(first: EventView | None, is_nan: bool) -> str:
    """The headline where no lineage could be followed: harmful, to be safe."""
    at = f" ({first.op_name} #{first.index})" if first is not None else ""
    return (
        f"harmful Inf/NaN, counted so to be safe: its lineage could not be "
        f"followed; the first {'NaN' if is_nan else 'Inf/NaN'}"
        f"{at} is shown"
    )


def nothing_harmful(verdicts: Sequence[tuple[LineageVerdict, int]]) -> str:
    """``no harmful Inf/NaN: every lineage was absorbed or handled (3 benign)``."""
    kinds = Counter[str]()
    for kind, count in verdicts:
        kinds[kind] += count
    told = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return f"no harmful Inf/NaN: every lineage was absorbed or handled ({told})"


# -- notes -----------------------------------------------------------------------------------


def note_texts(a: Analysis) -> list[str]:
    """The analysis's notes, one sentence each, in the order they were found (the JSON
    report's ``notes``)."""
    return [note_text(note) for note in a.notes]


def note_text(note: Note) -> str:
    """One note of the analysis (a fact of ``analysis/_notes.py``) as a sentence."""
    match note:
        case notes.NoHealth(mode):
            return no_health(mode)
        case notes.CurtHealth():
            return CURT_HEALTH
        case notes.Evicted(kind, dropped, kept, gaps):
            return evicted(kind, dropped, kept, gaps)
        case notes.TensorflowBufferUnknown():
            return tensorflow_buffer_unknown()
        case notes.TensorflowBufferFull(kinds):
            return tensorflow_buffer_full(kinds)
        case notes.UndecodableOrigin(error):
            return f"The first event with Inf/NaN could not be decoded: {error}"
        case notes.Undecodable(kind, index, error):
            return f"{_kind(kind)} #{index} could not be decoded: {error}"
        case notes.OriginInputsUnknown():
            return ORIGIN_INPUTS_UNKNOWN
        case notes.LineagesCutShort():
            return LINEAGES_CUT_SHORT
        case notes.BirthsDropped(count):
            return births_dropped(count)
        case notes.MadeElsewhere(load, index, here, there):
            return made_elsewhere(load, index, here, there)
        case notes.CauseEvicted(lost, cause):
            return cause_evicted(lost, cause)
        case notes.FirstIsNotTheCause(origin, verdict, cause, made_first_nan, cause_birth):
            return first_is_not_the_cause(origin, verdict, cause, made_first_nan, cause_birth)
        case notes.LineagesNotFollowed():
            return LINEAGES_NOT_FOLLOWED
        case notes.NothingHarmful(incomplete):
            return NOTHING_HARMFUL_READ if incomplete else NOTHING_HARMFUL
        case notes.NoRankBorn():
            return NO_RANK_BORN
        case notes.CollectiveMadeIt(label):
            return collective_made_it(label)
        case notes.BornByClock(names, aligned):
            return born_by_clock(names, aligned)
    raise TypeError(f"not a note of the analysis: {note!r}")


def no_health(mode: str) -> str:
    return (
        f"This dump was written in {mode} mode, which records which ops ran but not "
        "whether their values were finite: no Inf/NaN can be found in it. Record again with "
        "tensor_debug_mode='FULL_HEALTH'."
    )


def evicted(kind: str, n: int, kept: int, gaps: int) -> str:
    return (
        f"The circular buffer dropped {n:,} {_kind(kind, 2)} of {n + kept:,} "
        f"({gaps} gap{'s' if gaps != 1 else ''}; windows around each new kind of "
        "Inf/NaN and the first NaN are kept). Record with circular_buffer_size=-1 to keep "
        "everything."
    )


def tensorflow_buffer_unknown() -> str:
    return (
        "TensorFlow wrote this dump, and its files do not say whether it kept every "
        "event: with a circular buffer (enable_dump_debug_info keeps the last "
        f"{TF_DEFAULT_BUFFER} executions and {TF_DEFAULT_BUFFER} graph execution traces "
        "by default) the first events may not have been kept, and an Inf/NaN among them "
        "is not seen here. Record with circular_buffer_size=-1, or with nanscope run, "
        "to be sure."
    )


def tensorflow_buffer_full(kinds: Sequence[str]) -> str:
    what = " and ".join(f"{TF_DEFAULT_BUFFER} {_kind(k, 2)}" for k in kinds)
    return (
        f"TensorFlow wrote this dump, and it holds exactly {what}, as many as "
        "enable_dump_debug_info's circular buffer keeps by default: earlier events may "
        "not have been kept, and the first Inf/NaN of the run with them. Record with "
        "circular_buffer_size=-1, or with nanscope run, to be sure."
    )


def births_dropped(n: int) -> str:
    return (
        f"{n} Inf/NaN value{'s' if n != 1 else ''} came from events the "
        "circular buffer dropped; record with circular_buffer_size=-1 to see their births."
    )


def made_elsewhere(load: str, index: int, here: str, there: str) -> str:
    return (
        f"The values that {load} #{index} brought into "
        f"{here} were made in another process "
        f"({there}: a DataLoader worker or another process "
        "the program started); the cause is where that process made them."
    )


def cause_evicted(lost: dict[str, Any], cause: EventView | None) -> str:
    return (
        f"The cause's birth is not in the dump: it was among {evicted_span(lost)}. The "
        f"cause shown ({_name(cause)}) is the earliest event kept that holds its "
        "values; record with circular_buffer_size=-1 to see the birth."
    )


def first_is_not_the_cause(
    origin: EventView,
    verdict: LineageVerdict | None,
    cause: EventView | None,
    made_first_nan: int | None,
    cause_birth: int,
) -> str:
    """What the note says where the first Inf/NaN is not the cause's birth, from the
    first one's lineage verdict (so that no note contradicts the lineage list)."""
    named = _name(cause)
    if made_first_nan is not None:
        made = "which" if made_first_nan == cause_birth else f"whose values (#{made_first_nan})"
        named += f", {made} made the first NaN"
    first = f"The first Inf/NaN ({_name(origin)})"
    if verdict == LineageVerdict.HARMFUL:
        return f"{first} is harmful too (see the lineages); the cause is a separate birth, {named}."
    if verdict in (LineageVerdict.BENIGN, LineageVerdict.HANDLED):
        how = (
            "absorbed by a later op"
            if verdict == LineageVerdict.BENIGN
            else "handled by the loss scaler"
        )
        return (
            f"{first} was {verdict} ({how}); the harmful values were born separately: the "
            f"cause is {named}."
        )
    return f"{first} is not in the cause's lineage; the cause is {named}."


def collective_made_it(label: str) -> str:
    """The note where a collective's result was the first Inf/NaN on every rank."""
    return (
        f"Every rank's values were finite going into {label} "
        "and Inf/NaN coming out: the collective made it (its result overflowed?)."
    )


def born_by_clock(names: Sequence[str], aligned: bool) -> str:
    """The note where no collective orders the ranks' births: the earliest by clock
    (``names[0]``) is named."""
    clocks = (
        ", clocks aligned on the collective that followed" if aligned else "; clocks not aligned"
    )
    return (
        f"{', '.join(names)} made Inf/NaN on their own between the same collectives: no "
        f"collective orders them, so the earliest by clock is named ({names[0]}{clocks})."
    )


def rank_note_texts(v: RankVerdict) -> list[str]:
    """The ranks' notes, one sentence each (the JSON report's ``ranks.notes``)."""
    return [note_text(n) for n in v.notes]
