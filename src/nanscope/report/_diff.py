"""A diff's words: the terminal text of a :class:`nanscope.analysis.DiffResult`, and its JSON.

The text leads with the answer (where the runs part, or that they agree), then the
values and why, the two source lines, the loss, and what was compared.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from nanscope.analysis import DiffResult, OpSide, PartedOp

_STAT_WORDS = {
    "amax": "largest |x|",
    "mean": "mean",
    "std": "standard deviation",
    "l2": "L2 norm",
    "counts": "sign and zero counts",
    "nonfinite": "Inf/NaN counts",
    "hash": "bits",
}
_EVIDENCE_WORDS = {
    "statistics": "statistics (mean, standard deviation, L2 norm, bits hash)",
    "ranges": "largest |x| (FULL_HEALTH's ranges)",
    "counts": "counts only (Inf/NaN, negative, zero, positive elements)",
    "none": "nothing (no output recorded on both sides)",
}
_INPUT_WORDS = {
    "agree": "agrees",
    "parted": "already parted",
    "only_a": "made by an op only run A has",
    "only_b": "made by an op only run B has",
    "not_recorded": "not made by a recorded op (a parameter, the data, a constant)",
    "a_number": "a number",
}


def diff_json(result: DiffResult) -> dict[str, Any]:
    """The documented JSON of a diff (schema ``nanscope.diff/1``, docs/DIFF.md)."""
    return result.to_json()


def _num(x: float | None) -> str:
    if x is None:
        return "not recorded"
    return f"{x:.6g}"


def _where(op: OpSide) -> str:
    bits = [f"step {op.step}"]
    if op.phase:
        bits.append(op.phase)
    if op.rank is not None:
        bits.append(f"rank {op.rank}")
    return ", ".join(bits)


def _line(op: OpSide) -> str:
    src = op.line
    if src is None:
        return "(no line of the program recorded)"
    which = "" if op.source is not None else " (its forward op)"
    code = f"   {src.code}" if src.code else ""
    return f"{src.file}:{src.line} in {src.function}{which}{code}"


def _name(op: OpSide) -> str:
    module = f" in module {op.module_path}" if op.module_path else ""
    name = op.op_type or op.op_name or "an op"
    if op.op_name and op.op_name != op.op_type:
        name += f" ({op.op_name})"
    return f"{name}{module}"


def _headline(r: DiffResult) -> str:
    if r.parted is not None:
        p = r.parted
        if r.ranks is not None and r.ranks.majority and r.ranks.odd_ranks:
            odd = ", ".join(map(str, r.ranks.odd_ranks))
            return f"Rank {odd} parts first from the others at {_where(p.b)}: {_name(p.b)}."
        return f"The runs part at {_where(p.a)}: {_name(p.a)}."
    if r.status == "parted" and r.loss is not None and r.loss.first_parted_step is not None:
        return (
            f"The loss parts at step {r.loss.first_parted_step}, but no aligned op's output "
            "does beyond its tolerance."
        )
    if r.status == "incomplete":
        return (
            f"No compared op parts ({r.alignment.compared:,} aligned pairs), but a dump is "
            "incomplete: the runs may part where it lacks events (see the warnings)."
        )
    if r.status == "agree":
        return (
            f"The runs agree within tolerance: {r.alignment.compared:,} aligned op pairs over "
            f"{r.alignment.steps} step(s)."
        )
    return "Nothing could be compared: " + (
        "the runs have no step in common."
        if not r.alignment.steps
        else "no aligned op has anything recorded on both sides."
    )


def _parted_lines(p: PartedOp) -> list[str]:
    out: list[str] = []
    for o in p.outputs:
        if not o.parted:
            continue
        what = _STAT_WORDS.get(o.statistic, o.statistic)
        slot = f"output {o.slot}: " if len(p.outputs) > 1 else ""
        if o.statistic in ("nonfinite", "counts"):
            a, b = p.a.values, p.b.values
            keys = ("neg_inf", "pos_inf", "nan") if o.statistic == "nonfinite" else (
                "neg", "zero", "pos"
            )  # fmt: skip
            va = ", ".join(f"{k} {_num(a.get(k))}" for k in keys)
            vb = ", ".join(f"{k} {_num(b.get(k))}" for k in keys)
            out.append(f"  {slot}{what}: A {va}; B {vb}")
        else:
            out.append(
                f"  {slot}{what}: A {_num(o.value_a)}, B {_num(o.value_b)}: relative error "
                f"{o.relative_error:.3g} > {o.rtol:.3g} ({o.compared_as} tolerance)"
            )
    dtypes = p.a.dtype if p.a.dtype == p.b.dtype else f"{p.a.dtype} in A, {p.b.dtype} in B"
    if dtypes:
        out.append(f"  output dtype: {dtypes}")
    if p.inputs_agree is True:
        out.append("  its inputs agree: the first op whose inputs agree and whose output does not")
    elif p.inputs:
        words = "; ".join(
            f"input {i.slot} {_INPUT_WORDS.get(i.status, i.status)}" for i in p.inputs
        )
        out.append(f"  its inputs: {words}")
    out.append(f"  A: {_line(p.a)}")
    out.append(f"  B: {_line(p.b)}")
    if p.only_in_one_run is not None:
        extra = p.only_in_one_run
        out.append(
            f"  fed by {_name(extra)}, which only run {extra.run.upper()} has: {_line(extra)}"
        )
    return out


def diff_lines(r: DiffResult) -> list[str]:
    """The terminal text of a diff, as lines (no styling)."""
    lines = [_headline(r)]
    if r.parted is not None:
        lines += _parted_lines(r.parted)
    if r.ranks is not None:
        rk = r.ranks
        if rk.odd_ranks and rk.majority:
            lines.append(
                f"Ranks: rank {', '.join(map(str, rk.odd_ranks))} parts first from the others "
                f"(compared with rank {rk.reference}; ranks {', '.join(map(str, rk.ranks))})."
            )
        elif rk.odd_ranks:
            lines.append(
                f"Ranks: {rk.ranks[0]} and {rk.ranks[1]} part; with two ranks there is no "
                "majority to tell which one is off."
            )
        else:
            lines.append(f"Ranks: {', '.join(map(str, rk.ranks))} agree.")
    if r.loss is not None:
        loss = r.loss
        if loss.first_parted_step is not None:
            at = next(s for s in loss.steps if s.step == loss.first_parted_step)
            lines.append(
                f"Loss: parts first at step {at.step} ({_num(at.value_a)} vs {_num(at.value_b)}, "
                f"relative error {at.relative_error:.3g})."
            )
        else:
            how = "" if loss.evidence in ("statistics", "ranges") else f" (by {loss.evidence} only)"
            lines.append(f"Loss: agrees at each of the {len(loss.steps)} step(s) compared{how}.")
    else:
        lines.append(
            "Loss: not found in both runs (their dumps mark no backward pass or forward op)."
        )
    al = r.alignment
    ev = ", ".join(f"{k} {v:,}" for k, v in al.evidence.items() if v)
    lines.append(
        f"Compared: {al.compared:,} aligned op pairs over {al.steps} step(s) ({ev or 'none'}); "
        f"unpaired: {al.only_a:,} in A, {al.only_b:,} in B; views and casts left out: "
        f"{al.skipped_a:,} in A, {al.skipped_b:,} in B."
    )
    if al.steps_only_a or al.steps_only_b:
        lines.append(
            f"Steps in one run only: {len(al.steps_only_a)} in A, {len(al.steps_only_b)} in B."
        )
    lines.append(f"Evidence: {_EVIDENCE_WORDS.get(r.evidence, r.evidence)}.")
    if r.evidence in ("ranges", "counts"):
        lines.append(
            "  (record both runs with statistics (nanscope run --statistics) to compare mean, "
            "standard deviation, L2 norm and a bits hash)"
        )
    tol = r.tolerance
    rtol = f"rtol {tol.rtol:g} for every format" if tol.rtol is not None else "rtol per format"
    lines.append(f"Tolerance: {rtol}, atol {tol.atol:g} (docs/DIFF.md).")
    lines.append(f"A: {r.a.label}, {r.a.ops:,} ops, {r.a.steps} step(s)")
    lines.append(f"B: {r.b.label}, {r.b.ops:,} ops, {r.b.steps} step(s)")
    for problem in r.problems[:5]:
        lines.append(f"Warning: {problem}")
    return lines


def render_diff_text(r: DiffResult, console: Console) -> None:
    """Print a diff's text to ``console`` (see :func:`nanscope.report.console_for`)."""
    for i, line in enumerate(diff_lines(r)):
        console.print(Text(line, style="bold" if i == 0 else ""))
