"""The runs under a logdir, each with its reader, kept up to date while programs still write.

A *run* is one directory holding a dump (its file sets: one per process or host).
``nanscope serve LOGDIR`` shows every run found under ``LOGDIR`` (the logdir itself
when it is a dump), and new ones as they appear.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nanscope.format import files
from nanscope.reader import DumpReader

T = TypeVar("T")

# How deep below the logdir runs are looked for (logdir/experiment/seed/run is depth 3).
MAX_DEPTH = 4
_METADATA_GLOB = f"{files.PREFIX}.*.{files.METADATA}"


class RunNotFound(LookupError):
    """No run of that name under the logdir."""


def find_runs(logdir: Path, max_depth: int = MAX_DEPTH) -> list[str]:
    """Names (paths relative to ``logdir``, ``"."`` for itself) of the directories holding a dump.

    Symbolic links to directories are not followed, so a run cannot lead the
    server outside the logdir, and hidden directories are skipped.
    """
    found: list[str] = []
    base_depth = len(logdir.parts)
    for dirpath, dirnames, _ in os.walk(logdir, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if len(here.parts) - base_depth >= max_depth:
            dirnames[:] = []
        if any(p.is_file() for p in here.glob(_METADATA_GLOB)):
            found.append(here.relative_to(logdir).as_posix() or ".")
    return found


class Run:
    """One dump: its reader (opened on first use), a lock, and caches tied to its contents."""

    def __init__(self, name: str, path: Path, refresh_interval: float) -> None:
        self.name = name
        self.path = path
        self.refresh_interval = refresh_interval
        # The reader is not thread-safe; the server's threads take turns.
        self.lock = threading.RLock()
        self._reader: DumpReader | None = None
        self.error: str | None = None
        self._last_refresh = 0.0
        self._cache: dict[Any, Any] = {}
        self._cache_key: tuple[int, int, int] | None = None

    def reader(self) -> DumpReader:
        """The open reader, caught up with the files at most every ``refresh_interval`` s.

        Call with :attr:`lock` held. Raises ``DumpNotFoundError`` when the dump
        cannot be opened.
        """
        now = time.monotonic()
        if self._reader is None:
            self._reader = DumpReader(self.path)
            self._last_refresh = now
            self.error = None
        elif now - self._last_refresh >= self.refresh_interval:
            self._reader.update()
            self._last_refresh = now
        r = self._reader
        key = (r.generation, r.num_executions(), r.num_graph_execution_traces())
        if key != self._cache_key:
            self._cache.clear()
            self._cache_key = key
        return r

    def cached(self, key: Any, compute: Callable[[], T]) -> T:
        """``compute()``, remembered until the dump changes. Call with :attr:`lock` held."""
        if key not in self._cache:
            self._cache[key] = compute()
        value: T = self._cache[key]
        return value

    def close(self) -> None:
        with self.lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


class RunSet:
    """Every run under a logdir; rediscovers new runs at most every ``refresh_interval`` s."""

    def __init__(self, logdir: str | os.PathLike[str], refresh_interval: float = 1.0) -> None:
        self.logdir = Path(logdir).resolve()
        if not self.logdir.is_dir():
            what = "no such directory" if not self.logdir.exists() else "not a directory"
            raise files.DumpNotFoundError(
                f"{logdir}: {what}; pass the logdir your program writes its dump to"
            )
        self.refresh_interval = refresh_interval
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()
        self._last_scan = -float("inf")

    def names(self) -> list[str]:
        self._scan()
        return list(self._runs)

    def _scan(self) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last_scan < self.refresh_interval:
                return
            self._last_scan = now
            for name in find_runs(self.logdir):
                if name not in self._runs:
                    self._runs[name] = Run(name, self.logdir / name, self.refresh_interval)

    def get(self, name: str | None) -> Run:
        """The run called ``name``; ``None`` means the only run."""
        self._scan()
        if name is None or name == "":
            if len(self._runs) == 1:
                return next(iter(self._runs.values()))
            if not self._runs:
                raise RunNotFound(f"no dump under {self.logdir} yet")
            raise RunNotFound(
                f"{len(self._runs)} runs under the logdir; name one with run= "
                f"({', '.join(list(self._runs)[:5])})"
            )
        run = self._runs.get(name)
        if run is None:
            raise RunNotFound(f"no run {name!r} under the logdir; /api/runs lists them")
        return run

    def preload(self) -> None:
        """Open every run's reader now (so the first page shows without waiting)."""
        for name in self.names():
            run = self._runs[name]
            with run.lock:
                try:
                    run.reader()
                except (files.DumpNotFoundError, OSError) as exc:
                    run.error = str(exc)

    def close(self) -> None:
        for run in list(self._runs.values()):
            run.close()
