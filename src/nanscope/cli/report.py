"""Where the first Inf/NaN was born, and why: the report of a dump.

Exit status (so the command can gate a CI job):

- 0: the dump is whole, and no Inf/NaN was recorded or every one was benign (an
  absorbed mask) or handled (an overflow GradScaler skipped);
- 1: a harmful Inf/NaN was recorded (whatever else is missing);
- 2: no harmful Inf/NaN was found but the dump is incomplete (an event file missing,
  unreadable, damaged or cut short, events the writer lost, a writer that never
  closed), or it cannot be read at all: no all-clear can be given.

A sentinel's logdir (``sentinel.jsonl``, from ``nanscope.sentinel`` or ``nanscope run
--sentinel``) is reported as its history: 0 every step checked and none saw Inf/NaN,
1 the sentinel saw Inf/NaN, 2 the history is incomplete (the program did not close the
sentinel, a damaged line) or checked no step. Its trips' replay dumps are reported in
full, and each can be reported alone (``nanscope report LOGDIR/replay-step-N``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nanscope.analysis import analyze
from nanscope.cli.errors import CommandError
from nanscope.format.files import DumpNotFoundError
from nanscope.format.headroom import TARGET_FORMATS
from nanscope.reader import DumpReader
from nanscope.report import (
    SentinelReplay,
    SentinelRun,
    console_for,
    render_sentinel_text,
    render_text,
    report_json,
    sentinel_json,
)
from nanscope.sentinel import SentinelHistoryError, is_sentinel_logdir, read_history

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
    sentinels = [d for d in args.logdir if is_sentinel_logdir(d)]
    if sentinels:
        if len(args.logdir) > 1:
            raise CommandError(
                f"{sentinels[0]} is a sentinel's logdir: report it alone "
                "(nanscope report LOGDIR), not with other dumps"
            )
        return _report_sentinel(args)
    with DumpReader(args.logdir) as reader:
        analysis = analyze(reader, headroom_format=args.headroom_format)
    if args.json:
        print(json.dumps(report_json(analysis), indent=2, allow_nan=False, default=str))
    else:
        render_text(analysis, console_for())
    return analysis.exit_status


# Where a sentinel leaves the dump of each step it replayed.
REPLAY_GLOB = "replay-step-*"


def read_sentinel(logdir: str | Path, headroom_format: str | None = None) -> SentinelRun:
    """A sentinel's logdir read: its history, and each trip's replay dump analysed.

    Raises :class:`CommandError` when the history cannot be read at all. A replay dump
    that is missing, lies outside the logdir or cannot be read is kept as that trip's
    ``problem``; the report says so and gives no cause for it.
    """
    try:
        history = read_history(logdir)
    except (SentinelHistoryError, OSError) as exc:
        raise CommandError(f"{exc}; it is not a sentinel history nanscope can read") from None
    root = Path(logdir).resolve()
    replays: list[SentinelReplay] = []
    named: set[Path] = set()
    for trip in history.trips:
        path = history.replay_dir(trip)
        if path is None:
            replays.append(SentinelReplay(trip))
            continue
        if not path.resolve().is_relative_to(root):
            replays.append(
                SentinelReplay(trip, path, problem=f"{trip.replay} lies outside the logdir")
            )
            continue
        named.add(path.resolve())
        if not path.is_dir():
            replays.append(SentinelReplay(trip, path, problem=f"{trip.replay} is not there"))
            continue
        try:
            with DumpReader([str(path)]) as reader:
                analysis = analyze(reader, headroom_format=headroom_format)
        except (DumpNotFoundError, OSError, ValueError) as exc:
            replays.append(SentinelReplay(trip, path, problem=str(exc) or type(exc).__name__))
            continue
        replays.append(SentinelReplay(trip, path, analysis))
    extra = sorted(p for p in Path(logdir).glob(REPLAY_GLOB) if p.resolve() not in named)
    notes = tuple(
        f"{p} is a replay dump no trip of the history names (the program died during "
        f"the replay?): nanscope report {p} reports it"
        for p in extra
    )
    return SentinelRun(history, tuple(replays), notes)


def _report_sentinel(args: argparse.Namespace) -> int:
    run = read_sentinel(args.logdir[0], args.headroom_format)
    if args.json:
        print(json.dumps(sentinel_json(run), indent=2, allow_nan=False, default=str))
    else:
        render_sentinel_text(run, console_for())
    return run.exit_status
