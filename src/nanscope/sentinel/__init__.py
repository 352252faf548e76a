"""The sentinel: a check once per training step that costs almost nothing, and a replay
of the step that went bad with everything recorded (docs/SENTINEL.md).

Importing this package imports no framework; the PyTorch and JAX parts load theirs
when used.
"""

from __future__ import annotations

from nanscope.sentinel._history import (
    HISTORY_FILE,
    Cause,
    Header,
    HistoryWriter,
    SentinelHistory,
    SentinelHistoryError,
    StepRecord,
    Trip,
    is_sentinel_logdir,
    read_history,
)

__all__ = [
    "HISTORY_FILE",
    "Cause",
    "Header",
    "HistoryWriter",
    "SentinelHistory",
    "SentinelHistoryError",
    "StepRecord",
    "Trip",
    "is_sentinel_logdir",
    "read_history",
]
