"""The writer's disk operations, run on a thread of their own.

A full disk, a deleted or read-only dump directory or a hung mount must never
reach the training program. The writer's background thread therefore never
touches a file itself: it hands lists of :class:`Op` to a :class:`DiskWorker`,
whose thread runs them in order, stops at the first failure and keeps the
failed operation and those after it, so that they can be retried later (each
operation is resumable: an append remembers how much of its data reached the
file). While a job is running, or while one failed, the writer keeps its
events in bounded memory (docs/RELIABILITY.md).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

CHUNK = 16 << 20
"""Bytes handed to one :func:`write` call at most: a long write reports its progress
between chunks, so that a slow disk (a 1 GiB FULL_TENSOR record at 50 MB/s) is told
apart from one that stopped responding."""

# The progress callback of the disk thread running the operation (see DiskWorker).
_local = threading.local()


def _progressed() -> None:
    note: Callable[[], None] | None = getattr(_local, "progress", None)
    if note is not None:
        note()


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd``, a chunk at a time (see :data:`CHUNK`)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += write(fd, view[done : done + CHUNK])
        _progressed()


class Op:
    """One resumable file operation; :meth:`run` raises ``OSError`` on failure."""

    __slots__ = ("events", "nonfinite", "of")

    def __init__(self) -> None:
        self.events = 0  # the events whose records it writes (lost if it never runs)
        self.nonfinite = 0  # how many of them hold Inf/NaN
        self.of = ""  # their file's suffix (files.EXECUTION, ...)

    def run(self) -> None:
        raise NotImplementedError


class Append(Op):
    """Append ``data`` to an open file; a retry writes only what did not reach it."""

    __slots__ = ("data", "done", "fd")

    def __init__(self, fd: int, data: bytes) -> None:
        super().__init__()
        self.fd = fd
        self.data = data
        self.done = 0

    def run(self) -> None:
        check_linked(self.fd)
        view = memoryview(self.data)
        while self.done < len(view):
            # A chunk at a time (see CHUNK); `done` survives a failure, so a retry resumes.
            self.done += write(self.fd, view[self.done : self.done + CHUNK])
            _progressed()
        # Free the bytes of a long job as soon as they are on disk.
        self.data = b""
        self.done = 0


class Sync(Op):
    """``fsync`` an open file (at close: what was written survives a power loss)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def run(self) -> None:
        check_linked(self.fd)
        os.fsync(self.fd)


class Replace(Op):
    """Atomically replace a file with ``data`` (readers see the old or the new file whole).

    ``data`` may be a list of pieces, written one after the other: a circular
    buffer's kept records are then never joined into one more copy of them.
    """

    __slots__ = ("data", "path", "sync")

    def __init__(self, path: Path, data: bytes | list[bytes | memoryview], sync: bool) -> None:
        super().__init__()
        self.path = path
        self.data = data
        self.sync = sync

    def run(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for piece in self.data if isinstance(self.data, list) else (self.data,):
                write_all(fd, piece)
            if self.sync:
                os.fsync(fd)
        except BaseException:
            # A half-written copy would hold on to the space a full disk lacks.
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, self.path)


class Overwrite(Op):
    """Write ``data`` at offset 0 of an open file whose blocks were reserved already.

    Overwriting allocated blocks needs no free space: this is how the drop
    report still reaches a full disk.
    """

    __slots__ = ("data", "fd")

    def __init__(self, fd: int, data: bytes) -> None:
        super().__init__()
        self.fd = fd
        self.data = data

    def run(self) -> None:
        check_linked(self.fd)
        view = memoryview(self.data)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], done)
        os.fsync(self.fd)


def write(fd: int, data: memoryview) -> int:
    """``os.write``, the one place where the writer's bytes enter the kernel.

    Tests replace it to make a write hang, as on a stalled network mount.
    """
    return os.write(fd, data)


def check_linked(fd: int) -> None:
    """Raise ``ENOENT`` when the file was deleted (its directory removed, say).

    Writes to a deleted file succeed and go nowhere, filling the disk until
    the process exits; better to notice and stop.
    """
    if os.fstat(fd).st_nlink == 0:
        raise FileNotFoundError(errno.ENOENT, "the dump's files were deleted")


_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.ENOENT: "dump directory deleted",
    errno.EROFS: "file system read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EIO: "I/O error",
}


def reason(exc: BaseException) -> str:
    """A few words for a person: ``disk full``, ``dump directory deleted``, ..."""
    if isinstance(exc, StalledError):
        return "disk too slow" if exc.slow else "disk not responding"
    if isinstance(exc, OSError) and exc.errno in _REASONS:
        return _REASONS[exc.errno]
    return type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"


class StalledError(OSError):
    """A write has not returned for longer than the writer's ``io_timeout``.

    ``slow``: it was still making progress (a slow disk, not a hung one).
    """

    def __init__(self, message: str, slow: bool = False) -> None:
        super().__init__(message)
        self.slow = slow


class DiskWorker:
    """Runs one job (a list of :class:`Op`) at a time on a daemon thread.

    Only the writer's thread calls :meth:`submit` and :meth:`result`; a job
    is submitted only when :meth:`idle`.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._job: list[Op] | None = None
        self._running: list[Op] = []
        self._busy_since: float | None = None  # time.monotonic() when the running job began
        self._progress = 0.0  # time.monotonic() when the running job last wrote a chunk
        self._failed: list[Op] = []
        self._error: BaseException | None = None
        self._finished = True  # no result waiting to be collected
        self._done_events: list[threading.Event] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="nanscope-disk", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        return self._busy_since is None

    def busy_for(self) -> float:
        """Seconds the running job has taken so far (0 when idle)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def stalled_for(self) -> float:
        """Seconds since the running job last made progress (began, or wrote a chunk, or
        finished an operation); 0 when idle. A slow disk keeps this small; a hung one
        lets it grow as :meth:`busy_for` does."""
        since = self._busy_since
        if since is None:
            return 0.0
        return time.monotonic() - max(since, self._progress)

    def wait_progressing(self, deadline: float, stall: float) -> bool:
        """Wait until idle, as long as the running job makes progress (no ``stall`` seconds
        without a chunk written) and ``deadline`` (``time.monotonic()``) has not passed.
        True when idle."""
        while True:
            left = deadline - time.monotonic()
            if self.wait_idle(max(0.0, min(left, 0.25))):
                return True
            if left <= 0 or self.stalled_for() > stall:
                return False

    def submit(self, ops: list[Op], done: threading.Event | None = None) -> None:
        """Run ``ops`` in order; ``done`` is set when all succeeded."""
        with self._cv:
            assert self._busy_since is None
            self._job = ops
            self._done_events = [done] if done is not None else []
            self._busy_since = time.monotonic()
            self._finished = False
            self._cv.notify()

    def wait_idle(self, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._busy_since is None, timeout)

    def running(self) -> list[Op]:
        """The operations of the job now running (empty when idle)."""
        with self._cv:
            return list(self._running)

    def result(self) -> tuple[bool, list[Op], BaseException | None]:
        """``(finished, failed ops, error)`` of the last job, once: ``finished`` is False
        while it runs or when its result was collected already."""
        with self._cv:
            if self._busy_since is not None or self._finished:
                return False, [], None
            self._finished = True
            failed, error = self._failed, self._error
            self._failed, self._error = [], None
            return True, failed, error

    def stop(self) -> None:
        """End the thread once its running job (if any) returns; nothing may be
        submitted afterwards. A job stuck on a hung disk keeps its thread until it
        returns (a daemon thread: it cannot hold up the program's exit)."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    def _note_progress(self) -> None:
        self._progress = time.monotonic()

    def _run(self) -> None:
        _local.progress = self._note_progress
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._job is not None or self._stopping)
                if self._job is None:
                    return  # stopped: one thread per writer, not one per writer ever made
                job, self._job = self._job, None
                self._running = job
            failed: list[Op] = []
            error: BaseException | None = None
            for i, op in enumerate(job):
                try:
                    op.run()
                except Exception as exc:  # OSError mostly; anything else is as fatal to the job
                    failed, error = job[i:], exc
                    break
                self._progress = time.monotonic()
            with self._cv:
                self._failed, self._error = failed, error
                self._running = []
                self._busy_since = None
                if error is None:
                    for event in self._done_events:
                        event.set()
                self._done_events = []
                self._cv.notify_all()
