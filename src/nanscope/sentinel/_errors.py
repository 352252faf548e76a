"""What the sentinel raises when it stops training (any framework; imports none)."""

from __future__ import annotations

import os
from pathlib import Path

from nanscope.sentinel._history import Trip


class SentinelTripped(RuntimeError):
    """Training stopped: the sentinel saw Inf/NaN at a step (``on_nan="stop"``).

    :attr:`trip` says where, and what the replay found; the message is the replay's
    headline and the command that shows the whole story.
    """

    def __init__(self, trip: Trip, logdir: str | os.PathLike[str]) -> None:
        self.trip = trip
        self.logdir = Path(logdir)
        where = ", ".join(trip.where) or "the step"
        if trip.cause is not None:
            first = f"step {trip.step}: {trip.cause.headline}"
        else:
            first = f"step {trip.step}: Inf/NaN in {where}"
        if trip.reason:
            first += f" ({trip.reason})"
        super().__init__(f"nanscope sentinel: {first}; `nanscope report {self.logdir}`")


def error_words(exc: BaseException | None) -> str | None:
    """An exception ending the program, for the history's end record; ``None`` for none,
    for the sentinel's own stop, and for a plain ``sys.exit(0)``."""
    if exc is None or isinstance(exc, SentinelTripped):
        return None
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return None
    return f"{type(exc).__name__}: {exc}".rstrip(": ")
