"""Run the tutorial's example (PyTorch) with nanscope recording, then report on the dump."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import tempfile
from pathlib import Path

from rich.console import Console

from nanscope.analysis import analyze
from nanscope.cli.errors import CommandError
from nanscope.reader import DumpReader
from nanscope.report import console_for, render_text

HELP = "train the tutorial's example under nanscope and report where its first Inf/NaN came from"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logdir", help="where to write the dump (default: a new temporary directory)")
    p.add_argument("--steps", type=int, default=6, help="training steps (default: 6)")


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("torch") is None:
        raise CommandError("the demo trains a PyTorch model: pip install 'nanscope[torch]'")
    from nanscope.examples import debug_mnist

    console = Console()
    logdir = Path(args.logdir) if args.logdir else Path(tempfile.mkdtemp(prefix="nanscope-demo-"))
    if logdir.exists() and any(logdir.glob("tfdbg_events.*")):
        raise CommandError(f"{logdir} already holds a dump; choose an empty --logdir")
    console.print(
        "Training the Debugger V2 tutorial's MLP (hand-written cross-entropy) on built-in "
        f"digits for {args.steps} steps, recording into {logdir} ..."
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        debug_mnist.main(["--dump_dir", str(logdir), "--max_steps", str(args.steps)])
    for line in out.getvalue().splitlines():
        console.print(f"  {line}")
    console.print()
    with DumpReader(logdir) as reader:
        render_text(analyze(reader), console_for())
    console.print(f"\nThe same as JSON: nanscope report {logdir} --json")
    console.print(f"Explore it in the browser: nanscope serve {logdir}")
    console.print(
        "The fixed model (clipped log) trains: python -m nanscope.examples.debug_mnist --fix"
    )
    return 0
