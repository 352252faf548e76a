"""The timeline: each event's health as a status code, and the codes of a range in buckets."""

from __future__ import annotations

from typing import Any

import numpy as np

from nanscope.reader import DumpReader
from nanscope.server.provider.rows import Selection
from nanscope.server.runs import Run

# Status codes, ordered so that a bucket's largest is its worst event.
UNKNOWN, FINITE, INF, NAN = 0, 1, 2, 3


def status_codes(run: Run, reader: DumpReader, kind: str) -> np.ndarray:
    """Per event of ``kind``: :data:`UNKNOWN` (the mode does not tell), :data:`FINITE`,
    :data:`INF` (Inf but no NaN) or :data:`NAN` (remembered until the dump changes)."""

    def compute() -> np.ndarray:
        rows = reader.index(kind)
        flag = rows["nonfinite"]
        only_inf = (rows["nan"] == 0) & ((rows["neg_inf"] > 0) | (rows["pos_inf"] > 0))
        status = np.where(
            flag == 1, np.where(only_inf, INF, NAN), np.where(flag == 0, FINITE, UNKNOWN)
        )
        return status.astype(np.int8)

    return run.cached(("status", kind), compute)


def buckets(
    run: Run, reader: DumpReader, chosen: Selection, begin: int, end: int, wanted: int
) -> dict[str, Any]:
    """``/api/timeline``: the selected events at positions ``begin`` to ``end`` in at most
    ``wanted`` buckets of equal width, each with its worst status, its count of events
    holding Inf/NaN, and its first event's step and index."""
    total = chosen.total
    n = end - begin
    count = min(wanted, n)
    if count == 0:
        return {
            "begin": begin,
            "end": end,
            "total": total,
            "bucket_size": 0.0,
            "status": [],
            "nonfinite": [],
            "steps": [],
            "first_index": [],
        }
    idx = chosen.events(begin, end)
    status = status_codes(run, reader, chosen.kind)[idx]
    width = n / count
    starts = np.floor(np.arange(count) * width).astype(np.int64)
    steps = reader.index(chosen.kind)["step"]
    return {
        "begin": begin,
        "end": end,
        "total": total,
        "bucket_size": width,
        "status": np.maximum.reduceat(status, starts).tolist(),
        "nonfinite": np.add.reduceat((status >= INF).astype(np.int64), starts).tolist(),
        # None for dumps that record no steps (TensorFlow's), not a row of zeros.
        "steps": steps[idx[starts]].tolist() if reader.steps_known else None,
        "first_index": idx[starts].tolist(),
    }
