"""Making sure buffered events reach the disk when a program ends.

Open writers are closed (flushed) at interpreter exit, when an exception
escapes to the top of the main thread or of another thread, and on SIGTERM
and SIGINT. Nothing here can help against SIGKILL or a crash of the
interpreter itself; for those, the writer's periodic flush bounds what is lost
(see ``docs/FORMAT.md``, "What survives a crash").
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any, Protocol


class Source(Protocol):
    """Something that hands events to writers (a backend's buffer): its flush does not wait."""

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Writer(Protocol):
    """Something that writes events to disk: its flush waits at most ``timeout`` seconds."""

    def flush(self, timeout: float | None = ...) -> bool: ...

    def close(self) -> None: ...


# Writers, and (closed and flushed before the writers) what feeds events into
# them: a backend's buffer, e.g. the native PyTorch recorder's. Typed Any so
# that unregister can discard either kind from both.
_writers: weakref.WeakSet[Any] = weakref.WeakSet()
_sources: weakref.WeakSet[Any] = weakref.WeakSet()
_installed = False
_lock = threading.Lock()


def register(writer: Writer) -> None:
    """Close ``writer`` at exit, on an uncaught exception and on SIGTERM/SIGINT."""
    with _lock:
        _writers.add(writer)
        _install_once()


def register_source(source: Source) -> None:
    """Like :func:`register`, for something that hands events to writers: it is
    closed (or flushed) before any writer is."""
    with _lock:
        _sources.add(source)
        _install_once()


def unregister(item: Writer | Source) -> None:
    """Forget a writer or source (it was closed by its owner)."""
    with _lock:
        _writers.discard(item)
        _sources.discard(item)


def _forget_inherited() -> None:
    # In a forked child (a DataLoader worker): the parent's writers and sources are not
    # this process's. Their threads did not come along, and a lock that one of them (or
    # another thread, this module's own lock included) held at the fork stays held here
    # for ever: each writer lets go of its files without a lock, and none is closed at
    # exit. A session the child starts registers anew.
    global _lock
    _lock = threading.Lock()
    for writer in list(_writers):
        forget = getattr(writer, "forget_in_child", None)  # DumpWriter's; others keep theirs
        if forget is not None:
            with contextlib.suppress(Exception):
                forget()
    _writers.clear()
    _sources.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited)


# close_all() calls running (on the main thread: at exit, or in a signal handler), and a
# SIGTERM/SIGINT that arrived during one: delivered again once it is done. A process that
# exits normally while being terminated (a multiprocessing Pool's worker, told to stop and
# then sent SIGTERM) must not die halfway through closing its dump.
_closing = 0
_deferred: int | None = None
_deferred_watch: threading.Event | None = None

# A process told to stop (SIGTERM, SIGINT) while its dumps close ends at most this many
# seconds later, closed or not: a close that hangs (a stuck disk, a bug) must not keep a
# terminated program alive (a multiprocessing Pool joins the workers it terminates, and
# would wait for ever). What was not written then reads as incomplete, never as whole.
CLOSE_AFTER_SIGNAL_S = 30.0


def _watch_close(signum: int) -> threading.Event:
    """End the process ``CLOSE_AFTER_SIGNAL_S`` from now unless the event is set first."""
    done = threading.Event()
    limit = CLOSE_AFTER_SIGNAL_S

    def watchdog() -> None:
        if done.wait(limit):
            return
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"nanscope: closing the dump took over {limit:g} s after signal {signum}; "
                "the process ends without it (the dump reads as incomplete)\n"
            )
            sys.stderr.flush()
        os._exit(128 + signum)

    # Where no thread can start (the interpreter is shutting down), the close is not bounded.
    with contextlib.suppress(RuntimeError):
        threading.Thread(target=watchdog, name="nanscope-close-watchdog", daemon=True).start()
    return done


@contextlib.contextmanager
def closing() -> Iterator[None]:
    """While closing dumps on the main thread: a SIGTERM/SIGINT waits until that is done
    (at most ``CLOSE_AFTER_SIGNAL_S`` from its arrival)."""
    global _closing, _deferred, _deferred_watch
    _closing += 1
    try:
        yield
    finally:
        _closing -= 1
        if not _closing and _deferred is not None:
            signum, _deferred = _deferred, None
            if _deferred_watch is not None:
                _deferred_watch.set()
                _deferred_watch = None
            os.kill(os.getpid(), signum)


def close_all() -> None:
    with closing():
        for w in [*_sources, *_writers]:
            try:
                w.close()
            except Exception as exc:  # never mask the program's own exit status
                print(f"nanscope: could not flush a dump: {exc}", file=sys.stderr)


def flush_all(timeout: float = 5.0) -> None:
    """Flush every open writer without closing it (its sources first)."""
    sources: list[Source] = list(_sources)
    writers: list[Writer] = list(_writers)
    for source in sources:
        with contextlib.suppress(Exception):
            source.flush()
    for writer in writers:
        with contextlib.suppress(Exception):
            writer.flush(timeout=timeout)


def _install_once() -> None:
    global _installed
    if not _installed:
        _installed = True
        _install()


def _install() -> None:
    atexit.register(close_all)

    previous_excepthook = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        close_all()
        previous_excepthook(tp, value, tb)

    sys.excepthook = excepthook

    previous_thread_hook = threading.excepthook

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        # An exception that kills a worker thread may be the last thing the
        # program does before it is killed: get what we have onto the disk.
        flush_all()
        previous_thread_hook(args)

    threading.excepthook = thread_hook

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            _chain_signal(signum)


def _chain_signal(signum: int) -> None:
    previous = signal.getsignal(signum)
    if previous is None or previous is signal.SIG_IGN:
        return

    def handler(num: int, frame: FrameType | None) -> None:
        global _deferred, _deferred_watch
        if _closing:  # it interrupted a close: finish that first (see close_all)
            _deferred = num
            if _deferred_watch is None:
                _deferred_watch = _watch_close(num)
            return
        if num == signal.SIGINT and callable(previous):
            # Python's default SIGINT handler raises KeyboardInterrupt; the
            # exit path then closes the writers, so only flush what we have.
            flush_all()
            previous(num, frame)
            return
        done = _watch_close(num)
        try:
            close_all()
        finally:
            done.set()  # the program's own handler, if any, takes as long as it takes
        if callable(previous):
            previous(num, frame)
            return
        # Default action (terminate): restore it and re-deliver, so the exit
        # status still says "killed by SIGTERM".
        signal.signal(num, signal.SIG_DFL)
        os.kill(os.getpid(), num)

    # Fails outside the main thread of the main interpreter: then no handler.
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signum, handler)
