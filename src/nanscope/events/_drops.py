"""What a writer could not write: its counters, and the ``.nsdrops`` report made of them.

The report (docs/FORMAT.md) is JSON padded to :data:`DROPS_SIZE` bytes, rewritten in
place whenever the counters move and once more at close; reader/_drops.py reads it.
:func:`drops_line` is the one line on stderr at the end of a run that lost events.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class WriterStats:
    """Counters of a writer, for tests, benchmarks and the end-of-run message."""

    executions: int = 0
    traces: int = 0
    executions_kept: int = 0
    traces_kept: int = 0
    executions_evicted: int = 0  # events the circular buffers let go of
    traces_evicted: int = 0
    errors: int = 0
    waits: int = 0  # times a producer waited for the writer (backpressure)
    max_backlog: int = 0  # most events ever waiting for the background thread
    max_backlog_bytes: int = 0  # most bytes ever waiting for it (seen when a producer waits)
    io_errors: int = 0  # disk operations that failed (each retry counts)
    executions_dropped: int = 0  # events lost: shed by producers, let go of while the disk
    traces_dropped: int = 0  # took nothing, or not written at close
    records_dropped: int = 0  # stack frames, source files, graphs that did not fit while held
    executions_shed: int = 0  # of the dropped: shed by producers (the writer fell behind)
    traces_shed: int = 0
    nonfinite_dropped: int = 0  # of the dropped: events that held Inf/NaN
    values_omitted: int = 0  # FULL_TENSOR values written without their elements (too large)

    @property
    def dropped(self) -> int:
        """Events (executions and traces) that did not reach the dump."""
        return self.executions_dropped + self.traces_dropped


DROPS_SIZE = 4096
"""Bytes reserved for the ``.nsdrops`` report when the writer starts: rewriting
reserved blocks needs no free space, so the report reaches even a full disk."""


def reported(stats: WriterStats) -> tuple[int, ...]:
    """The counters a report is made from: when they move, the report is out of date."""
    return (stats.dropped, stats.records_dropped, stats.nonfinite_dropped, stats.io_errors)


def drops_report(
    stats: WriterStats,
    faults: list[dict[str, Any]],
    last_write: float,
    closed: bool,
    issued: tuple[int, int] = (0, 0),
) -> bytes:
    """The ``.nsdrops`` JSON, padded to :data:`DROPS_SIZE` bytes: the counters, the disk's
    outages (``faults``: reason, error, since, until), when a write last succeeded, whether
    it is the final report (``closed``), and how many executions and traces were numbered
    (``issued``): with the final report, a reader counts events lost after the last one it
    holds, which no gap between two held events shows."""
    st = stats
    report: dict[str, Any] = {
        "dropped": st.dropped,
        "executions": st.executions_dropped,
        "traces": st.traces_dropped,
        "records": st.records_dropped,
        "io_errors": st.io_errors,
        "last_write": last_write,
        "nonfinite_dropped": st.nonfinite_dropped,
        "shed": {"executions": st.executions_shed, "traces": st.traces_shed},
        "closed": closed,
        "issued": {"executions": issued[0], "traces": issued[1]},
        # Last: the one part of unbounded length, cut short if the report would not fit.
        "faults": faults,
    }
    data = json.dumps(report).encode()
    if len(data) > DROPS_SIZE - 1:
        report["faults"] = [*faults[:3], *faults[-1:]]
        data = json.dumps(report).encode()[: DROPS_SIZE - 1]
    return data + b" " * (DROPS_SIZE - 1 - len(data)) + b"\n"


def drops_line(
    stats: WriterStats, faults: list[dict[str, Any]], logdir: Path, last_write: float
) -> str:
    """One line on what did not reach the dump: ``N events dropped: disk full at 12:03:14``."""
    if faults:
        first = faults[0]
        why = f"{first['reason']} at {clock(first['since'])}"
        if len(faults) > 1:
            why += f" (and {len(faults) - 1} later outages)"
    else:
        why = "the writer fell behind"
    if not stats.dropped:
        return f"writing failed ({why}), but no event was lost: the dump in {logdir} is whole"
    return (
        f"{stats.dropped} events dropped: {why}; the dump in {logdir} holds what was "
        f"written until {clock(last_write)}"
    )


def clock(wall: float) -> str:
    """A wall time as the time of day, as the messages on stderr give it."""
    return time.strftime("%H:%M:%S", time.localtime(wall))
