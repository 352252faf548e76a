"""The runs under a logdir, each with its reader, kept up to date while programs still write.

A *run* is one directory holding a dump (its file sets: one per process or host).
``nanscope serve LOGDIR`` shows every run found under ``LOGDIR`` (the logdir itself
when it is a dump), and new ones as they appear. Directories holding a sentinel's
history (``sentinel.jsonl``, :mod:`nanscope.sentinel`) are noted on the same walk
(:meth:`RunSet.sentinels`); the replay dumps below them are runs like any other.

Given several logdirs (``nanscope serve /a/logs /b/logs``: one per host, each host
writing its ranks below its own), directories whose file sets record the same run id
are one run, read as one dump: ``/a/logs/job1`` and ``/b/logs/job1`` of run X make
the run ``job1`` with both directories. A run is named by its directory relative to
the logdir where it was found first (in the order the logdirs were given); a name
already taken by another run gets ``@<n>``, the logdir's place (1 for the first).

Requests never wait on the filesystem walk: the run index is a snapshot, refreshed
incrementally (only directories whose modification time changed are listed again)
by a watcher thread, or by one request at a time when there is none. Readers of one
run share it: decoding takes a shared lock, and only catching up with the files
(when they changed) takes it exclusively.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nanscope.format import files
from nanscope.reader import TRACES, DumpReader, read_run_id
from nanscope.sentinel._history import HISTORY_FILE  # the module: the package imports more

T = TypeVar("T")

# How deep below the logdir runs are looked for (logdir/experiment/seed/run is depth 3).
MAX_DEPTH = 4
_METADATA_GLOB = f"{files.PREFIX}.*.{files.METADATA}"
# A directory (or dump file) changed this recently may change again within the same
# timestamp tick, unseen by a comparison of times: such entries are looked at again.
_RACY_NS = 2_000_000_000
# The watcher spends at most about this share of a core walking the logdir.
_WATCH_DUTY = 0.1
# Values of keys that clients choose freely (a list filter's op type, process, ...) kept per
# run, the least recently used dropped first: a client asking for ever new filters must
# not grow the server's memory without end.
MAX_BOUNDED = 16


class RunNotFound(LookupError):
    """No run of that name under the logdir."""


def find_runs(logdir: Path, max_depth: int = MAX_DEPTH) -> list[str]:
    """Names (paths relative to ``logdir``, ``"."`` for itself) of the directories holding a dump.

    Symbolic links to directories are not followed, so a run cannot lead the
    server outside the logdir, and hidden directories are skipped.
    """
    return _RunIndex(logdir, max_depth).scan()


@dataclass(frozen=True)
class _Dir:
    mtime_ns: int
    children: tuple[str, ...]  # subdirectories: not hidden, not symbolic links
    is_run: bool
    is_sentinel: bool = False  # holds a sentinel's history (sentinel.jsonl)


class _RunIndex:
    """The directories below a logdir as last listed, and which of them hold a dump.

    :meth:`scan` stats every known directory but lists again only those whose
    modification time changed (an entry added, removed or renamed in it), so a
    rescan of a large, quiet tree costs one ``stat`` per directory.
    """

    def __init__(self, logdir: Path, max_depth: int = MAX_DEPTH) -> None:
        self.logdir = logdir
        self.max_depth = max_depth
        self._dirs: dict[str, _Dir] = {}
        # The directories holding a sentinel's history, as of the last scan.
        self.sentinels: list[str] = []

    def _list(self, path: str, depth: int, mtime_ns: int) -> _Dir:
        children: list[str] = []
        is_run = is_sentinel = False
        try:
            with os.scandir(path) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    try:
                        if e.is_dir(follow_symlinks=False):
                            if depth < self.max_depth:
                                children.append(e.name)
                        elif not is_run and fnmatch.fnmatchcase(e.name, _METADATA_GLOB):
                            is_run = e.is_file()
                        elif e.name == HISTORY_FILE:
                            is_sentinel = e.is_file()
                    except OSError:
                        continue
        except OSError:  # unreadable or gone: nothing below it, as os.walk would
            pass
        return _Dir(mtime_ns, tuple(sorted(children)), is_run, is_sentinel)

    def scan(self) -> list[str]:
        """The runs, in walk order (each directory before the sorted ones below it)."""
        racy = time.time_ns() - _RACY_NS
        old, new = self._dirs, {}
        found: list[str] = []
        sentinels: list[str] = []
        stack: list[tuple[str, int]] = [(".", 0)]
        root = str(self.logdir)
        while stack:
            rel, depth = stack.pop()
            path = root if rel == "." else os.path.join(root, rel)
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                continue
            entry = old.get(rel)
            if entry is None or entry.mtime_ns != mtime or mtime >= racy:
                entry = self._list(path, depth, mtime)
            new[rel] = entry
            if entry.is_run:
                found.append(rel)
            if entry.is_sentinel:
                sentinels.append(rel)
            prefix = "" if rel == "." else rel + "/"
            stack.extend((prefix + c, depth + 1) for c in reversed(entry.children))
        self._dirs = new
        self.sentinels = sentinels
        return found


class SharedLock:
    """Many holders of the shared side at once, or one of the exclusive side.

    A thread waiting for the exclusive side goes before threads arriving for the
    shared side, so a refresh is not starved by a stream of readers. Not reentrant.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


_Signature = tuple[tuple[str, int, int, int], ...]


def _signatures(paths: tuple[Path, ...]) -> tuple[_Signature, ...] | None:
    """Each directory's :func:`_signature`; ``None`` when one of them is ``None``."""
    out = []
    for path in paths:
        signature = _signature(path)
        if signature is None:
            return None
        out.append(signature)
    return tuple(out)


def _signature(path: Path) -> _Signature | None:
    """What changes when a dump's files do (names, sizes, times, inodes); ``None`` when
    the directory cannot be listed or something in it changed too recently to trust times."""
    racy = time.time_ns() - _RACY_NS
    out = []
    try:
        with os.scandir(path) as it:
            for e in it:
                st = e.stat()
                if st.st_mtime_ns >= racy:
                    return None
                out.append((e.name, st.st_size, st.st_mtime_ns, st.st_ino))
    except OSError:
        return None
    return tuple(sorted(out))


class Run:
    """One dump: its reader (opened on first use), shared by the server's threads."""

    def __init__(self, name: str, path: Path, refresh_interval: float) -> None:
        self.name = name
        # Replaced, never changed in place (add_path): _catch_up takes it without a lock.
        self.paths: tuple[Path, ...] = (path,)
        self.refresh_interval = refresh_interval
        # Decoding only reads the reader's state; update() changes it. See reading().
        self._rw = SharedLock()
        self._refreshing = threading.Lock()  # one thread catches up at a time
        self._reader: DumpReader | None = None
        self._signature: tuple[_Signature, ...] | None = None
        self.error: str | None = None
        self._last_refresh = 0.0
        self._cache: dict[Any, Any] = {}
        # cached(bounded=True): at most MAX_BOUNDED values, least recently used first.
        self._bounded: OrderedDict[Any, Any] = OrderedDict()
        self._bounded_lock = threading.Lock()
        self._cache_key: tuple[int, int, int] | None = None
        self._key_locks: dict[Any, threading.Lock] = {}
        self._key_locks_lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The run's first directory (the only one unless several logdirs are served)."""
        return self.paths[0]

    def add_path(self, path: Path) -> None:
        """Another directory of this run (found under another logdir): read from the next
        catch-up on."""
        if path not in self.paths:
            self.paths = (*self.paths, path)

    @contextlib.contextmanager
    def reading(self) -> Iterator[DumpReader]:
        """The open reader, caught up with the files at most every ``refresh_interval`` s,
        for the duration of the ``with`` block (many threads at once).

        Raises ``DumpNotFoundError`` when the dump cannot be opened. Do not nest.
        """
        self._catch_up()
        with self._rw.shared():
            if self._reader is None:  # another thread's attempt to open it failed
                raise files.DumpNotFoundError(self.error or f"{self.path}: no dump")
            yield self._reader

    def _catch_up(self) -> None:
        if (
            self._reader is not None
            and time.monotonic() - self._last_refresh < self.refresh_interval
        ):
            return
        # While one thread catches up, the others read what there is (once it is open).
        if not self._refreshing.acquire(blocking=self._reader is None):
            return
        try:
            now = time.monotonic()
            paths = self.paths
            if self._reader is None:
                signature = _signatures(paths)
                with self._rw.exclusive():
                    try:
                        self._reader = DumpReader(paths)
                    except files.DumpNotFoundError as exc:
                        self.error = str(exc)
                        raise
                    self.error = None
                    self._changed(self._reader)
                self._signature, self._last_refresh = signature, now
            elif now - self._last_refresh >= self.refresh_interval:
                self._last_refresh = now
                # Taken before update(), so that what is written meanwhile is read next time.
                signature = _signatures(paths)
                if signature is None or signature != self._signature:
                    with self._rw.exclusive():
                        self._add_paths(self._reader, paths)
                        self._reader.update()
                        self._changed(self._reader)
                    self._signature = signature
        finally:
            self._refreshing.release()

    @staticmethod
    def _add_paths(reader: DumpReader, paths: tuple[Path, ...]) -> None:
        """Directories added to the run since its reader was opened (exclusive side held)."""
        for path in paths:
            # Emptied or gone since it was found: try again at the next catch-up.
            with contextlib.suppress(files.DumpNotFoundError):
                reader.add_logdir(path)

    def _changed(self, r: DumpReader) -> None:
        """After the reader read more (exclusive side held): drop stale caches, warm lazy state."""
        key = (r.generation, r.num_executions(), r.num_graph_execution_traces())
        if key != self._cache_key:
            self._cache.clear()
            self._bounded.clear()
            self._key_locks.clear()  # nobody computes while the exclusive side is held
            self._cache_key = key
            # Op types of traces are resolved lazily and interned into the reader's string
            # table; resolved here, later calls under the shared side only read them.
            if r.num(TRACES):
                r.trace_op_types()

    def cached(self, key: Any, compute: Callable[[], T], *, bounded: bool = False) -> T:
        """``compute()``, remembered until the dump changes; computed once when many ask at
        once. Call inside :meth:`reading`.

        ``bounded``: for keys a client chooses freely (a filter): only the last
        :data:`MAX_BOUNDED` of them are remembered, the least recently used dropped first.
        """
        found, value = self._lookup(key, bounded)
        if found:
            hit: T = value
            return hit
        with self._key_locks_lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        try:
            with lock:
                found, value = self._lookup(key, bounded)
                if not found:
                    value = compute()
                    self._store(key, value, bounded)
                result: T = value
                return result
        finally:
            # A key's lock lives while its value is computed, not after: else every key
            # ever asked for (each filter) would keep one.
            with self._key_locks_lock:
                if self._key_locks.get(key) is lock:
                    del self._key_locks[key]

    def _lookup(self, key: Any, bounded: bool) -> tuple[bool, Any]:
        if not bounded:
            try:
                return True, self._cache[key]
            except KeyError:
                return False, None
        with self._bounded_lock:
            try:
                self._bounded.move_to_end(key)
            except KeyError:
                return False, None
            return True, self._bounded[key]

    def _store(self, key: Any, value: Any, bounded: bool) -> None:
        if not bounded:
            self._cache[key] = value
            return
        with self._bounded_lock:
            self._bounded[key] = value
            self._bounded.move_to_end(key)
            while len(self._bounded) > MAX_BOUNDED:
                self._bounded.popitem(last=False)

    def cache_size(self) -> int:
        """Values remembered, and keys being computed (for tests and diagnostics)."""
        with self._bounded_lock, self._key_locks_lock:
            return len(self._cache) + len(self._bounded) + len(self._key_locks)

    def close(self) -> None:
        with self._rw.exclusive():
            if self._reader is not None:
                self._reader.close()
                self._reader = None


class RunSet:
    """Every run under a logdir, or under several logdirs (runs of one run id merged, see
    the module's docstring); new runs are found at most ``refresh_interval`` s late.

    The index is refreshed by :meth:`watch`'s thread when one runs (the server starts
    it), else by the request that finds it due (others do not wait for it);
    ``refresh_interval=0`` refreshes it on every call. :attr:`logdirs` holds every
    logdir (resolved), :attr:`logdir` the first.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        refresh_interval: float = 1.0,
    ) -> None:
        given = [logdir] if isinstance(logdir, (str, os.PathLike)) else list(logdir)
        if not given:
            raise files.DumpNotFoundError("no logdir given; pass the logdir your program writes to")
        self.logdirs: list[Path] = []
        for g in given:
            root = Path(g).resolve()
            if not root.is_dir():
                what = "no such directory" if not root.exists() else "not a directory"
                raise files.DumpNotFoundError(
                    f"{g}: {what}; pass the logdir your program writes its dump to"
                )
            if root not in self.logdirs:
                self.logdirs.append(root)
        self.logdir = self.logdirs[0]
        self.refresh_interval = refresh_interval
        self._indexes = [_RunIndex(root) for root in self.logdirs]
        # Replaced, never changed in place: readers take it without a lock.
        self._runs: dict[str, Run] = {}
        # Several logdirs only: the directories placed in a run, and each run id's run.
        self._placed: set[tuple[int, str]] = set()
        self._by_run_id: dict[str, str] = {}
        self._scan_lock = threading.Lock()
        self._last_scan = -float("inf")
        self.last_scan_s = 0.0
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self.refresh()

    def refresh(self, wait: bool = True) -> None:
        """Look for new runs now (with ``wait`` false: unless another thread is looking)."""
        if not self._scan_lock.acquire(blocking=wait):
            return
        try:
            started = time.monotonic()
            if len(self._indexes) == 1:
                names = self._indexes[0].scan()
                runs = self._runs
                new = [n for n in names if n not in runs]
                if new:
                    self._runs = {
                        **runs,
                        **{n: Run(n, self.logdir / n, self.refresh_interval) for n in new},
                    }
            else:
                self._merge_scan()
            self._last_scan = time.monotonic()
            self.last_scan_s = self._last_scan - started
        finally:
            self._scan_lock.release()

    def _merge_scan(self) -> None:
        """Several logdirs: place each new run directory in the run of its run id (scan lock
        held)."""
        runs = dict(self._runs)
        for i, index in enumerate(self._indexes):
            for rel in index.scan():
                if (i, rel) in self._placed:
                    continue
                path = self.logdirs[i] / rel
                run_id = read_run_id(path)
                if run_id is None and _written_lately(path):
                    continue  # its metadata record is being written: place it next time
                self._placed.add((i, rel))
                # No run id (TensorFlow before 2.3, or damaged metadata): a run of its own.
                key = run_id or f"{i}:{rel}"
                name = self._by_run_id.get(key)
                if name is None:
                    name = self._by_run_id[key] = _free_name(rel, i, runs)
                    runs[name] = Run(name, path, self.refresh_interval)
                else:
                    runs[name].add_path(path)
        if len(runs) != len(self._runs):
            self._runs = runs

    def watch(self) -> None:
        """Keep the index fresh from a daemon thread (stopped by :meth:`close`)."""
        if self._watcher is not None:
            return

        def loop() -> None:
            # A large logdir is walked less often, so that walking it stays a small load.
            while not self._stop.wait(max(self.refresh_interval, self.last_scan_s / _WATCH_DUTY)):
                with contextlib.suppress(Exception):  # keep watching; the next walk may succeed
                    self.refresh()

        self._watcher = threading.Thread(target=loop, daemon=True, name="nanscope-runs")
        self._watcher.start()

    def _maybe_refresh(self) -> None:
        if self._watcher is not None:
            return
        if self.refresh_interval <= 0:
            self.refresh()
        elif time.monotonic() - self._last_scan >= self.refresh_interval:
            self.refresh(wait=False)

    def names(self) -> list[str]:
        self._maybe_refresh()
        return list(self._runs)

    def sentinels(self) -> dict[str, Path]:
        """The directories holding a sentinel's history, by name: the path under its logdir
        (``"."`` for the logdir itself; ``@<n>`` added, as for runs, when an earlier logdir
        has a history of that name), in walk order."""
        self._maybe_refresh()
        out: dict[str, Path] = {}
        for i, index in enumerate(self._indexes):
            for rel in list(index.sentinels):
                name = rel if i == 0 or rel not in out else f"{rel}@{i + 1}"
                out.setdefault(name, self.logdirs[i] / rel if rel != "." else self.logdirs[i])
        return out

    def get(self, name: str | None) -> Run:
        """The run called ``name``; ``None`` means the only run."""
        self._maybe_refresh()
        runs = self._runs
        if name is None or name == "":
            if len(runs) == 1:
                return next(iter(runs.values()))
            if not runs:
                raise RunNotFound(f"no dump under {', '.join(map(str, self.logdirs))} yet")
            raise RunNotFound(
                f"{len(runs)} runs under the logdir; name one with run= "
                f"({', '.join(list(runs)[:5])})"
            )
        run = runs.get(name)
        if run is None:
            raise RunNotFound(f"no run {name!r} under the logdir; /api/runs lists them")
        return run

    def preload(self) -> None:
        """Open every run's reader now (so the first page shows without waiting)."""
        for run in list(self._runs.values()):
            try:
                with run.reading():
                    pass
            except (files.DumpNotFoundError, OSError) as exc:
                run.error = str(exc)

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None
        for run in list(self._runs.values()):
            run.close()


def _free_name(rel: str, root: int, runs: dict[str, Run]) -> str:
    """``rel``, or when another run has that name, ``rel@<n>`` (``n``: the logdir's place)."""
    name, n = rel, 1
    while name in runs:
        name = f"{rel}@{root + 1}" + (f"-{n}" if n > 1 else "")
        n += 1
    return name


def _written_lately(path: Path) -> bool:
    """Whether a ``.metadata`` file in ``path`` changed too recently to call it unreadable."""
    racy = time.time_ns() - _RACY_NS
    try:
        return any(p.stat().st_mtime_ns >= racy for p in path.glob(_METADATA_GLOB))
    except OSError:
        return False
