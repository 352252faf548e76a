"""Run the tutorial's example (PyTorch, JAX or TensorFlow) under nanscope, then report on it."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from nanscope.analysis import analyze
from nanscope.cli.errors import CommandError
from nanscope.reader import DumpReader
from nanscope.report import console_for, render_text

HELP = "train the tutorial's example under nanscope and report where its first Inf/NaN came from"


@dataclass(frozen=True)
class Demo:
    """One framework's version of the tutorial's example."""

    label: str  # the framework's name, as people write it
    module: str  # under nanscope.examples; its main() takes the tutorial's flags
    extra: str  # the pip extra that installs the framework
    fix: str  # what --fix changes


DEMOS = {
    "torch": Demo("PyTorch", "debug_mnist", "torch", "clipped log"),
    "jax": Demo("JAX", "debug_mnist_jax", "jax", "log_softmax cross-entropy"),
    "tensorflow": Demo("TensorFlow", "debug_mnist_tf", "tf", "clipped log"),
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--logdir", help="where to write the dump (default: a new temporary directory)")
    p.add_argument("--steps", type=int, default=6, help="training steps (default: 6)")
    p.add_argument(
        "--framework",
        choices=sorted(DEMOS),
        default="torch",
        help="which version of the example to train (default: torch); tensorflow's is "
        "dumped by TensorFlow itself",
    )


def run(args: argparse.Namespace) -> int:
    demo = DEMOS[args.framework]
    if importlib.util.find_spec(args.framework) is None:
        raise CommandError(
            f"the {demo.label} demo needs {demo.label}, which is not installed: "
            f"pip install 'nanscope[{demo.extra}]'"
        )
    example = importlib.import_module(f"nanscope.examples.{demo.module}")

    console = Console()
    logdir = Path(args.logdir) if args.logdir else Path(tempfile.mkdtemp(prefix="nanscope-demo-"))
    if logdir.exists() and any(logdir.glob("tfdbg_events.*")):
        raise CommandError(f"{logdir} already holds a dump; choose an empty --logdir")
    console.print(
        f"Training the Debugger V2 tutorial's MLP (hand-written cross-entropy) in {demo.label} "
        f"on built-in digits for {args.steps} steps, recording into {logdir} ..."
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        example.main(["--dump_dir", str(logdir), "--max_steps", str(args.steps)])
    for line in out.getvalue().splitlines():
        console.print(f"  {line}")
    console.print()
    with DumpReader(logdir) as reader:
        render_text(analyze(reader), console_for())
    console.print(f"\nThe same as JSON: nanscope report {logdir} --json")
    console.print(f"Explore it in the browser: nanscope serve {logdir}")
    console.print(
        f"The fixed model ({demo.fix}) trains: python -m nanscope.examples.{demo.module} --fix"
    )
    return 0
