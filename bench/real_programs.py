"""Diagnostic: the real programs under nanscope, side by side with the independent oracle.

For each case of ``tests/integration/test_real_programs.py`` (the programs in
``tests/programs/real``) this runs the program under ``nanscope run`` (default circular
buffer and/or ``--circular-buffer-size -1``) and ``nanscope report --json``, runs it
under ``tests/oracle.py`` in this process, and prints what each says: the oracle's
lineages (births grouped by op, line and kind), first NaN and cause; the report's exit
status, steps, origin, first NaN, chain, and ``cause``/``found_harmful``/``lineages``
once the report has them, each marked ``ok`` or ``DIFFERS`` against the oracle.

    python bench/real_programs.py                       # every case, both buffers
    python bench/real_programs.py --case rnn --buffer full
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.test_real_programs import (  # noqa: E402
    BUFFERS,
    CASES,
    PROGRAMS,
    oracle_key,
    report_key,
    run_recorded,
)
from tests.oracle import Result, run_oracle  # noqa: E402


def fmt_key(key: tuple[Any, ...] | None) -> str:
    if key is None:
        return "none"
    op, file, line, (neg, pos, nan) = key
    return f"{op} at {file}:{line} (-inf {neg}, +inf {pos}, nan {nan})"


def verdict(got: Any, expected: Any) -> str:
    return "ok" if got == expected else "DIFFERS"


def show_oracle(name: str, r: Result, seconds: float) -> None:
    program = CASES[name].program
    print(
        f"  oracle ({seconds:.1f} s, {r.num_ops} ops): {r.iterations} iterations, "
        f"{r.optimizer_steps} optimizer steps, skipped iterations {r.skipped_iterations}"
    )
    groups: Counter[tuple[str, int | None, str]] = Counter()
    first: dict[tuple[str, int | None, str], Any] = {}
    for lin in r.lineages:
        key = (lin.birth.op, lin.birth.line, lin.kind)
        groups[key] += 1
        first.setdefault(key, lin)
    print(
        "    lineages (birth op, line, kind: how many, first one's iteration, what became of it):"
    )
    for (op, line, kind), n in groups.items():
        lin = first[(op, line, kind)]
        absorbed = ", ".join(sorted(lin.absorbed_by)[:3]) or "-"
        why = "; ".join(lin.reasons) or ("unscaled, step skipped" if kind == "handled" else "")
        print(
            f"      {kind:8} {op} at {program}:{line}  x{n}  (iteration {lin.birth.iteration}; "
            f"absorbed by {absorbed}{'; ' + why if why else ''})"
        )
    print(f"    origin:    {fmt_key(oracle_key(r.origin, program))}")
    print(f"    first NaN: {fmt_key(oracle_key(r.first_nan, program))}")
    print(f"    cause:     {fmt_key(oracle_key(r.cause, program))}")
    print(f"    harmful:   {r.found_harmful}")


def show_report(name: str, buffer: str, r: Result, tmp: Path) -> None:
    case = CASES[name]
    t0 = time.perf_counter()
    run = run_recorded(case, BUFFERS[buffer], tmp / f"{name}-{buffer}")
    seconds = time.perf_counter() - t0
    rep = run.report
    print(
        f"  nanscope, {buffer} buffer ({seconds:.1f} s with the report): program exit "
        f"{run.returncode}, report exit {run.report_returncode} "
        f"[{verdict(run.report_returncode, 0 if case.healthy else 1)}]"
    )
    if rep is None:
        print("    no report:", run.stderr.strip().splitlines()[-1:] or "")
        return
    print(
        f"    executions {rep['num_executions']}, steps {rep['steps']} "
        f"[{verdict((rep['steps'] or [None, None])[1], r.iterations)}]"
    )
    for field, expected in (("origin", r.origin), ("first_nan", r.first_nan)):
        got = report_key(rep[field])
        want = oracle_key(expected, case.program)
        print(f"    {field + ':':10} {fmt_key(got)} [{verdict(got, want)}]")
    if "cause" in rep:
        got = report_key(rep["cause"])
        print(f"    cause:     {fmt_key(got)} [{verdict(got, oracle_key(r.cause, case.program))}]")
    else:
        print("    cause:     (no such field)")
    if "found_harmful" in rep:
        print(
            f"    harmful:   {rep['found_harmful']} [{verdict(rep['found_harmful'], r.found_harmful)}]"
        )
    else:
        print("    harmful:   (no such field)")
    chain = " -> ".join(
        f"{e['op_type']}@{(e.get('source') or {}).get('line')}" for e in rep["chain"]
    )
    print(f"    chain:     {chain or '-'}")
    if "lineages" in rep:
        groups = Counter(
            (lin["birth"]["op_type"], (lin["birth"].get("source") or {}).get("line"), lin["kind"])
            for lin in rep["lineages"]
        )
        for (op, line, kind), n in groups.items():
            print(f"      {kind:8} {op} at {case.program}:{line}  x{n}")
    else:
        print("    lineages:  (no such field)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=list(CASES), help="default: all")
    parser.add_argument("--buffer", choices=[*BUFFERS, "both"], default="both")
    args = parser.parse_args(argv)
    buffers = list(BUFFERS) if args.buffer == "both" else [args.buffer]
    with tempfile.TemporaryDirectory(prefix="nanscope-real-") as tmp:
        for name in args.case or list(CASES):
            case = CASES[name]
            print(f"== {name}: {case.program} {' '.join(case.args)}")
            print(f"   {case.story}")
            if not case.available:
                print(f"   skipped: needs {', '.join(case.needs)}")
                continue
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                r = run_oracle(PROGRAMS / case.program, list(case.args))
            show_oracle(name, r, time.perf_counter() - t0)
            for buffer in buffers:
                show_report(name, buffer, r, Path(tmp))
            print()


if __name__ == "__main__":
    main()
