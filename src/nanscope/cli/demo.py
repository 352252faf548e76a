"""Reproduce the seed tutorial's bug (log of a zero probability), dump it, and show it."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console

from nanscope.analysis import analyze
from nanscope.cli.errors import CommandError
from nanscope.demo import run_demo
from nanscope.reader import DumpReader
from nanscope.report.text import console_for, render_text

HELP = "run the built-in example with nanscope recording, then summarise the dump"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logdir", help="where to write the dump (default: a new temporary directory)")
    p.add_argument("--steps", type=int, default=4, help="training steps (default: 4)")


def run(args: argparse.Namespace) -> int:
    console = Console()
    logdir = Path(args.logdir) if args.logdir else Path(tempfile.mkdtemp(prefix="nanscope-demo-"))
    if logdir.exists() and any(logdir.glob("tfdbg_events.*")):
        raise CommandError(f"{logdir} already holds a dump; choose an empty --logdir")
    console.print(f"Training the demo MLP for {args.steps} steps, recording into {logdir} ...")
    losses = run_demo(logdir, steps=args.steps)
    for step, loss in enumerate(losses):
        console.print(f"  loss at step {step}: {loss:.4g}")
    console.print()
    with DumpReader(logdir) as reader:
        render_text(analyze(reader), console_for())
    console.print(f"\nNext: nanscope report {logdir} --json")
    return 0
