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
    INCOMPLETE,
    Analysis,
    EventView,
    Headroom,
    InputView,
    LineageGroup,
    RankState,
    RankVerdict,
    Source,
)
from nanscope.format.health import Health
from nanscope.format.modes import HEALTH_MODES, TensorDebugMode

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
            Syntax(code, "python", line_numbers=True, start_line=first,
                   highlight_lines={src.line}, theme="ansi_dark", word_wrap=True)
        )  # fmt: skip
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


_VERDICT_STYLE = {"harmful": "red", "handled": "cyan", "benign": "green"}


def _lineage_line(g: LineageGroup, steps_known: bool = True) -> Text:
    b = g.birth
    where = f"{Path(b.source.file).name}:{b.source.line}" if b.source else b.module_path or "?"
    times = f" ×{g.count}" if g.count > 1 else ""
    t = Text(f"  {g.kind:<8}", style=_VERDICT_STYLE.get(g.kind, ""))
    t.append(
        f" {b.op_name} #{b.index}{times} at {where}" + (f", step {b.step}" if steps_known else "")
    )
    if g.birth_evicted:
        t.append(" (its birth was dropped by the circular buffer: the earliest event kept)")
    if g.recomputed:
        t.append(" (recomputed in the backward pass by activation checkpointing)", style="dim")
    if g.kind == "handled":
        steps = ", ".join(str(s) for s in g.skipped_steps)
        t.append(f": the loss scaler's inf check saw it; step {steps} skipped", style="dim")
    elif g.kind == "benign" and g.absorbed_at is not None:
        by = g.absorbed_at.get("op_type")
        t.append(
            f": absorbed at #{g.absorbed_at['index']}" + (f" ({by})" if by else ""), style="dim"
        )
    elif g.reaches:
        t.append(f": reaches {'; '.join(g.reaches)}", style="dim")
    return t


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
        "collective": "told by the collectives that carried it, not by clocks",
        "clock": "told by clock: no collective orders the births",
        "single": "the only rank with Inf/NaN",
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
    roles = {"origin": 0, "born": 1, "received": 2}
    rows = sorted(v.states, key=lambda st: (roles.get(st.role, 3), _rank_order(st)))
    shown = [st for st in rows if st.role in ("origin", "born")]
    shown += [st for st in rows if st.role not in ("origin", "born")][
        : max(0, RANK_ROWS - len(shown))
    ]
    for st in shown:
        role = st.role
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
        console.print(Text(f"⚠ {w.message}", style="yellow"))
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
            table.add_row(name, last["dtype"], f"{min(lows):.3g}" if lows else "—", *cells,
                          _level(last["level"]))  # fmt: skip
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


def render_text(a: Analysis, console: Console) -> None:
    """Print the report for ``a``."""
    console.print(Text(f"nanscope report: {', '.join(a.logdirs or [a.logdir])}", style="bold"))
    procs = len(a.processes)
    steps = f"steps {a.steps[0]}–{a.steps[1]}" if a.steps else "no steps"
    console.print(
        f"run {a.run_id or '?'} · {a.framework or 'unknown framework'} · "
        f"{a.tensor_debug_mode or 'unknown mode'} · {procs} process{'es' if procs != 1 else ''} · "
        f"{steps}"
    )
    console.print(
        f"{a.num_executions:,} executions · {a.num_graph_execution_traces:,} graph execution traces"
    )
    if a.incomplete:
        console.print(_incomplete_panel(a))
    for note in a.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if a.verdict == INCOMPLETE:
        console.print(Text(f"? {a.headline}", style="bold red"))
    elif not a.found:
        health = a.tensor_debug_mode is None or a.tensor_debug_mode in _HEALTH_MODE_NAMES
        if health:
            console.print(Text("✓ no Inf/NaN recorded", style="bold green"))
        else:
            console.print(Text(f"? {a.tensor_debug_mode} records no health: see the note above"))
    elif not a.found_harmful:
        console.print(Text(f"✓ {a.headline}", style="bold green"))
    if a.found:
        al = a.alerts
        console.print(
            Text(f"✗ Inf/NaN in {al.total:,} event{'s' if al.total != 1 else ''} "
                 f"({al.executions:,} executions, {al.graph_execution_traces:,} graph execution "
                 "traces)", style="bold red")
        )  # fmt: skip
        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        table.add_column("op type")
        table.add_column("events", justify="right")
        table.add_column("first", justify="right")
        for row in al.by_op_type[:8]:
            where = " (graph)" if row["kind"] != "execution" else ""
            table.add_row(row["op_type"] + where, f"{row['count']:,}", f"#{row['first_index']}")
        if len(al.by_op_type) > 8:
            table.add_row(f"... {len(al.by_op_type) - 8} more op types", "", "")
        console.print(table)
        if al.by_step:
            first = al.by_step[0]
            console.print(f"first step with Inf/NaN: {first['step']} ({first['count']} events)")
    known = a.steps is not None
    if a.found_harmful and a.headline:
        # The answer in one sentence, the same as the JSON's headline and the GUI's.
        console.print(Text(f"✗ {a.headline}", style="bold red"))
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
        kind = "entered from outside" if a.origin_kind == "entered" else "born"
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
        console.print(Text(
            f"parameters or optimizer state non-finite from step {w.step}: {w.op_name} "
            f"#{w.index}{at} wrote {_counts(w.counts)}", style="red",
        ))  # fmt: skip
    if a.lineages:
        console.print(Text("lineages (births of Inf/NaN and what became of them):", style="bold"))
        for g in a.lineages:
            console.print(_lineage_line(g, known))
    if a.headroom is not None:
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
