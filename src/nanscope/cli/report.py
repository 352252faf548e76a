"""Where the first Inf/NaN was born, and why: the report of a dump.

Exit status (so the command can gate a CI job):

- 0: the dump is whole, and no Inf/NaN was recorded or every one was benign (an
  absorbed mask) or handled (an overflow GradScaler skipped);
- 1: a harmful Inf/NaN was recorded (whatever else is missing);
- 2: no harmful Inf/NaN was found but the dump is incomplete (an event file missing,
  unreadable, damaged or cut short, events the writer lost, a writer that never
  closed), or it cannot be read at all: no all-clear can be given.
"""

from __future__ import annotations

import argparse
import json

from nanscope.analysis import analyze
from nanscope.format.headroom import TARGET_FORMATS
from nanscope.reader import DumpReader
from nanscope.report import console_for, render_text, report_json

HELP = (
    "report where the harmful Inf/NaN was born, and why (exit 1 if one was found, 2 if the "
    "dump is incomplete and none was)"
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "logdir",
        nargs="+",
        help="the dump root (the directory the program wrote to); several (one per host) "
        "are read together as one dump",
    )
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON (schema nanscope.report/2)"
    )
    p.add_argument(
        "--headroom-format",
        choices=TARGET_FORMATS,
        default=None,
        metavar="FORMAT",
        help="measure every float value against this format's limits (one of "
        f"{', '.join(TARGET_FORMATS)}), not its own: would the values fit in float8?",
    )


def run(args: argparse.Namespace) -> int:
    with DumpReader(args.logdir) as reader:
        analysis = analyze(reader, headroom_format=args.headroom_format)
    if args.json:
        print(json.dumps(report_json(analysis), indent=2, allow_nan=False, default=str))
    else:
        render_text(analysis, console_for())
    return analysis.exit_status
