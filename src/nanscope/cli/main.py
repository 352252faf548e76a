"""Argument parsing and error handling shared by every subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from nanscope._version import __version__
from nanscope.cli.errors import CommandError
from nanscope.format.files import DumpNotFoundError

# One module per subcommand (nanscope.cli.<name>), imported when needed: the report's and
# the server's libraries are no part of `nanscope run`, which must start fast.
COMMANDS = ("run", "report", "diff", "serve", "demo")


def command(name: str) -> ModuleType:
    """The module of the subcommand ``name``."""
    return importlib.import_module(f"nanscope.cli.{name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` (when the command line names it)."""
    parser = argparse.ArgumentParser(
        prog="nanscope",
        description="A numerics debugger for deep-learning programs: find where the first "
        "Inf/NaN was born, and why.",
    )
    parser.add_argument("--version", action="version", version=f"nanscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        module = command(name)
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(words)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(command(args.command).run(args))
    except (CommandError, DumpNotFoundError) as exc:
        print(f"nanscope {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except KeyboardInterrupt:
        return 130
