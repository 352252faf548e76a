"""Run a Python program with nanscope recording, without changing the program.

Like ``python script.py args`` or ``python -m module args``: the program sees
the same ``sys.argv``, ``sys.path[0]`` and ``__main__``, and the exit status
is the program's. Recording starts when the program imports its framework
(PyTorch: nanscope's recorder; TensorFlow: TensorFlow's own dumping into the
same logdir), and ends where Python would exit: after the program's non-daemon
threads. An exception that escapes the program goes to its own sys.excepthook.
The Python processes the program starts (spawn, forkserver and fork workers, Python
run by subprocess) record into the same logdir, each as its own process:
cli/_children.py.

``--sentinel`` records no op: the sentinel checks each training step instead, and
replays a step that went bad with everything recorded (cli/_sentinel.py); it watches
the program's own process only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import runpy
import stat
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from types import TracebackType

from nanscope._paths import is_library_file, is_nanscope_file
from nanscope.cli._children import Recording, children_recorded
from nanscope.cli.errors import CommandError
from nanscope.format.files import PREFIX, UNRECORDED
from nanscope.format.modes import parse_mode

HELP = "run a Python program (script.py or -m module) with nanscope recording"


def configure(p: argparse.ArgumentParser) -> None:
    p.usage = "%(prog)s [options] (-m module | script.py) [args ...]"
    p.add_argument("--logdir", help="where to write the dump (default: ./nanscope-<program name>)")
    p.add_argument("--mode", default="FULL_HEALTH", help="tensor debug mode (default: FULL_HEALTH)")
    p.add_argument(
        "--circular-buffer-size",
        type=int,
        default=1000,
        help="keep the last N events, and always the first Inf/NaN (-1: keep all; default 1000)",
    )
    p.add_argument("--op-regex", help="summarise only ops whose type matches this regex")
    p.add_argument(
        "--check-numerics",
        action="store_true",
        help="raise at the first NaN or harmful Inf instead of recording a dump",
    )
    p.add_argument(
        "--sentinel",
        action="store_true",
        help="record no op: check every optimizer step for Inf/NaN (loss, gradients, "
        "parameters, optimizer state) at almost no cost, in this process only (not in the "
        "processes the program starts); a step run as nanscope.sentinel.step(fn, *args) is "
        "replayed with everything recorded when it goes bad",
    )
    p.add_argument(
        "--on-nan",
        choices=("stop", "skip"),
        default="stop",
        help="with --sentinel: at Inf/NaN, stop the program (default), or skip the step and go on",
    )
    p.add_argument(
        "--snapshot-state",
        action="store_true",
        help="with --sentinel: copy the parameters and optimizer state before each step, so "
        "that a NaN born in the optimizer step can be replayed (costs a copy a step)",
    )
    p.add_argument(
        "--statistics",
        action="store_true",
        help="with FULL_HEALTH (PyTorch): also record each float output's mean, std, L2 norm "
        "and a hash of its bits, what `nanscope diff` compares",
    )
    p.add_argument("--force", action="store_true", help="replace a dump already in --logdir")
    p.add_argument("-m", dest="module", help="run a library module as a script (like python -m)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="script.py [args ...], or args of -m")


def _default_logdir(args: argparse.Namespace) -> Path:
    name = args.module or Path(args.target[0]).stem
    return Path(f"nanscope-{name.replace('.', '_')}")


def _prepare_logdir(logdir: Path, force: bool) -> None:
    """Refuse a logdir that holds a dump, or with ``force`` remove the dump's entries.

    ``--force`` removes only what a dump is made of: regular files, and symbolic
    links, which are unlinked themselves and never followed (a link to another
    directory must not empty that directory). Anything else (a directory, a FIFO,
    a socket, a device) is not nanscope's to delete: a one-line error, and every
    entry is checked before any is removed, so that a refusal leaves the old dump whole.
    """
    existing = sorted(logdir.glob(f"{PREFIX}.*")) if logdir.is_dir() else []
    if existing and not force:
        raise CommandError(
            f"{logdir} already holds a dump; pass --force to replace it or choose another --logdir"
        )
    for p in existing:
        try:
            mode = p.lstat().st_mode
        except FileNotFoundError:  # gone since the listing: nothing to remove
            continue
        except OSError as exc:
            raise CommandError(
                f"cannot replace the dump in {logdir}: {p}: {exc.strerror or exc}"
            ) from None
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise CommandError(
                f"{p} is {_kind(mode)}, not a file of a dump, so --force will not delete it; "
                "move it away or choose another --logdir"
            )
    for p in existing:
        try:
            p.unlink()  # a symbolic link goes itself; what it points to stays
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CommandError(
                f"cannot replace the dump in {logdir}: {p}: {exc.strerror or exc}"
            ) from None
    _check_writable(logdir)


def _kind(mode: int) -> str:
    """What a file that is neither a regular file nor a symbolic link is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


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
    """Check the command line and the logdir, run the program recorded; its exit status.

    Bad input (no such script or module, an unknown mode, a bad --op-regex, a logdir
    that cannot hold the dump) is a :class:`CommandError` before the program runs.
    """
    if not args.module and not args.target:
        raise CommandError("nothing to run: give script.py [args] or -m module [args]")
    if not args.module and args.target[0] == "-m":
        if len(args.target) < 2:
            raise CommandError("-m needs a module name")
        args.module, args.target = args.target[1], args.target[2:]
    if not args.module:
        _check_script(args.target[0])
    if args.sentinel:
        from nanscope.cli._sentinel import run_sentinel

        logdir = Path(args.logdir) if args.logdir else _default_logdir(args)
        return run_sentinel(args, logdir, sys.modules[__name__])
    if args.on_nan != "stop" or args.snapshot_state:
        raise CommandError("--on-nan and --snapshot-state go with --sentinel")
    try:
        mode = parse_mode(args.mode)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.statistics and (args.check_numerics or mode.name != "FULL_HEALTH"):
        raise CommandError(
            "--statistics goes with --mode FULL_HEALTH (the default), not with "
            + ("--check-numerics" if args.check_numerics else f"--mode {mode.name}")
        )
    if args.op_regex is not None:
        # The recorder compiles it once the program imports its framework: a bad one
        # found then would leave the whole run unrecorded. Say so before it starts.
        try:
            re.compile(args.op_regex)
        except re.error as exc:
            raise CommandError(
                f"--op-regex {args.op_regex!r} is not a regular expression: {exc}"
            ) from None
    logdir = Path(args.logdir) if args.logdir else _default_logdir(args)
    if not args.check_numerics:
        _prepare_logdir(logdir, args.force)

    recording = Recording(
        logdir,
        mode,
        args.circular_buffer_size,
        args.op_regex,
        args.check_numerics,
        statistics=args.statistics,
    )
    # Recording starts when the program imports a framework that nanscope records; the
    # Python processes it starts record too (cli/_children.py).
    with children_recorded(recording):
        hook = recording.watch()
        uncaught: BaseException | None = None
        finished = False
        try:
            code, uncaught = _run_program(args)
            if uncaught is not None:
                # What was recorded reaches the disk before the program's own hook runs: a
                # hook may end the process (os._exit) or hang. Recording goes on: Python
                # still waits for the program's other threads after the hook.
                for session in recording.sessions:
                    with contextlib.suppress(Exception):
                        session.flush()
                _report_uncaught(uncaught)
            code = _wait_for_threads(code)
            finished = True
        finally:
            if hook is not None:
                hook.remove()
            unread = _stop_recording(
                args.check_numerics, failed=not finished or uncaught is not None
            )
    if args.check_numerics:
        if unread is not None:
            print("".join(traceback.format_exception_only(unread)), end="", file=sys.stderr)
            return code or 1
    elif recording.failed:
        print(f"\nnanscope: no dump was written: {recording.failed[0]}", file=sys.stderr)
    elif recording.started or any(logdir.glob(f"{PREFIX}.*.metadata")):  # or the children's
        print(f"\nnanscope: dump written to {logdir}", file=sys.stderr)
        _tell_unrecorded(logdir)
        print(f"nanscope: next, run: nanscope report {logdir}", file=sys.stderr)
    elif _tell_unrecorded(logdir):
        pass
    else:
        print(
            "nanscope: the program imported none of PyTorch, JAX and TensorFlow; nothing was recorded",
            file=sys.stderr,
        )
    return code


def _tell_unrecorded(logdir: Path) -> bool:
    """One line if processes of the program ran unrecorded (their ``.nsunrecorded`` notes)."""
    notes = list(logdir.glob(f"{PREFIX}.*.{UNRECORDED}")) if logdir.is_dir() else []
    if notes:
        n = len(notes)
        print(
            f"nanscope: {n} process{'es' if n > 1 else ''} of the program imported a framework "
            f"but ran unrecorded (nanscope could not be imported there); see the notes in {logdir}",
            file=sys.stderr,
        )
    return bool(notes)


def _stop_recording(check_numerics: bool, *, failed: bool) -> BaseException | None:
    """Stop recording (or checking); returns the Inf/NaN that checking found unread at the end.

    ``failed``: the program died of an exception (or nanscope stopped it). Then, as in a
    program's own ``finally`` block, Inf/NaN left unread are not reported: the run did not
    reach its end, and its own exception is what it has to say.
    """
    import nanscope

    if not check_numerics:
        nanscope.disable_dump_debug_info()  # never raises: write errors go to stderr
        return None
    try:
        nanscope.disable_check_numerics()
    except nanscope.NonFiniteError as exc:
        return None if failed else exc
    return None


def _check_script(target: str) -> None:
    """A one-line error, before anything runs, for a script that cannot be run."""
    path = Path(target)
    if path.is_dir():
        raise CommandError(f"{target}: is a directory; give script.py [args] or -m module [args]")
    if not path.is_file():
        raise CommandError(f"{target}: no such file")
    if not os.access(path, os.R_OK):
        raise CommandError(f"{target}: cannot read it (permission denied)")


# What to do about a module that cannot be found, as ``python -m`` would look for it.
_NOT_FOUND_HINT = "check the name, and that its directory is the current one or on PYTHONPATH"


class _NotRunnable(ImportError):
    """What runpy raises when ``python -m`` would say it cannot run a module."""


def _module_problem(name: str) -> str | None:
    """Why ``python -m name`` could not run the module (none of that name, a package
    without ``__main__``, ...), or ``None``; told apart from an ImportError of the program.

    Uses runpy's own resolution, the one ``python -m`` uses (it imports the parent
    packages, as running the module does anyway); :func:`runpy.run_module` then finds
    the same module again. Where that private helper is missing, nothing is checked
    here and such a module shows as the program's ImportError.
    """
    details = getattr(runpy, "_get_module_details", None)
    if details is None:
        return None
    try:
        details(name, _NotRunnable)
    except _NotRunnable as exc:
        if str(exc) == f"No module named {name}" or isinstance(exc.__cause__, ImportError):
            return f"-m {name}: {exc}; {_NOT_FOUND_HINT}"
        return f"-m {name}: {exc}"
    return None


def _run_program(args: argparse.Namespace) -> tuple[int, BaseException | None]:
    """Run the target like the python launcher does.

    Returns its exit status, and the exception that escaped it (``None`` when it ended
    or called ``sys.exit``). Raises :class:`CommandError` for a module that cannot run.
    """
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    problem: str | None = None
    try:
        if args.module:
            sys.argv = [args.module, *args.target]
            sys.path.insert(0, os.getcwd())
        else:
            script = args.target[0]
            sys.argv = [script, *args.target[1:]]
            sys.path[0:0] = [os.path.dirname(os.path.abspath(script))]
        try:
            # Finding the module runs its parent packages' code: the program's, so
            # what that raises is the program's too.
            if args.module:
                problem = _module_problem(args.module)
                if problem is None:
                    runpy.run_module(args.module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            if exc.code is None:
                return 0, None
            if isinstance(exc.code, int):
                return exc.code, None
            print(exc.code, file=sys.stderr)
            return 1, None
        except BaseException as exc:
            return (130 if isinstance(exc, KeyboardInterrupt) else 1), exc
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] != saved_path0:
            del sys.path[0]
    if problem is not None:
        raise CommandError(problem)
    return 0, None


def _report_uncaught(exc: BaseException) -> None:
    """Hand an exception that escaped the program to ``sys.excepthook``, as Python does.

    The program's own hook (a logger, a crash reporter, a debugger) is called as it
    would be without nanscope, with the program's frames only: the launcher's frames
    (this module, runpy) and nanscope's are not the program's (:func:`_program_traceback`).
    """
    exc = _strip_chain(exc)
    tb = exc.__traceback__
    # As Python's own top level does: pdb.pm() and friends look here.
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    hook = getattr(sys, "excepthook", None)
    if hook is None:
        print("sys.excepthook is missing", file=sys.stderr)
        traceback.print_exception(exc)
        return
    try:
        hook(type(exc), exc, tb)
    except Exception as hook_exc:  # a broken hook: show both, as Python does
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exception(_strip_chain(hook_exc))
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(exc)


def _program_traceback(
    tb: TracebackType | None, nanscope_error: bool = False
) -> TracebackType | None:
    """``tb`` with the program's frames only, as ``python script.py`` would show it.

    Left out: the launcher's frames (this module, runpy, nanscope's console script),
    which sit under every frame of the program, and nanscope's own frames (the
    recorder's and the checker's), which sit between the program's frames and what
    it called. When nanscope raised the error (``nanscope_error``, or its innermost
    frame is nanscope's: check_numerics' ``NonFiniteError``), the library frames that
    only led from the program's last line into nanscope go too: the traceback ends at
    the program's line, and the error's text says the rest.
    For a script that does not compile, no frame is left: the error shows as
    ``python script.py`` shows it, the file and line that did not parse.
    """
    frames: list[TracebackType] = []
    innermost_is_nanscope = False
    while tb is not None:
        innermost_is_nanscope = _is_nanscope_frame(tb)
        if not innermost_is_nanscope:
            frames.append(tb)
        tb = tb.tb_next
    if nanscope_error or innermost_is_nanscope:
        users = [
            i for i, f in enumerate(frames) if not is_library_file(f.tb_frame.f_code.co_filename)
        ]
        if users:  # a program installed as a package is all library frames: kept whole
            del frames[users[-1] + 1 :]
    # Built anew rather than relinked, so that the original chain stays whole for
    # whatever else holds it.
    kept: TracebackType | None = None
    for frame in reversed(frames):
        kept = TracebackType(kept, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return kept


def _is_nanscope_frame(tb: TracebackType) -> bool:
    """A frame of the launcher (this module, runpy, the console script) or of nanscope."""
    frame = tb.tb_frame
    return frame.f_globals.get("__name__") in (__name__, "runpy") or is_nanscope_file(
        frame.f_code.co_filename
    )


def _strip_chain(exc: BaseException) -> BaseException:
    """``exc`` with :func:`_program_traceback`, and so the exceptions it was raised from
    or while handling (``__cause__``, ``__context__``), each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        mine = type(e).__module__.partition(".")[0] == "nanscope"
        e.with_traceback(_program_traceback(e.__traceback__, nanscope_error=mine))
        todo += [e.__cause__, e.__context__]
    return exc


def _run_threading_atexits() -> None:
    """Run, once, the callbacks ``threading._register_atexit`` holds (CPython runs them when
    the main module ends, before joining non-daemon threads); they are taken off the list, so
    that the interpreter's shutdown does not run them a second time."""
    callbacks = getattr(threading, "_threading_atexits", None)
    if not isinstance(callbacks, list):
        return
    pending = list(reversed(callbacks))
    callbacks.clear()
    for callback in pending:
        try:
            callback()
        except Exception:  # as at interpreter shutdown: one failing callback stops no other
            traceback.print_exc()


def _wait_for_threads(code: int) -> int:
    """Wait for the program's non-daemon threads before recording stops.

    Python does, after the main module ends and before the process exits: what those
    threads compute is part of the run, and a dump closed before they end would miss
    it (and call the run clean). Daemon threads are not waited for, as in Python.
    Ctrl+C stops the wait (exit status 130 unless the program chose one).
    """
    current = threading.current_thread()
    stopped_pools = False
    try:
        while True:
            alive = [
                t
                for t in threading.enumerate()
                if t is not current and not t.daemon and t.is_alive()
            ]
            if not alive:
                return code
            if not stopped_pools:
                # As Python's own shutdown does before it joins them: the threading atexit
                # callbacks let worker pools end (concurrent.futures' executors, which
                # torch.compile keeps: their idle workers never end until told to).
                stopped_pools = True
                _run_threading_atexits()
                continue
            for t in alive:  # again after: a thread may start others
                t.join()
    except KeyboardInterrupt:
        return code or 130
