"""Incremental reading of the append-only files (metadata, source files, stack frames, graphs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from nanscope.format import files
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import RecordError, scan
from nanscope.reader._data import Problem
from nanscope.reader._decode import DecodeError, parse_event
from nanscope.reader._handles import NotARegularFile, open_fd, out_of_descriptors, shed

__all__ = [
    "NotARegularFile",
    "RecordLog",
    "describe",
    "open_regular",
    "read_run_id",
    "record_problem",
    "unreadable",
]


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file (following symlinks).

    See :func:`._handles.open_fd`; raises ``OSError`` (``NotARegularFile`` for a FIFO,
    device or directory). When the process has no descriptor left, the event files'
    cached handles give half of theirs back and the open is tried once more.
    """
    try:
        fd = open_fd(path)
    except OSError as exc:
        if not out_of_descriptors(exc) or not shed():
            raise
        fd = open_fd(path)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def unreadable(path: Path, exc: OSError, events: bool = False) -> Problem:
    """The problem to report for a dump file that cannot be opened or read (``events``: an
    event file, whose events are then missing: the problem says the history is incomplete)."""
    why = str(exc) if isinstance(exc, NotARegularFile) else f"{path}: {exc.strerror or exc}"
    return Problem("error", f"{why}; its events are not shown", incomplete=events, file=str(path))


def record_problem(err: RecordError, incomplete: bool) -> Problem:
    """The problem to report for a damaged record (``incomplete``: of an event file)."""
    return Problem("error", describe(err), incomplete=incomplete, file=err.path, offset=err.offset)


class RecordLog:
    """Yields the events appended to one file since the previous call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.torn_at: int | None = None
        self._identity: tuple[int, int] | None = None

    def new_events(self, problems: list[Problem]) -> Iterator[tuple[int, pb.DebugEvent]]:
        """``(offset, event)`` for each complete record after the last one read."""
        try:
            with open_regular(self.path) as fh:
                st = os.fstat(fh.fileno())
                identity = (st.st_ino, st.st_dev)
                if self._identity is not None and (
                    identity != self._identity or st.st_size < self.offset
                ):
                    problems.append(
                        Problem(
                            "warning",
                            f"{self.path}: file was replaced or truncated while being read",
                            file=str(self.path),
                        )
                    )
                    self.offset = 0
                self._identity = identity
                if st.st_size <= self.offset:
                    return
                fh.seek(self.offset)
                blob = fh.read()
        except FileNotFoundError:
            return
        except OSError as exc:  # a directory, FIFO, device, dangling or looping link, no access
            problems.append(unreadable(self.path, exc))
            return
        result = scan(blob, str(self.path), base=self.offset)
        for err in result.errors:
            problems.append(record_problem(err, incomplete=False))
        self.torn_at = result.end if result.torn else None
        self.offset = result.end
        for rec in result.records:
            try:
                yield rec.offset, parse_event(rec.payload)
            except DecodeError as exc:
                problems.append(
                    Problem(
                        "error",
                        f"{self.path}: record at byte offset {rec.offset}: {exc}; skipped",
                        file=str(self.path),
                        offset=rec.offset,
                    )
                )

    def read_event(self, offset: int) -> pb.DebugEvent:
        with open_regular(self.path) as fh:
            fh.seek(offset)
            header = fh.read(8)
            length = int.from_bytes(header, "little")
            fh.seek(offset)
            # The length is the file's word (changed since it was indexed, it may say 2**63):
            # read no more than the file holds, for read(n) allocates n bytes first.
            available = max(0, os.fstat(fh.fileno()).st_size - offset)
            blob = fh.read(min(length + 16, available))
        result = scan(blob, str(self.path), base=offset, limit=1, resync_limit=0)
        if not result.records:
            if result.errors:
                raise result.errors[0]
            raise RecordError(str(self.path), offset, "no complete record at this offset")
        return parse_event(result.records[0].payload)


def describe(err: RecordError) -> str:
    return f"{err.path}: corrupt record at byte offset {err.offset}: {err.reason}"


def read_run_id(dump_dir: str | os.PathLike[str]) -> str | None:
    """The run id (``tfdbg_run_id``) that the first file set in ``dump_dir`` (by name) records.

    Cheap: one small ``.metadata`` file is read, not the dump. ``None`` when there is no
    file set or its metadata record cannot be read (yet); ``""`` when the record has no
    run id (TensorFlow before 2.3).
    """
    for path in sorted(Path(dump_dir).glob(f"{files.PREFIX}.*.{files.METADATA}")):
        for _, event in RecordLog(path).new_events([]):
            if event.WhichOneof("what") == "debug_metadata":
                return event.debug_metadata.tfdbg_run_id
        return None
    return None
