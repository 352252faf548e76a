"""The writer's drop report: the ``.nsdrops`` file next to a nanscope file set.

The writer rewrites it in place (it reserved its blocks at start, so the
report reaches even a full disk) when the disk fails, recovers, and at close;
see docs/FORMAT.md. TensorFlow's dumps have none.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from nanscope.format import files

MAX_BYTES = 64 * 1024  # the writer writes 4 KiB; anything much larger is not its report


@dataclass(frozen=True)
class WriterDrops:
    """What one process's writer could not put into the dump."""

    dropped: int  # events (executions and traces) that did not reach the dump
    executions: int
    traces: int
    records: int  # stack frames, source files, graphs
    io_errors: int
    last_write: float  # wall time of the writer's last successful write
    faults: tuple[dict[str, Any], ...]  # each outage: reason, error, since, until (None: never)
    # Events holding Inf/NaN among ``dropped`` (None: a writer too old to count them, so any
    # drop may have been one).
    nonfinite_dropped: int | None = None
    # Events producers shed because the writer fell behind (part of ``dropped``), by kind.
    shed_executions: int = 0
    shed_traces: int = 0
    # True when the writer's close() wrote the report, False when the process never got
    # there (killed, still running), None when the writer predates the field.
    closed: bool | None = None
    # How many executions and traces the writer numbered, from its final report only (None:
    # not closed, or a writer predating the field): events lost after the last one held.
    issued_executions: int | None = None
    issued_traces: int | None = None

    @property
    def lost(self) -> bool:
        """Whether the writer failed to write anything (events, records or a write)."""
        return bool(self.dropped or self.records or self.faults)

    @property
    def nonfinite_lost(self) -> bool:
        """Whether an event holding Inf/NaN may be among the dropped ones."""
        if self.nonfinite_dropped is None:
            return self.dropped > 0
        return self.nonfinite_dropped > 0

    def summary(self) -> str:
        """``"1234 events dropped: disk full at 12:03:14"`` (or the fault alone)."""
        if self.faults:
            first = self.faults[0]
            why = f"{first.get('reason', 'write error')} at {_clock(first.get('since'))}"
            if first.get("until") is None:
                why += ", not recovered"
            if len(self.faults) > 1:
                why += f" (and {len(self.faults) - 1} later outages)"
        else:
            why = "the writer fell behind the program"
        head = f"{self.dropped} events dropped: " if self.dropped else "writing failed: "
        text = f"{head}{why}; the files hold what was written until {_clock(self.last_write)}"
        shed = self.shed_executions + self.shed_traces
        if shed:
            text += f" ({shed} shed because the writer fell behind)"
        if self.dropped and self.nonfinite_dropped == 0:
            text += "; every event holding Inf/NaN was kept"
        elif self.nonfinite_dropped:
            text += f"; {self.nonfinite_dropped} of them held Inf/NaN"
        return text


def read_drops(file_set: files.FileSet) -> WriterDrops | str | None:
    """The set's drop report: ``None`` when there is none, a message when the file is
    damaged. A report that lost nothing is returned too: it says whether the writer
    closed (:attr:`WriterDrops.closed`)."""
    path = file_set.path(files.DROPS)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return f"{path}: too large for a drop report ({MAX_BYTES} bytes at most); ignored"
    try:
        raw = json.loads(data.decode("utf-8"))
        faults = tuple(f for f in raw.get("faults", []) if isinstance(f, dict))
        shed = raw.get("shed") if isinstance(raw.get("shed"), dict) else {}
        drops = WriterDrops(
            dropped=int(raw.get("dropped", 0)),
            executions=int(raw.get("executions", 0)),
            traces=int(raw.get("traces", 0)),
            records=int(raw.get("records", 0)),
            io_errors=int(raw.get("io_errors", 0)),
            last_write=float(raw.get("last_write", 0.0)),
            faults=faults,
            nonfinite_dropped=_count(raw.get("nonfinite_dropped")),
            shed_executions=int(shed.get("executions", 0)),
            shed_traces=int(shed.get("traces", 0)),
            closed=closed if isinstance(closed := raw.get("closed"), bool) else None,
            issued_executions=_issued(raw, "executions"),
            issued_traces=_issued(raw, "traces"),
        )
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        return f"{path}: not a drop report (damaged JSON); ignored"
    return drops


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _clock(wall: object) -> str:
    if not isinstance(wall, (int, float)) or wall <= 0:
        return "an unknown time"
    try:
        return time.strftime("%H:%M:%S", time.localtime(wall))
    except (OverflowError, OSError, ValueError):
        return "an unknown time"


def _issued(raw: dict[str, Any], kind: str) -> int | None:
    """How many events of ``kind`` the writer numbered, from a final (closed) report only:
    while the writer runs, numbered events may still be on their way to the disk."""
    issued = raw.get("issued")
    if raw.get("closed") is not True or not isinstance(issued, dict):
        return None
    n = issued.get(kind)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None
