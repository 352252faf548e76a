"""Argument parsing and error handling shared by every subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nanscope._version import __version__
from nanscope.cli import demo, report, run, serve
from nanscope.cli.errors import CommandError
from nanscope.format.files import DumpNotFoundError

COMMANDS = {"run": run, "report": report, "serve": serve, "demo": demo}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nanscope",
        description="A numerics debugger for deep-learning programs: find where the first "
        "Inf/NaN was born, and why.",
    )
    parser.add_argument("--version", action="version", version=f"nanscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(COMMANDS[args.command].run(args))
    except (CommandError, DumpNotFoundError) as exc:
        print(f"nanscope {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except KeyboardInterrupt:
        return 130
