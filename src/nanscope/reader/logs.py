"""Incremental reading of the append-only files (metadata, source files, stack frames, graphs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import RecordError, scan
from nanscope.reader.data import Problem
from nanscope.reader.decode import DecodeError, parse_event


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
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                identity = (st.st_ino, st.st_dev)
                if self._identity is not None and (
                    identity != self._identity or st.st_size < self.offset
                ):
                    problems.append(
                        Problem(
                            "warning",
                            f"{self.path}: file was replaced or truncated while being read",
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
        result = scan(blob, str(self.path), base=self.offset)
        for err in result.errors:
            problems.append(Problem("error", describe(err)))
        self.torn_at = result.end if result.torn else None
        self.offset = result.end
        for rec in result.records:
            try:
                yield rec.offset, parse_event(rec.payload)
            except DecodeError as exc:
                problems.append(
                    Problem(
                        "error", f"{self.path}: record at byte offset {rec.offset}: {exc}; skipped"
                    )
                )

    def read_event(self, offset: int) -> pb.DebugEvent:
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            header = fh.read(8)
            length = int.from_bytes(header, "little")
            fh.seek(offset)
            blob = fh.read(length + 16)
        result = scan(blob, str(self.path), base=offset, limit=1, resync_limit=0)
        if not result.records:
            if result.errors:
                raise result.errors[0]
            raise RecordError(str(self.path), offset, "no complete record at this offset")
        return parse_event(result.records[0].payload)


def describe(err: RecordError) -> str:
    return f"{err.path}: corrupt record at byte offset {err.offset}: {err.reason}"
