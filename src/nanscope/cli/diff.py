"""Where two runs part: the first op whose inputs agree and whose output does not.

``nanscope diff RUN_A RUN_B`` compares two dumps op by op (aligned by step, module and
op, tolerant of ops one run has and the other lacks); ``nanscope diff RUN --ranks``
compares the ranks of one data-parallel run. Alignment rules, tolerances and the JSON
schema: docs/DIFF.md.

Exit status (so the command can gate a CI job):

- 0: every compared op agrees within tolerance, and so does the loss;
- 1: the runs part (the first op, and the first step whose loss parts, are named);
- 2: bad input: a dump missing or unreadable, a rank a run lacks, nothing in common
  to compare.
"""

from __future__ import annotations

import argparse
import json

from nanscope.cli.errors import CommandError

HELP = (
    "compare two runs (or the ranks of one) op by op: the first op where they part "
    "(exit 0 within tolerance, 1 parted, 2 bad input)"
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", metavar="RUN_A", help="the first run's dump root")
    p.add_argument(
        "run_b",
        metavar="RUN_B",
        nargs="?",
        help="the second run's dump root (leave out with --ranks, or with --rank-a and "
        "--rank-b to compare two ranks of RUN_A)",
    )
    p.add_argument(
        "--ranks",
        action="store_true",
        help="compare the ranks of RUN_A (a data-parallel run whose ranks should agree): "
        "which rank parts first from the others, and where",
    )
    p.add_argument("--rank-a", type=int, default=None, metavar="N", help="the rank of RUN_A")
    p.add_argument(
        "--rank-b", type=int, default=None, metavar="N", help="the rank of RUN_B (or of RUN_A)"
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="one relative tolerance for every float format (default: per format, the "
        "coarser of the two runs'; docs/DIFF.md)",
    )
    p.add_argument("--atol", type=float, default=None, help="the absolute tolerance (1e-5)")
    p.add_argument("--json", action="store_true", help="print JSON (schema nanscope.diff/1)")


def run(args: argparse.Namespace) -> int:
    from nanscope.analysis import DiffInputError, diff, diff_ranks
    from nanscope.reader import DumpError
    from nanscope.report import console_for, diff_json, render_diff_text

    if args.ranks and args.run_b is not None:
        raise CommandError("--ranks compares the ranks of one run: give RUN_A only")
    if args.run_b is None and not args.ranks and (args.rank_a is None or args.rank_b is None):
        raise CommandError(
            "give two runs (nanscope diff RUN_A RUN_B), or one run with --ranks or "
            "--rank-a N --rank-b M"
        )
    try:
        if args.ranks:
            result = diff_ranks(args.run_a, rtol=args.rtol, atol=args.atol)
        else:
            result = diff(
                args.run_a,
                args.run_b if args.run_b is not None else args.run_a,
                rank_a=args.rank_a,
                rank_b=args.rank_b,
                rtol=args.rtol,
                atol=args.atol,
            )
    except (DiffInputError, DumpError) as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(json.dumps(diff_json(result), indent=2, allow_nan=False))
    else:
        render_diff_text(result, console_for())
    return result.exit_status
