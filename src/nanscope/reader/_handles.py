"""Read handles on event files, within the process's descriptor limit.

The reader reads an indexed record from the very file it indexed, so that a circular
buffer's file replaced since the last ``update()`` still yields the records its index
points at: its handle stays open. But a dump of many processes has two event files
each (700 processes: 1,400 handles, past the common soft limit of 1,024 descriptors),
and a server reads several dumps at once. So handles are opened lazily and kept in one
cache per Python process, bounded by half the soft ``RLIMIT_NOFILE`` (the other half is
the program's: its sockets and other files). When more are wanted, the soft limit is
first raised to the hard one; past that, the least recently used handle is closed.

A closed handle is reopened on demand by its path, and used only if the path still
names the file that was indexed (same inode and device): otherwise that file's old
records are gone, and :class:`FileChanged` says so instead of returning the bytes of
another file. A handle that is *held* (:meth:`Handle.held`: while its file is being
indexed or a record read) is never closed by the cache.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The cache keeps at least this many handles open, whatever the limit says.
MIN_HANDLES = 16
# Handles kept where the descriptor limit cannot be read (no ``resource`` module).
DEFAULT_HANDLES = 256
# Soft limits tried, largest first, when the hard limit itself is refused (macOS caps the
# soft limit at OPEN_MAX, Linux at fs.nr_open, whatever the hard limit says).
_FALLBACK_LIMITS = (1 << 20, 65536, 10240, 4096)
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class NotARegularFile(OSError):
    """A dump file that is a directory, a FIFO, a device or a socket: never read from."""


class FileChanged(OSError):
    """The path of a handle no longer names the file that was indexed: the file was
    replaced (a circular buffer's rewrite) or deleted after the cache closed its handle,
    so the records the index points at are gone."""


def open_fd(path: Path) -> int:
    """A descriptor reading ``path``, only if it is a regular file (following symlinks).

    ``O_NONBLOCK`` keeps a FIFO planted in a dump from blocking the open; the check
    after it refuses FIFOs, devices (``/dev/zero`` would never end) and directories.
    Raises ``OSError`` (:class:`NotARegularFile` for those).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(f"{path}: not a regular file (a directory, FIFO or device)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def out_of_descriptors(exc: OSError) -> bool:
    """Whether ``exc`` says the process (EMFILE) or the system (ENFILE) has no descriptor left."""
    return exc.errno in _OUT_OF_DESCRIPTORS


class _State:
    """What the cache knows of one handle (kept apart from :class:`Handle`, so that a
    handle nobody holds any more can be collected and its descriptor closed)."""

    __slots__ = ("fd", "identity", "path", "pins")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.identity: tuple[int, int] | None = None  # (st_ino, st_dev) of the indexed file
        self.pins = 0


class _Cache:
    """The open handles of this process, least recently used first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: OrderedDict[int, _State] = OrderedDict()
        # States of handles that were collected: their descriptors are closed at the next
        # operation, under the lock (a finalizer may run at any point, the lock held or not).
        self.dead: list[_State] = []

    # -- under the lock ----------------------------------------------------------------------

    def _purge(self) -> None:
        while self.dead:
            self._close(self.dead.pop())

    def _close(self, state: _State) -> None:
        self.open.pop(id(state), None)
        if state.fd is not None:
            fd, state.fd = state.fd, None
            os.close(fd)

    def _open(self, state: _State) -> os.stat_result:
        """Open ``state.path`` (closing least recently used handles to make room)."""
        self._make_room(len(self.open) + 1)
        try:
            fd = open_fd(state.path)
        except OSError as exc:
            if not out_of_descriptors(exc):
                raise
            # The program holds more descriptors than the limit left it: give back half of
            # ours and try once more.
            self._shed(max(1, len(self.open) // 2))
            fd = open_fd(state.path)
        state.fd = fd
        self.open[id(state)] = state
        return os.fstat(fd)

    def _make_room(self, want: int) -> None:
        if want <= MIN_HANDLES:
            return
        excess = want - _capacity(want)
        if excess > 0:
            self._shed(excess)

    def _shed(self, count: int) -> int:
        """Close up to ``count`` handles that nobody holds, least recently used first."""
        victims = list(itertools.islice((s for s in self.open.values() if s.pins == 0), count))
        for state in victims:
            self._close(state)
        return len(victims)

    # -- the handles' side -------------------------------------------------------------------

    def forget(self, state: _State) -> None:
        """A handle was collected: close its descriptor now if the lock is free, else at
        the next operation (a finalizer may run in a thread that holds the lock)."""
        self.dead.append(state)  # list.append is atomic
        if self.lock.acquire(blocking=False):
            try:
                self._purge()
            finally:
                self.lock.release()

    def shed(self) -> int:
        """Close half of the handles nobody holds (another open found no descriptor left);
        how many were closed."""
        with self.lock:
            self._purge()
            return self._shed(max(1, len(self.open) // 2))


_CACHE = _Cache()


def shed() -> int:
    """Close half of the cached handles that nobody holds, so that an open that found no
    descriptor left can try again; how many were closed."""
    return _CACHE.shed()


def _unlimited(value: int) -> bool:
    return value == _RLIM_INFINITY or value < 0


try:
    import resource

    _RLIM_INFINITY = resource.RLIM_INFINITY
except ImportError:  # not POSIX: no limits to read or raise
    resource = None  # type: ignore[assignment]
    _RLIM_INFINITY = -1


def _capacity(want: int) -> int:
    """How many handles the cache may keep open, with ``want`` wanted: half the soft
    descriptor limit, after raising the soft limit to the hard one when ``want`` is
    more than half of it."""
    if resource is None:
        return DEFAULT_HANDLES
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return DEFAULT_HANDLES
    if _unlimited(soft):
        return 1 << 20
    if want > soft // 2 and (_unlimited(hard) or hard > soft):
        top = _FALLBACK_LIMITS[0] if _unlimited(hard) else hard
        for limit in (top, *(f for f in _FALLBACK_LIMITS if f < top)):
            if limit <= soft:
                break
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            except (OSError, ValueError):
                continue
            soft = limit
            break
    return max(MIN_HANDLES, soft // 2)


class Handle:
    """A lazily (re)opened read handle on one event file, tied to the file first opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._state = _State(path)
        weakref.finalize(self, _CACHE.forget, self._state)

    @property
    def is_open(self) -> bool:
        """Whether a descriptor is open now (the cache may close it at any time it is not held)."""
        return self._state.fd is not None

    def open(self) -> os.stat_result:
        """Open the file now, as the one the index will point into (closing any earlier
        handle); its status. Raises ``OSError`` (:class:`NotARegularFile`, ...)."""
        state = self._state
        with _CACHE.lock:
            _CACHE._purge()
            _CACHE._close(state)
            state.identity = None
            st = _CACHE._open(state)
            state.identity = (st.st_ino, st.st_dev)
            return st

    def close(self) -> None:
        """Close the handle; a later :meth:`open` starts afresh (reads fail until then)."""
        state = self._state
        with _CACHE.lock:
            _CACHE._purge()
            _CACHE._close(state)
            state.identity = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """While inside, the cache does not close this handle once it is open (nested use
        is fine); nothing is opened by holding it."""
        state = self._state
        with _CACHE.lock:
            state.pins += 1
        try:
            yield
        finally:
            with _CACHE.lock:
                state.pins -= 1
                _CACHE._purge()
                if state.pins == 0:
                    _CACHE._make_room(len(_CACHE.open))

    def _fd(self) -> int:
        """The open descriptor, reopened if the cache closed it; call it while held.

        Raises :class:`FileChanged` when the path names another file than the one
        opened first (or none), ``OSError`` when it cannot be opened.
        """
        state = self._state
        with _CACHE.lock:
            _CACHE._purge()
            if state.fd is not None:
                _CACHE.open.move_to_end(id(state))
                return state.fd
            if state.identity is None:
                raise FileChanged(errno.EBADF, "not indexed yet, or closed", str(self.path))
            try:
                st = _CACHE._open(state)
            except FileNotFoundError:
                raise FileChanged(
                    errno.ENOENT, "deleted since it was indexed", str(self.path)
                ) from None
            if (st.st_ino, st.st_dev) != state.identity:
                _CACHE._close(state)
                raise FileChanged(errno.ESTALE, "replaced since it was indexed", str(self.path))
            assert state.fd is not None
            return state.fd

    def pread(self, length: int, offset: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer at the end of the file)."""
        with self.held():
            return os.pread(self._fd(), length, offset)

    def readinto(self, buffer: memoryview, offset: int) -> int:
        """Fill ``buffer`` from ``offset`` on; the number of bytes read (short at the end)."""
        with self.held():
            fd = self._fd()
            done, size = 0, len(buffer)
            while done < size:
                if hasattr(os, "preadv"):
                    got = os.preadv(fd, [buffer[done:]], offset + done)
                else:  # no preadv (Windows): read, then copy
                    data = os.pread(fd, size - done, offset + done)
                    got = len(data)
                    buffer[done : done + got] = data
                if got <= 0:
                    break
                done += got
            return done


def open_count() -> int:
    """How many handles the cache holds open now (for tests and diagnostics)."""
    with _CACHE.lock:
        _CACHE._purge()
        return len(_CACHE.open)
