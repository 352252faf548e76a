"""Run a Python program with nanscope recording, without changing the program.

Like ``python script.py args`` or ``python -m module args``: the program sees
the same ``sys.argv``, ``sys.path[0]`` and ``__main__``, and the exit status
is the program's. Recording starts when the program imports its framework
(PyTorch: nanscope's recorder; TensorFlow: TensorFlow's own dumping into the
same logdir).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from nanscope._imports import AfterImport
from nanscope.backends import RECORDED
from nanscope.cli.errors import CommandError
from nanscope.format.files import PREFIX
from nanscope.format.modes import parse_mode

HELP = "run a Python program (script.py or -m module) with nanscope recording"


def configure(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s [options] (-m module | script.py) [args ...]"
    p.add_argument("--logdir", help="where to write the dump (default: ./nanscope-<program name>)")
    p.add_argument("--mode", default="FULL_HEALTH", help="tensor debug mode (default: FULL_HEALTH)")
    p.add_argument(
        "--circular-buffer-size", type=int, default=1000,
        help="keep the last N events, and always the first Inf/NaN (-1: keep all; default 1000)",
    )  # fmt: skip
    p.add_argument("--op-regex", help="summarise only ops whose type matches this regex")
    p.add_argument(
        "--check-numerics", action="store_true",
        help="raise at the first NaN or harmful Inf instead of recording a dump",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace a dump already in --logdir")
    p.add_argument("-m", dest="module", help="run a library module as a script (like python -m)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="script.py [args ...], or args of -m")


def _default_logdir(args: argparse.Namespace) -> Path:
    name = args.module or Path(args.target[0]).stem
    return Path(f"nanscope-{name.replace('.', '_')}")


def _prepare_logdir(logdir: Path, force: bool) -> None:
    existing = sorted(logdir.glob(f"{PREFIX}.*")) if logdir.is_dir() else []
    if existing and not force:
        raise CommandError(
            f"{logdir} already holds a dump; pass --force to replace it or choose another --logdir"
        )
    for p in existing:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    _check_writable(logdir)


def _check_writable(logdir: Path) -> None:
    """Fail before the program runs when the dump could not be written (a read-only
    logdir, say), leaving nothing behind: not after it ran for hours unrecorded."""
    made: list[Path] = []
    try:
        missing = [p for p in (logdir, *logdir.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir()
            made.append(p)
        fd, probe = tempfile.mkstemp(prefix=".nanscope-probe-", dir=logdir)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CommandError(f"cannot write the dump in {logdir}: {exc.strerror or exc}") from None
    finally:
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()


def run(args: argparse.Namespace) -> int:
    if not args.module and not args.target:
        raise CommandError("nothing to run: give script.py [args] or -m module [args]")
    if not args.module and args.target[0] == "-m":
        if len(args.target) < 2:
            raise CommandError("-m needs a module name")
        args.module, args.target = args.target[1], args.target[2:]
    if not args.module and not Path(args.target[0]).is_file():
        raise CommandError(f"{args.target[0]}: no such file")
    try:
        mode = parse_mode(args.mode)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    logdir = Path(args.logdir) if args.logdir else _default_logdir(args)
    if not args.check_numerics:
        _prepare_logdir(logdir, args.force)

    import nanscope

    started: list[str] = []
    failed: list[str] = []

    def start(framework: str) -> None:
        if started:
            return
        started.append(framework)
        try:
            if args.check_numerics:
                nanscope.enable_check_numerics(framework=framework)
            else:
                nanscope.enable_dump_debug_info(
                    logdir, mode, args.circular_buffer_size, args.op_regex, framework=framework
                )
        except Exception as exc:  # the program runs on, unrecorded: never take it down
            failed.append(str(exc) or type(exc).__name__)
            print(f"nanscope: recording is off: {failed[0]}", file=sys.stderr)

    # Recording starts when the program imports a framework that nanscope records.
    already = [f for f in RECORDED if f in sys.modules]
    if already:
        start(already[0])
    hook = AfterImport(RECORDED, start)
    code = _run_program(args)
    hook.remove()
    if args.check_numerics:
        nanscope.disable_check_numerics()
    else:
        nanscope.disable_dump_debug_info()
        if failed:
            print(f"\nnanscope: no dump was written: {failed[0]}", file=sys.stderr)
        elif started:
            print(f"\nnanscope: dump written to {logdir}", file=sys.stderr)
            print(f"nanscope: next, run: nanscope report {logdir}", file=sys.stderr)
        else:
            print(
                "nanscope: the program imported none of PyTorch, JAX and TensorFlow; nothing was recorded",
                file=sys.stderr,
            )
    return code


def _run_program(args: argparse.Namespace) -> int:
    """Run the target like the python launcher does; returns its exit status."""
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    try:
        if args.module:
            sys.argv = [args.module, *args.target]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            script = args.target[0]
            sys.argv = [script, *args.target[1:]]
            sys.path[0:0] = [os.path.dirname(os.path.abspath(script))]
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] != saved_path0:
            del sys.path[0]
