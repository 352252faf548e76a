"""The terminal report, rendered with rich (readable over SSH, no colours when piped)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.segment import Segment
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from nanscope.analysis import (
    Analysis,
    EventView,
    Headroom,
    InputView,
    LineageGroup,
    RankState,
    RankVerdict,
    Source,
)
from nanscope.analysis import _lineage as reach
from nanscope.analysis._explain import short_name
from nanscope.analysis._headroom import WATCH
from nanscope.format.health import Health
from nanscope.format.modes import HEALTH_MODES, TensorDebugMode
from nanscope.report._headroom_words import warning_text
from nanscope.report._sentences import headline, note_texts
from nanscope.vocabulary import (
    EventKind,
    LineageVerdict,
    OriginKind,
    RankDecision,
    RankRole,
    Verdict,
)

_HEALTH_MODE_NAMES = {m.name for m in HEALTH_MODES} | {TensorDebugMode.FULL_TENSOR.name}


def _counts(c: Health | None) -> str:
    if c is None:
        return "not recorded"
    if not c.known:
        return f"{c.size} elements" if c.size is not None else "no counts in this mode"
    bad = [f"{n} {k}" for n, k in ((c.neg_inf, "-inf"), (c.pos_inf, "+inf"), (c.nan, "NaN")) if n]
    fin = [f"{n} {k}" for n, k in ((c.neg, "negative"), (c.zero, "zero"), (c.pos, "positive")) if n]
    size = f" of {c.size:,}" if c.size is not None else ""
    dtype = f" {c.dtype}" if c.dtype else ""
    text = ", ".join(bad) if bad else "no Inf/NaN"
    return f"{text}{size}{dtype}" + (f" (finite: {', '.join(fin)})" if fin else "")


def _where(v: EventView, steps_known: bool = True) -> str:
    bits = [f"{v.kind.replace('_', ' ')} #{v.index}"]
    if steps_known:  # a dump without steps would say "step 0" of everything
        bits.append(f"step {v.step}")
    if v.phase:
        bits.append(v.phase)
    if v.module_path:
        bits.append(f"module {v.module_path}")
    if v.graph_name:
        bits.append(f"graph {v.graph_name}")
    if v.iteration is not None:
        bits.append(f"loop iteration {v.iteration}")
    if v.rank is not None:
        bits.append(f"rank {v.rank}")
    return ", ".join(bits)


def _input_line(i: InputView) -> Text:
    t = Text(f"  {i.name}")
    if i.producer is not None:
        t.append(f" ← {i.producer.op_name} (#{i.producer.index})", style="cyan")
    t.append(f": {_counts(i.counts)}")
    return t


def _source_block(label: str, src: Source) -> list[object]:
    out: list[object] = [Text(f"{label} {src.file}:{src.line} in {src.function}", style="bold")]
    if src.context:
        first = src.context[0][0]
        code = "\n".join(line for _, line in src.context)
        out.append(
            Syntax(
                code,
                "python",
                line_numbers=True,
                start_line=first,
                highlight_lines={src.line},
                theme="ansi_dark",
                word_wrap=True,
            )
        )
    elif src.code:
        out.append(Text(f"    {src.code}"))
    return out


def event_panel(
    title: str, v: EventView, style: str, steps_known: bool = True, library: Source | None = None
) -> Panel:
    """One event: what it made, why, its inputs and where (for a backward op, the forward
    line the user wrote first); ``library``: the library frame it ran in (a model's,
    an optimizer's), when the user's own line is only the call into that library."""
    parts: list[object] = [
        Text.assemble(
            (v.op_name if v.op_name != v.op_type else v.op_type, "bold"),
            (f"  {v.op_type}" if v.op_name != v.op_type else ""),
            (f"  ({_where(v, steps_known)})", "dim"),
        ),
        Text(f"output: {_counts(v.counts)}"),
        Text.assemble(("why: ", "bold"), v.explanation),
    ]
    if v.inputs:
        parts.append(Text("inputs:"))
        parts.extend(_input_line(i) for i in v.inputs)
    if v.forward_op or v.forward_source is not None:
        # The forward line first: it is the line the user wrote, and the one to fix.
        parts.append(Text(f"backward of {v.forward_op or 'a forward op'}", style="bold"))
        if v.forward_source is not None:
            parts.extend(_source_block("created at", v.forward_source))
        if library is not None:
            parts.append(_library_line(library))
        if v.source is not None:
            parts.extend(_source_block("backward run at", v.source))
    else:
        if v.source is not None:
            parts.extend(_source_block("at", v.source))
        if library is not None:
            parts.append(_library_line(library))
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)  # type: ignore[arg-type]


def _library_line(src: Source) -> Text:
    """``in library code: .../transformers/models/gpt2/modeling_gpt2.py:201 in forward``."""
    return Text(f"in library code: {src.file}:{src.line} in {src.function}", style="bold")


_VERDICT_STYLE = {
    LineageVerdict.HARMFUL: "red",
    LineageVerdict.HANDLED: "cyan",
    LineageVerdict.BENIGN: "green",
    LineageVerdict.UNKNOWN: "yellow",
}

# Where a lineage's values went, in the few words a one-line lineage has room for.
_REACH_SHORT = {
    reach.GRAPH_OUTPUT: "a graph output",
    reach.VARIABLE: "a variable",
    reach.LATER_STEP: "a later step",
    reach.GRADIENTS: "the gradients",
    reach.LOSS: "the loss",
    reach.OPTIMIZER_UPDATE: "the optimizer update",
    reach.END: "the end, unread",
}

# Graph ops that only read a variable: a birth there is a variable an earlier update had
# already made non-finite, not a new cause.
_VARIABLE_READS = ("ReadVariableOp", "ResourceGather", "VarHandleOp")


def _place(b: EventView) -> str:
    return f"{Path(b.source.file).name}:{b.source.line}" if b.source else b.module_path or "?"


def _steps_text(steps: list[int]) -> str:
    lo, hi = min(steps), max(steps)
    return f"step {lo}" if lo == hi else f"steps {lo}–{hi}"


class _Row:
    """Lineage groups that read the same on one line: one verdict, op and place."""

    def __init__(self, g: LineageGroup) -> None:
        self.groups = [g]

    @property
    def first(self) -> LineageGroup:
        return self.groups[0]

    @property
    def count(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def steps(self) -> list[int]:
        return [g.birth.step for g in self.groups]

    @property
    def reaches(self) -> list[str]:
        out: list[str] = []
        for g in self.groups:
            out.extend(r for r in g.reaches if r not in out)
        return out


def _lineage_rows(groups: list[LineageGroup]) -> list[_Row]:
    """Groups merged where only their step differs (the same birth, step after step)."""
    rows: dict[tuple[str, str, str, bool], _Row] = {}
    for g in groups:
        key = (str(g.kind), g.birth.op_name, _place(g.birth), g.birth_evicted)
        if key in rows:
            rows[key].groups.append(g)
        else:
            rows[key] = _Row(g)
    return list(rows.values())


def _is_variable_read(g: LineageGroup) -> bool:
    return g.birth.op_type in _VARIABLE_READS


def _lineage_line(row: _Row, steps_known: bool = True) -> Text:
    """One lineage row on one line: verdict, op, how many, where, when, and its fate."""
    g = row.first
    b = g.birth
    times = f" ×{row.count}" if row.count > 1 else ""
    t = Text(f"  {g.kind:<8}", style=_VERDICT_STYLE.get(g.kind, ""))
    t.append(f" {b.op_name} #{b.index}{times} at {_place(b)}")
    if steps_known:
        t.append(f", {_steps_text(row.steps)}")
    if g.birth_evicted:
        t.append(" (birth dropped by the circular buffer: the earliest event kept)")
    recomputed = sum(x.recomputed for x in row.groups)
    if recomputed:
        t.append(" (recomputed by activation checkpointing)", style="dim")
    if g.kind == LineageVerdict.HANDLED:
        skipped = sorted({s for x in row.groups for s in x.skipped_steps})
        steps = ", ".join(str(s) for s in skipped)
        t.append(f": the loss scaler skipped step {steps}", style="dim")
    elif g.kind == LineageVerdict.BENIGN and g.absorbed_at is not None:
        by = g.absorbed_at.get("op_type")
        t.append(
            f": absorbed at #{g.absorbed_at['index']}" + (f" ({short_name(by)})" if by else ""),
            style="dim",
        )
    elif row.reaches:
        told = ", ".join(_REACH_SHORT.get(r, r) for r in row.reaches)
        t.append(f": reaches {told}", style="dim")
    return t


def _lineages_section(a: Analysis, console: Console, steps_known: bool) -> None:
    """One short line per birth place; variables read back non-finite after the cause
    (TensorFlow's ``ReadVariableOp`` of a weight an update made NaN) folded into one."""
    cause = a.cause
    groups: list[LineageGroup] = []
    reads: list[LineageGroup] = []
    for g in a.lineages:
        later_read = (
            cause is not None
            and _is_variable_read(g)
            and g.birth.step >= cause.step
            and (g.birth.kind, g.birth.index) != (cause.kind, cause.index)
        )
        (reads if later_read else groups).append(g)
    console.print(Text("lineages (births of Inf/NaN and what became of them):", style="bold"))
    for row in _lineage_rows(groups):
        # One line each, however narrow the terminal: the end is cut, not wrapped.
        console.print(_lineage_line(row, steps_known), no_wrap=True, overflow="ellipsis")
    if reads:
        n = sum(g.count for g in reads)
        when = f", {_steps_text([g.birth.step for g in reads])}" if steps_known else ""
        said = f"  and {n} read{'s' if n != 1 else ''} of variables that already held Inf/NaN"
        console.print(
            Text(f"{said}{when}, after the cause", style="dim"), no_wrap=True, overflow="ellipsis"
        )


# Rows of the per-rank table beyond the origin and other births (a large run's ranks
# mostly received it the same way).
RANK_ROWS = 12


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:+,.1f} ms" if abs(seconds) < 10 else f"{seconds:+,.1f} s"


def _rank_order(st: RankState) -> tuple[int, int]:
    return (st.rank if st.rank is not None else 1 << 30, st.process)


def _ranks_section(v: RankVerdict, console: Console) -> None:
    """Where it was born across ranks, how that was told, and each rank's first Inf/NaN."""
    by_process = {st.process: st for st in v.states}
    origin = by_process.get(v.origin_process) if v.origin_process is not None else None
    if origin is None:
        return
    how = {
        RankDecision.COLLECTIVE: "told by the collectives that carried it, not by clocks",
        RankDecision.CLOCK: "told by clock: no collective orders the births",
        RankDecision.SINGLE: "the only rank with Inf/NaN",
    }[v.decided_by]
    console.print(Text(f"Ranks: born on {origin.label} ({how})", style="bold"))
    if v.spread:
        first = v.spread[0]
        reached = sorted((by_process[p] for p in v.reached if p in by_process), key=_rank_order)
        names = ", ".join(st.label for st in reached)
        senders = ", ".join(by_process[c.process].label for c in v.spread if c.sent)
        console.print(
            f"spread by {first.op_type}, {first.collective.label}, at step {first.step}: "
            f"from {senders or origin.label} to {names}"
        )
    table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
    for col in ("rank", "role", "first Inf/NaN", "step", "when", "clock offset"):
        table.add_column(col, justify="right" if col in ("step", "when") else "left")
    start = origin.first or origin.birth
    t0 = start.wall_time if start is not None else 0.0
    roles = {RankRole.ORIGIN: 0, RankRole.BORN: 1, RankRole.RECEIVED: 2}
    rows = sorted(v.states, key=lambda st: (roles.get(st.role, 3), _rank_order(st)))
    shown = [st for st in rows if st.role in (RankRole.ORIGIN, RankRole.BORN)]
    shown += [st for st in rows if st.role not in (RankRole.ORIGIN, RankRole.BORN)][
        : max(0, RANK_ROWS - len(shown))
    ]
    for st in shown:
        role: str = st.role
        if st.via is not None:
            src = ", ".join(by_process[p].label for p in st.senders if p in by_process)
            p2p = st.via.collective.kind != "collective"  # its label names the peer
            role = f"received: {st.via.collective.label}" + (
                f" from {src}" if src and not p2p else ""
            )
        first_alert = f"#{st.first.index} {st.first_op}" if st.first is not None else "—"
        when = "—"
        if st.first is not None:
            aligned = st.aligned(st.first.wall_time)
            when = _ms(aligned - t0) if aligned is not None else "(clock not aligned)"
        offset = "—" if st.clock_offset is None else _ms(st.clock_offset)
        step = str(st.first_step) if st.first_step is not None else "—"
        table.add_row(st.label, role, first_alert, step, when, offset)
    console.print(table)
    if len(rows) > len(shown):
        console.print(Text(f"... {len(rows) - len(shown)} more ranks", style="dim"))


def _level(v: float) -> str:
    return f"{v:.0%}" if v >= 0.01 else f"{v:.1e}"


def _headroom_section(h: Headroom, console: Console) -> None:
    """Warnings of overflow and underflow coming, and the ranges before the first Inf."""
    if not h.warnings and not h.before_inf:
        return
    against = f" (measured against {h.target})" if h.target else ""
    console.print(Text(f"Headroom{against}:", style="bold"))
    for w in h.warnings:
        console.print(Text(f"⚠ {warning_text(w)}", style="yellow"))
    if h.before_inf:
        steps = sorted({r["step"] for r in h.before_inf})
        console.print(
            f"largest |x| per module in the steps up to the first harmful Inf (step "
            f"{h.before_step}; its own step until the Inf), nearest to overflow first:"
        )
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        table.add_column("module")
        table.add_column("dtype")
        table.add_column("min |x|>0", justify="right")
        for st in steps:
            table.add_column(f"step {st}", justify="right")
        table.add_column("of max", justify="right")
        modules: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
        for r in h.before_inf:
            modules.setdefault((r["module"], r["phase"]), {})[r["step"]] = r
        for (module, phase), by_step in modules.items():
            name = (module or "(outside modules)") + (
                f" ({phase})" if phase not in ("", "forward") else ""
            )
            lows = [r["min_nonzero_abs"] for r in by_step.values() if r["min_nonzero_abs"]]
            last = by_step[max(by_step)]
            cells = [f"{by_step[st]['max_abs']:.4g}" if st in by_step else "—" for st in steps]
            table.add_row(
                name,
                last["dtype"],
                f"{min(lows):.3g}" if lows else "—",
                *cells,
                _level(last["level"]),
            )
        console.print(table)


def _incomplete_panel(a: Analysis) -> Panel:
    """What is missing from the dump, first: no verdict below may be read without it."""
    lines: list[object] = []
    for p in a.incomplete:
        lines.append(Text(f"✗ {p['message']}"))
    if a.found_harmful:
        tail = "The harmful Inf/NaN below was found in the events that could be read."
    else:
        tail = (
            "No harmful Inf/NaN in the events that could be read, but what is missing may "
            "hold one: this is no all-clear (exit status 2)."
        )
    lines.append(Text(tail, style="bold"))
    return Panel(
        Group(*lines),  # type: ignore[arg-type]
        title="Incomplete dump: events are missing",
        title_align="left",
        border_style="red",
    )


def _header(a: Analysis, console: Console) -> None:
    """The dump: where, which run, and the steps as the program counted them."""
    console.print(Text(f"nanscope report: {', '.join(a.logdirs or [a.logdir])}", style="bold"))
    procs = len(a.processes)
    console.print(
        f"run {a.run_id or '?'} · {a.framework or 'unknown framework'} · "
        f"{a.tensor_debug_mode or 'unknown mode'} · {procs} process{'es' if procs != 1 else ''} · "
        f"{steps_header(a)}"
    )
    console.print(
        f"{a.num_executions:,} executions · {a.num_graph_execution_traces:,} graph execution traces"
    )


def steps_header(a: Analysis) -> str:
    """``steps 0–5``, numbered from 0 as a training loop's ``for step in range(n)`` counts.

    A step ends when the optimizer step returns, so what a program runs after its last
    update (an evaluation, a final print of the loss) is counted in one step more than the
    loop ran: the header names the loop's steps, and that work after them apart, so that
    it reads as the program printed its steps."""
    if not a.steps:
        return "no steps"
    first, last = a.steps
    if a.after_last_step and last > first:
        return f"steps {first}–{last - 1} (step {last}: after the last)"
    return f"steps {first}–{last}" if last != first else f"step {first}"


def _verdict_line(a: Analysis) -> Text | None:
    """The answer, one line, before anything else (but what is missing from the dump)."""
    said = headline(a)
    if a.verdict == Verdict.INCOMPLETE:
        return Text(f"? {said}", style="bold red")
    if a.found_harmful and said:
        # The same sentence as the JSON's headline and the GUI's.
        return Text(f"✗ {said}", style="bold red")
    if a.found_harmful:
        return Text("✗ harmful Inf/NaN", style="bold red")
    if a.found:
        return Text(f"✓ {said}", style="bold green")
    health = a.tensor_debug_mode is None or a.tensor_debug_mode in _HEALTH_MODE_NAMES
    if health:
        return Text("✓ no Inf/NaN recorded", style="bold green")
    return Text(f"? {a.tensor_debug_mode} records no health: see the note below")


def _op_rows(a: Analysis) -> list[dict[str, Any]]:
    """The alert table's rows: the cause's op type first (the answer leads), then the
    others, most events first."""
    rows = a.alerts.by_op_type
    cause = a.cause
    if cause is not None:
        mine = [r for r in rows if r["op_type"] == cause.op_type and r["kind"] == cause.kind]
        rows = mine + [r for r in rows if r not in mine]
    return rows


# Op types listed in the alert table; the rest are counted on one line.
OP_ROWS = 8


def _alerts(a: Analysis, console: Console) -> None:
    """How many events held Inf/NaN, of which op types: the evidence under the answer."""
    al = a.alerts
    style = "bold" if a.found_harmful else "dim"
    console.print(
        Text(
            f"Inf/NaN in {al.total:,} event{'s' if al.total != 1 else ''} "
            f"({al.executions:,} executions, {al.graph_execution_traces:,} graph execution "
            "traces)",
            style=style,
        )
    )
    table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
    table.add_column("op type")
    table.add_column("events", justify="right")
    table.add_column("first", justify="right")
    rows = _op_rows(a)
    cause = a.cause
    for row in rows[:OP_ROWS]:
        where = " (graph)" if row["kind"] != EventKind.EXECUTION else ""
        mark = ""
        if cause is not None and (row["op_type"], row["kind"]) == (cause.op_type, cause.kind):
            mark = "  ← the cause"
        table.add_row(row["op_type"] + where + mark, f"{row['count']:,}", f"#{row['first_index']}")
    if len(rows) > OP_ROWS:
        table.add_row(f"... {len(rows) - OP_ROWS} more op types", "", "")
    console.print(table)
    if al.by_step:
        first = al.by_step[0]
        console.print(f"first step with Inf/NaN: {first['step']} ({first['count']} events)")


def _headroom_near(h: Headroom) -> bool:
    """Whether any value came within reach of its format's limit: a warning, or a module
    whose largest |x| before the first Inf reached the level headroom watches from."""
    return bool(h.warnings) or any((r.get("level") or 0) >= WATCH for r in h.before_inf)


def render_text(a: Analysis, console: Console) -> None:
    """Print the report for ``a``: the answer first, then the evidence for it."""
    _header(a, console)
    if a.incomplete:
        console.print(_incomplete_panel(a))
    verdict = _verdict_line(a)
    if verdict is not None:
        console.print(verdict)
    for note in note_texts(a):
        console.print(Text(f"note: {note}", style="yellow"))
    if a.found:
        _alerts(a, console)
    known = a.steps is not None
    # Each event is shown once, in the first box that names it; later ones say which box.
    shown: dict[tuple[str, int], str] = {}

    def box(name: str, title: str, v: EventView, style: str) -> None:
        lib = a.library_sources.get((v.kind, v.index))
        console.print(event_panel(f"{name}: {title}" if title else name, v, style, known, lib))
        shown[(v.kind, v.index)] = name

    def same_as(name: str, v: EventView) -> bool:
        other = shown.get((v.kind, v.index))
        if other is None:
            return False
        console.print(
            Text(f"{name}: {v.op_name} #{v.index}, shown above in the {other} box", style="dim")
        )
        return True

    if a.cause is not None:
        if a.cause_evicted is not None:
            title = "its birth was dropped by the circular buffer; the earliest event kept"
        else:
            title = "where the harmful Inf/NaN was born"
        box("Cause", title, a.cause, "red")
    if a.origin is not None:
        kind = "entered from outside" if a.origin_kind == OriginKind.ENTERED else "born"
        if not same_as(f"Origin (the first Inf/NaN {kind})", a.origin):
            style = "red" if a.cause is None and a.found_harmful else "yellow"
            box("Origin", f"where the first Inf/NaN was {kind}", a.origin, style)
    if a.ranks is not None and a.found_harmful:
        _ranks_section(a.ranks, console)
    for title, v in (("First -inf/+inf", a.first_inf), ("First NaN", a.first_nan)):
        if v is not None and not same_as(title, v):
            box(title, "", v, "magenta")
    if len(a.chain) > 1:
        chain = " → ".join(f"{c.op_name} #{c.index}" for c in a.chain)
        console.print(Text(f"chain: {chain}"))
    if a.state_nonfinite is not None:
        w = a.state_nonfinite
        at = f" at {Path(w.source.file).name}:{w.source.line}" if w.source is not None else ""
        console.print(
            Text(
                f"parameters or optimizer state non-finite from step {w.step}: {w.op_name} "
                f"#{w.index}{at} wrote {_counts(w.counts)}",
                style="red",
            )
        )
    if a.lineages:
        _lineages_section(a, console, known)
    if a.headroom is not None and _headroom_near(a.headroom):
        _headroom_section(a.headroom, console)
    if any(a.evicted.values()):
        dropped = ", ".join(f"{n:,} {k.replace('_', ' ')}s" for k, n in a.evicted.items() if n)
        console.print(Text(f"note: the circular buffer dropped {dropped}", style="yellow"))
    said = {p["message"] for p in a.incomplete}
    for p in a.problems:
        if p["message"] not in said:
            console.print(Text(f"{p['severity']}: {p['message']}", style="yellow"))


# Characters a terminal acts on rather than shows: C0 controls but tab and newline, DEL,
# C1 controls, and the bidirectional overrides that reorder what is shown.
_ACTIVE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal would act on shown as an escape
    (``\\x1b``): strings from a dump are data, never commands to the terminal."""
    return _ACTIVE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class _DataConsole(Console):
    """A console whose content cannot drive the terminal.

    Every string a dump holds (op names, run ids, paths, source lines) reaches the
    terminal through here: markup and emoji codes are not interpreted, and control
    characters in the content are escaped; the colours rich itself emits are kept
    (they are rendered from styles, outside the text).
    """

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(terminal_safe(seg.text), seg.style) for seg in buffer
        )


def console_for(stream: object = None) -> Console:
    """A console that keeps colours off when output is not a terminal, and that shows
    the dump's strings as text (no markup, no terminal escapes)."""
    width = None if os.environ.get("COLUMNS") else 110
    return _DataConsole(
        file=stream,  # type: ignore[arg-type]
        width=width,
        soft_wrap=False,
        markup=False,
        emoji=False,
    )
