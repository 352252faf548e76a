"""The sentinel: a check once per training step that costs almost nothing, and a replay
of the step that went bad with everything recorded (docs/SENTINEL.md).

Importing this package imports no framework; the PyTorch and JAX parts load theirs
when used: ``Sentinel`` imports torch and ``JaxSentinel`` JAX when first named.

    s = Sentinel(logdir, model=model, optimizer=optimizer)   # on_nan="stop" or "skip"
    for batch in loader:
        loss = s.step(train_step, batch)   # train_step(batch): zero_grad, forward, backward, step
    s.close()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nanscope.sentinel._active import active, start, step, stop
from nanscope.sentinel._errors import SentinelTripped
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

if TYPE_CHECKING:
    from nanscope.sentinel._jax import JaxSentinel
    from nanscope.sentinel._torch import Sentinel

__all__ = [
    "HISTORY_FILE",
    "Cause",
    "Header",
    "HistoryWriter",
    "JaxSentinel",
    "Sentinel",
    "SentinelHistory",
    "SentinelHistoryError",
    "SentinelTripped",
    "StepRecord",
    "Trip",
    "active",
    "is_sentinel_logdir",
    "read_history",
    "start",
    "step",
    "stop",
]


def __getattr__(name: str) -> Any:
    # Each framework's sentinel imports its framework: only when it is asked for.
    if name == "Sentinel":
        from nanscope.sentinel._torch import Sentinel

        return Sentinel
    if name == "JaxSentinel":
        from nanscope.sentinel._jax import JaxSentinel

        return JaxSentinel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazily loaded names are part of the package's surface too.
    return sorted({n for n in globals() if n.startswith("_")} | set(__all__))
