"""The report of a sentinel's logdir: the answer, the steps that led to it, the replay.

A sentinel (``nanscope.sentinel``) checks a training run once per step and keeps a
history (``sentinel.jsonl``); each step where it saw Inf/NaN was a *trip*, and a trip
it replayed left a normal dump in ``replay-step-<N>/``. :class:`SentinelRun` holds the
history and the replays' analyses, read by the caller (``nanscope report``): this
module reads no files. Its words:

- the answer first (:func:`sentinel_headline`): where the sentinel tripped and what the
  replay found there, or how many steps were checked with no Inf/NaN; never an
  all-clear for a history that did not end or was damaged (exit status 2), and a trip
  that was not replayed, or whose replay did not bring the Inf/NaN back, says so;
- the steps up to the bad one (loss, gradient norm, largest ``|x|``), with a trend of
  the whole run;
- the replayed step's own report, as ``nanscope report replay-step-<N>`` prints it.

Exit status: 0 the history is whole and no step saw Inf/NaN; 1 the sentinel saw
Inf/NaN (whatever else is missing); 2 no Inf/NaN was seen but the history is incomplete
or checked no step: no all-clear can be given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from nanscope.analysis import Analysis
from nanscope.report._json import report_json
from nanscope.report._sentences import headline
from nanscope.report._text import render_text
from nanscope.sentinel._history import (
    SentinelHistory,
    StepRecord,
    Trip,
    json_float,
    steps_before,
)
from nanscope.vocabulary import Verdict

SCHEMA = "nanscope.sentinel/1"

# Steps shown before a trip (and at the end of a clean run).
LEAD_UP = 10
# Characters of the trend lines.
TREND_WIDTH = 48

_WHERE = {
    "loss": "loss",
    "gradients": "gradients",
    "parameters": "parameters",
    "optimizer_state": "optimizer state",
}
# The largest finite value of the formats modules compute in, for the headroom column.
_FORMAT_MAX = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
    "float8_e4m3fn": 448.0,
    "float8_e5m2": 57344.0,
}


@dataclass(frozen=True)
class SentinelReplay:
    """A trip and its replay dump as read: the dump's analysis, or why there is none.

    ``path`` is the replay dump's directory (``None`` when the trip has no replay);
    ``problem`` says why ``analysis`` is missing when the trip named a replay.
    """

    trip: Trip
    path: Path | None = None
    analysis: Analysis | None = None
    problem: str | None = None


@dataclass(frozen=True)
class SentinelRun:
    """A sentinel's logdir read: its history and, per trip in order, the replay."""

    history: SentinelHistory
    replays: tuple[SentinelReplay, ...] = ()
    # Set by the reader when the logdir holds replay dumps no trip names.
    notes: tuple[str, ...] = field(default=())

    @property
    def unrecorded(self) -> tuple[StepRecord, ...]:
        """Steps that saw Inf/NaN without a trip record (the process died before writing
        it), and steps whose parameters or optimizer state were measured non-finite
        without being flagged: evidence of Inf/NaN all the same."""
        tripped = {t.step for t in self.history.trips}
        out = []
        for s in self.history.steps:
            if s.step in tripped:
                continue
            if s.bad or _nonfinite(s.param_amax) or _nonfinite(s.state_amax):
                out.append(s)
        return tuple(out)

    @property
    def tripped(self) -> bool:
        """Whether the sentinel saw Inf/NaN in any step."""
        return bool(self.history.trips) or bool(self.unrecorded)

    @property
    def verdict(self) -> str:
        """``tripped``, ``incomplete`` (no Inf/NaN seen, but no all-clear) or ``clean``."""
        if self.tripped:
            return "tripped"
        if not self.history.complete or not self.history.steps:
            return "incomplete"
        return "clean"

    @property
    def exit_status(self) -> int:
        """``nanscope report``'s exit status: 1 tripped, 2 incomplete, 0 clean."""
        return {"tripped": 1, "incomplete": 2, "clean": 0}[self.verdict]


def _nonfinite(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)


def _where_text(where: Sequence[str]) -> str:
    names = [_WHERE.get(w, w) for w in where] or ["a check"]
    return f"{' and '.join(names)} non-finite"


def _steps_count(h: SentinelHistory) -> str:
    n = len(h.steps)
    if not n:
        return "no steps"
    first, last = h.steps[0].step, h.steps[-1].step
    span = f"step {first:,}" if first == last else f"steps {first:,}–{last:,}"
    return f"{n:,} step{'s' if n != 1 else ''} checked ({span})"


def _cause_text(r: SentinelReplay) -> str | None:
    """The replay's cause as one sentence with its line (``... at train.py:12``)."""
    a = r.analysis
    if a is not None and a.found_harmful:
        said = headline(a) or "a harmful Inf/NaN"
        v = a.cause
        src = None if v is None else (v.forward_source or v.source)
        if src is not None:
            place = f"{Path(src.file).name}:{src.line}"
            if place not in said:
                said = f"{said} (at {src.file}:{src.line})"
        return said
    c = r.trip.cause
    if c is not None:
        place = f" (at {c.file}:{c.line})" if c.file and c.line is not None else ""
        return f"{c.headline}{place}"
    return None


def replay_words(r: SentinelReplay) -> str:
    """What came of a trip's replay, in one clause: its cause, or why there is none."""
    t = r.trip
    if t.replay is None:
        why = t.reason or "the sentinel gave no reason"
        return f"not replayed ({why}): the op that made the Inf/NaN is unknown"
    if t.reproduced is False:
        return (
            "the replay did not reproduce the Inf/NaN: the same batch, RNG states and state "
            "gave finite values (non-determinism, or a transient hardware fault)"
        )
    cause = _cause_text(r)
    if r.analysis is None and r.problem is None:  # the caller did not read the dump
        return f"replayed into {t.replay}" + (f": {cause}" if cause else "")
    if r.analysis is None:
        told = f"; the sentinel noted: {cause}" if cause else ""
        return f"its replay dump {t.replay} cannot be read ({r.problem}){told}"
    if cause is not None and r.analysis.found_harmful:
        return f"replayed: {cause}"
    if r.analysis.verdict == Verdict.INCOMPLETE:
        return f"the replay dump {t.replay} is incomplete and names no cause"
    return f"the replay dump {t.replay} records no harmful Inf/NaN"


def sentinel_headline(run: SentinelRun) -> str:
    """The answer in one sentence (the text report prints it first, marked ✓, ✗ or ?)."""
    h = run.history
    if run.tripped:
        trips = list(run.replays) or [SentinelReplay(t) for t in h.trips]
        if trips:
            first = trips[0]
            t = first.trip
            said = f"the sentinel tripped at step {t.step:,} ({_where_text(t.where)})"
            if len(trips) > 1:
                steps = ", ".join(f"{x.trip.step:,}" for x in trips[:6])
                more = ", ..." if len(trips) > 6 else ""
                said = (
                    f"the sentinel tripped {len(trips)} times (steps {steps}{more}); "
                    f"first at step {t.step:,} ({_where_text(t.where)})"
                )
            said = f"{said}; {replay_words(first)}"
            unrec = run.unrecorded
            if unrec:
                said += f"; and Inf/NaN at step {unrec[0].step:,} without a trip record"
            return said
        s = run.unrecorded[0]
        where = s.bad or tuple(
            w
            for w, x in (("parameters", s.param_amax), ("optimizer_state", s.state_amax))
            if _nonfinite(x)
        )
        return (
            f"the sentinel saw Inf/NaN at step {s.step:,} ({_where_text(where)}) but recorded "
            "no trip for it (the program ended before the trip was written): not replayed"
        )
    if not h.steps:
        return "the sentinel checked no steps: there is nothing to vouch for"
    if h.error is not None and h.ended and not h.problems:
        return (
            f"no Inf/NaN in the {len(h.steps):,} steps checked, but the program ended by an "
            f"error after step {h.last_step}: {h.error}; steps after it were never checked, "
            "so this is no all-clear"
        )
    if not h.complete:
        return (
            f"no Inf/NaN in the {len(h.steps):,} steps written, but the history is "
            "incomplete: steps after them are unknown, so this is no all-clear"
        )
    return f"{_steps_count(h)}, no Inf/NaN"


# -- JSON -------------------------------------------------------------------------------------


_num = json_float  # as in sentinel.jsonl


def step_json(s: StepRecord) -> dict[str, Any]:
    """One step of the history as JSON."""
    return {
        "step": s.step,
        "time": s.time,
        "loss": _num(s.loss),
        "grad_norm": _num(s.grad_norm),
        "grad_amax": _num(s.grad_amax),
        "param_amax": _num(s.param_amax),
        "state_amax": _num(s.state_amax),
        "module_amax": [_num(x) for x in s.module_amax],
        "bad": list(s.bad),
    }


def _trip_json(r: SentinelReplay) -> dict[str, Any]:
    t = r.trip
    cause = None
    if t.cause is not None:
        c = t.cause
        cause = {
            "headline": c.headline,
            "op_type": c.op_type,
            "file": c.file,
            "line": c.line,
            "step": c.step,
        }
    return {
        "step": t.step,
        "where": list(t.where),
        "action": t.action,
        "replay": t.replay,
        "reproduced": t.reproduced,
        "reason": t.reason,
        "cause": cause,
        "outcome": replay_words(r),
        "replay_problem": r.problem,
        "report": report_json(r.analysis) if r.analysis is not None else None,
    }


def sentinel_json(run: SentinelRun) -> dict[str, Any]:
    """``run`` as JSON (schema ``nanscope.sentinel/1``, docs/REPORT_JSON.md): plain dicts,
    lists, strings and numbers, ready for ``json.dumps(..., allow_nan=False)``."""
    h = run.history
    replays = list(run.replays) or [SentinelReplay(t) for t in h.trips]
    return {
        "schema": SCHEMA,
        "verdict": run.verdict,
        "exit_status": run.exit_status,
        "headline": sentinel_headline(run),
        "logdir": str(h.logdir),
        "complete": h.complete,
        "problems": list(h.problems),
        "error": h.error,
        "notes": list(run.notes),
        "sentinel": {
            "version": h.header.version,
            "run_id": h.header.run_id,
            "framework": h.header.framework,
            "started": h.header.started,
            "settings": dict(h.header.settings),
            "modules": list(h.header.modules),
            "ended": h.ended,
            "steps_checked": len(h.steps),
            "first_step": h.steps[0].step if h.steps else None,
            "last_step": h.last_step,
            "steps": [step_json(s) for s in h.steps],
            "trips": [_trip_json(r) for r in replays],
            "unrecorded_trips": [
                {
                    "step": s.step,
                    "bad": list(s.bad),
                    "param_amax": _num(s.param_amax),
                    "state_amax": _num(s.state_amax),
                }
                for s in run.unrecorded
            ],
        },
    }


# -- text -------------------------------------------------------------------------------------


def _fmt(x: float | None) -> Text:
    if x is None:
        return Text("—", style="dim")
    if math.isnan(x):
        return Text("NaN", style="bold red")
    if math.isinf(x):
        return Text("+inf" if x > 0 else "-inf", style="bold red")
    return Text(f"{x:.4g}")


def _nearest_module(run: SentinelRun, s: StepRecord) -> Text:
    """The module whose forward outputs came nearest to overflow in step ``s``: against
    its format's largest value when the header gives the modules' dtypes
    (``settings["module_dtypes"]``), else the largest ``|x|`` of all."""
    modules = run.history.header.modules
    dtypes = run.history.header.settings.get("module_dtypes")
    best: tuple[float, str, float, str | None] | None = None
    for i, x in enumerate(s.module_amax):
        if x is None or i >= len(modules):
            continue
        dtype = None
        if isinstance(dtypes, (list, tuple)) and i < len(dtypes):
            dtype = str(dtypes[i]).removeprefix("torch.")
        limit = _FORMAT_MAX.get(dtype or "")
        level = math.inf if not math.isfinite(x) else (x / limit if limit else x)
        if best is None or level > best[0]:
            best = (level, modules[i], x, dtype if limit else None)
    if best is None:
        return Text("—", style="dim")
    level, name, x, dtype = best
    t = Text(f"{name} ")
    t.append_text(_fmt(x))
    if dtype is not None and math.isfinite(x):
        t.append(f" ({level:.0%} of {dtype})" if level >= 0.01 else f" ({level:.1e} of {dtype})")
    return t


def _steps_table(run: SentinelRun, steps: Sequence[StepRecord]) -> Table:
    """The steps, one row each; a figure no shown step measured gets no column (the
    largest |x| are measured every few steps, ``detail_every``)."""
    figures = [
        ("loss", "loss"),
        ("grad norm", "grad_norm"),
        ("grad max|x|", "grad_amax"),
        ("param max|x|", "param_amax"),
        ("state max|x|", "state_amax"),
    ]
    shown = [
        (title, key) for title, key in figures if any(getattr(s, key) is not None for s in steps)
    ]
    has_modules = any(s.module_amax for s in steps) and bool(run.history.header.modules)
    table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
    table.add_column("step", justify="right")
    for title, _ in shown:
        table.add_column(title, justify="right")
    if has_modules:
        dtypes = run.history.header.settings.get("module_dtypes")
        table.add_column("module nearest overflow" if dtypes else "module, largest |x|")
    table.add_column("Inf/NaN in")
    for s in steps:
        cells: list[Text] = [Text(f"{s.step:,}")]
        cells += [_fmt(getattr(s, key)) for _, key in shown]
        if has_modules:
            cells.append(_nearest_module(run, s))
        bad = ", ".join(_WHERE.get(b, b) for b in s.bad)
        cells.append(Text(f"✗ {bad}", style="bold red") if bad else Text(""))
        table.add_row(*cells)
    return table


def _detail_note(run: SentinelRun) -> Text | None:
    """Which figures are measured only every few steps, when they are."""
    every = run.history.header.settings.get("detail_every")
    if isinstance(every, int) and not isinstance(every, bool) and every > 1:
        return Text(
            f"(the largest |x| of gradients, parameters, optimizer state and module outputs "
            f"are measured every {every} steps)",
            style="dim",
        )
    return None


_BARS = "▁▂▃▄▅▆▇█"


def trend(values: Sequence[float | None], width: int = TREND_WIDTH, log: bool = False) -> str:
    """A sparkline of ``values`` in at most ``width`` characters: each the largest of its
    share of the steps, ``✗`` where one was Inf/NaN, a space where none was measured;
    ``log``: on a log scale (gradient norms span decades)."""
    if not values:
        return ""
    n = len(values)
    k = min(width, n)
    buckets = [values[i * n // k : (i + 1) * n // k] for i in range(k)]
    peaks: list[float | None] = []
    for b in buckets:
        seen = [v for v in b if v is not None]
        if any(not math.isfinite(v) for v in seen):
            peaks.append(math.nan)
        else:
            peaks.append(max(seen) if seen else None)

    def scale(v: float) -> float:
        return math.log10(v) if log and v > 0 else (-math.inf if log else v)

    finite = [scale(v) for v in peaks if v is not None and math.isfinite(v)]
    finite = [v for v in finite if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    out = []
    for v in peaks:
        if v is None:
            out.append(" ")
        elif not math.isfinite(v):
            out.append("✗")
        else:
            x = scale(v)
            if not math.isfinite(x) or hi == lo:
                out.append(_BARS[0])
            else:
                out.append(_BARS[min(7, int((x - lo) / (hi - lo) * 8))])
    return "".join(out)


def _trend_lines(run: SentinelRun, console: Console) -> None:
    steps = run.history.steps
    if len(steps) < 3:
        return
    span = f"steps {steps[0].step:,}–{steps[-1].step:,}"
    rows = [
        ("loss", [s.loss for s in steps], False),
        ("grad norm", [s.grad_norm for s in steps], True),
        ("param max|x|", [s.param_amax for s in steps], True),
    ]
    console.print(Text(f"trend over the run ({span}; each mark the largest of its steps):"))
    for name, values, log in rows:
        if sum(v is not None for v in values) < 3:  # too few measured for a trend
            continue
        line = trend(values, log=log)
        console.print(Text(f"  {name:<13}{line}"), no_wrap=True, overflow="ellipsis")


def _incomplete_panel(run: SentinelRun) -> Panel:
    """What is missing from the history, first: no verdict below may be read without it."""
    lines: list[Text] = [Text(f"✗ {p}") for p in run.history.problems]
    if run.history.error is not None:
        lines.append(Text(f"✗ the program ended by an error: {run.history.error}"))
    if run.tripped:
        lines.append(Text("The Inf/NaN below was seen in the steps that could be read.", "bold"))
    else:
        lines.append(
            Text(
                "No Inf/NaN in the steps that could be read, but what is missing may hold "
                "one: this is no all-clear (exit status 2).",
                style="bold",
            )
        )
    return Panel(
        Group(*lines),
        title="Incomplete history: steps may be missing",
        title_align="left",
        border_style="red",
    )


def _trip_line(r: SentinelReplay, outcome: bool = True) -> Text:
    """One trip: its step, what was non-finite, what the sentinel did, and (``outcome``)
    what came of the replay."""
    t = r.trip
    did = "the run stopped" if t.action == "stop" else "the step was skipped, the run went on"
    line = Text(f"✗ step {t.step:,}: {_where_text(t.where)}; {did}", style="red")
    if outcome:
        line.append(f"; {replay_words(r)}")
    return line


def render_sentinel_text(run: SentinelRun, console: Console) -> None:
    """Print the report of ``run``: the answer, the trips, the steps before the first
    one, the run's trend, then the first replayed step's own report in full."""
    h = run.history
    console.print(Text(f"nanscope report: {h.logdir} (a sentinel's history)", style="bold"))
    s = h.header.settings
    on_nan = s.get("on_nan")
    bits = [f"run {h.header.run_id or '?'}", h.header.framework or "unknown framework"]
    bits.append("sentinel" + (f", on Inf/NaN: {on_nan}" if on_nan else ""))
    if "snapshot_state" in s:
        bits.append("state snapshots " + ("on" if s["snapshot_state"] else "off"))
    bits.append(_steps_count(h))
    console.print(" · ".join(bits))
    if not h.complete:
        console.print(_incomplete_panel(run))
    mark, style = {
        "tripped": ("✗", "bold red"),
        "incomplete": ("?", "bold red"),
        "clean": ("✓", "bold green"),
    }[run.verdict]
    console.print(Text(f"{mark} {sentinel_headline(run)}", style=style))
    for note in run.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    replays = list(run.replays) or [SentinelReplay(t) for t in h.trips]
    if len(replays) > 1 or run.unrecorded:
        console.print(Text("Steps where the sentinel saw Inf/NaN:", style="bold"))
        for r in replays:
            console.print(_trip_line(r))
        for st in run.unrecorded[:10]:
            where = _where_text(st.bad or ("parameters",))
            console.print(Text(f"✗ step {st.step:,}: {where}; no trip record", style="red"))
        if len(run.unrecorded) > 10:
            console.print(Text(f"... {len(run.unrecorded) - 10} more steps", style="dim"))
    elif replays:  # the headline told the replay's outcome
        console.print(_trip_line(replays[0], outcome=False))
    if replays:
        bad_step = replays[0].trip.step
    elif run.unrecorded:
        bad_step = run.unrecorded[0].step
    else:
        bad_step = None
    if h.steps:
        if bad_step is None:
            lead = list(h.steps[-LEAD_UP:])
            console.print(Text(f"The last {len(lead)} steps:", style="bold"))
        else:
            lead = list(steps_before(h, bad_step, LEAD_UP))
            console.print(Text(f"The steps up to step {bad_step:,}:", style="bold"))
        if lead:
            console.print(_steps_table(run, lead))
            detail = _detail_note(run)
            if detail is not None:
                console.print(detail)
        else:
            console.print(Text("  (no step of the history reaches it)", style="dim"))
        _trend_lines(run, console)
    shown = next((r for r in replays if r.analysis is not None), None)
    if shown is not None and shown.path is not None:
        console.print(Rule(f"The replayed step {shown.trip.step:,}: nanscope report {shown.path}"))
        render_text(shown.analysis, console)  # type: ignore[arg-type]
        rest = [r for r in replays if r is not shown and r.path is not None]
        for r in rest:
            console.print(
                Text(f"step {r.trip.step:,}'s replay: nanscope report {r.path}", style="dim")
            )
