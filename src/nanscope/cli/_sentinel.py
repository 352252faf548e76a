"""``nanscope run --sentinel``: run a program with the sentinel on, instead of recording.

Nothing is recorded per op. When the program imports PyTorch, the sentinel starts
(``nanscope.sentinel.start(logdir, ...)``): it checks every optimizer step through
torch.optim's hooks, and a step the program runs through ``nanscope.sentinel.step(fn,
*args)`` is one it can replay with everything recorded when it goes bad. It stops where
Python would exit (``nanscope.sentinel.stop()``), after the program's non-daemon
threads; the exit status is the program's. Only the program's own process is watched:
the processes it starts (DataLoader workers, spawned ranks) run without the sentinel.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from nanscope._imports import AfterImport
from nanscope.cli.errors import CommandError

# The frameworks the sentinel watches (PyTorch's: JAX's steps have their own API).
WATCHED = ("torch",)
HISTORY_FILE = "sentinel.jsonl"  # nanscope.sentinel.HISTORY_FILE, without importing it here
REPLAY_GLOB = "replay-step-*"


class SentinelStart:
    """Starts the sentinel once the program has imported PyTorch (or at once, if it has)."""

    def __init__(self, logdir: Path, options: dict[str, Any]) -> None:
        self.logdir = logdir
        self.options = options
        self.started = False
        self.failed: str | None = None

    def __call__(self, framework: str) -> None:
        if self.started or self.failed:
            return
        try:
            import nanscope.sentinel as sentinel

            sentinel.start(self.logdir, **self.options)
            self.started = True
        except Exception as exc:  # the program runs on, unwatched: never take it down
            self.failed = str(exc) or type(exc).__name__
            print(f"nanscope: the sentinel is off: {self.failed}", file=sys.stderr)

    def watch(self) -> AfterImport | None:
        """Start now if PyTorch is imported, else when it is (the finder that waits)."""
        if any(name in sys.modules for name in WATCHED):
            self(WATCHED[0])
            return None
        return AfterImport(WATCHED, self)

    def stop(self, uncaught: BaseException | None = None) -> None:
        """Stop the sentinel: its history gets its end (with the exception that ended the
        program, if one did) and is closed."""
        if not self.started:
            return
        try:
            import nanscope.sentinel as sentinel
            from nanscope.sentinel._errors import error_words

            sentinel.stop(error_words(uncaught))
        except Exception as exc:
            print(f"nanscope: stopping the sentinel failed: {exc}", file=sys.stderr)


def prepare_logdir(logdir: Path, force: bool, launcher: ModuleType) -> None:
    """Refuse a logdir that holds a sentinel's history, or with ``force`` remove it (its
    ``sentinel.jsonl`` and the dumps of its ``replay-step-*`` directories, as
    ``launcher``, cli/run.py, replaces a dump)."""
    history = logdir / HISTORY_FILE
    replays = sorted(p for p in logdir.glob(REPLAY_GLOB)) if logdir.is_dir() else []
    if (history.exists() or replays) and not force:
        raise CommandError(
            f"{logdir} already holds a sentinel's history; pass --force to replace it or "
            "choose another --logdir"
        )
    for replay in replays:
        if not replay.is_dir() or replay.is_symlink():
            raise CommandError(
                f"{replay} is not a replay dump's directory, so --force will not delete it; "
                "move it away or choose another --logdir"
            )
        launcher._prepare_logdir(replay, force=True)  # the dump's files only, as for a dump
        try:
            replay.rmdir()
        except OSError:
            raise CommandError(
                f"{replay} holds files that are not a dump's, so --force will not delete them; "
                "move them away or choose another --logdir"
            ) from None
    if history.is_symlink() or history.is_file():
        history.unlink()
    elif history.exists():
        raise CommandError(f"{history} is not a file; move it away or choose another --logdir")
    launcher._check_writable(logdir)


def run_sentinel(args: argparse.Namespace, logdir: Path, launcher: ModuleType) -> int:
    """Run the program (checked by ``nanscope run``) with the sentinel; its exit status.

    ``launcher`` is cli/run.py, whose functions run the program as ``python`` would
    (passed in: run.py imports this module, not the other way round).
    """
    if args.check_numerics:
        raise CommandError(
            "--sentinel and --check-numerics both watch the run for Inf/NaN: choose one"
        )
    if args.op_regex is not None:
        raise CommandError("--op-regex selects the ops to record; --sentinel records none")
    if getattr(args, "statistics", False):
        raise CommandError("--statistics adds to what is recorded; --sentinel records no op")
    prepare_logdir(logdir, args.force, launcher)
    options = {"on_nan": args.on_nan, "snapshot_state": args.snapshot_state}
    starter = SentinelStart(logdir, options)
    hook = starter.watch()
    uncaught: BaseException | None = None
    try:
        code, uncaught = launcher._run_program(args)
        if uncaught is not None:
            launcher._report_uncaught(uncaught)
        code = launcher._wait_for_threads(code)
    finally:
        if hook is not None:
            hook.remove()
        starter.stop(uncaught)
    _summary(logdir, starter, uncaught)
    return int(code)


def _summary(logdir: Path, starter: SentinelStart, uncaught: BaseException | None) -> None:
    """One line on what the sentinel saw, and the command that reports it."""
    if starter.failed:
        print(f"\nnanscope: the sentinel did not run: {starter.failed}", file=sys.stderr)
        return
    if not (logdir / HISTORY_FILE).is_file():
        if not starter.started:
            print(
                "nanscope: the program imported no PyTorch; the sentinel did not run",
                file=sys.stderr,
            )
        else:
            print(f"\nnanscope: the sentinel wrote no history in {logdir}", file=sys.stderr)
        return
    from nanscope.cli.report import read_sentinel
    from nanscope.report import sentinel_headline

    said = "its history cannot be read"
    with contextlib.suppress(CommandError):
        run = read_sentinel(logdir)
        mark = {"tripped": "✗", "incomplete": "?", "clean": "✓"}[run.verdict]
        said = f"{mark} {sentinel_headline(run)}"
        if uncaught is not None and run.verdict == "clean":
            # A step the exception cut short was never checked.
            said += (
                f", but the program died of {type(uncaught).__name__}: "
                "a step it cut short was not checked"
            )
    print(f"\nnanscope: sentinel: {said}", file=sys.stderr)
    print(f"nanscope: next, run: nanscope report {logdir}", file=sys.stderr)
