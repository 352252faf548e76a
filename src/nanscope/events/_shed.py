"""What producers keep while the writer has fallen behind (docs/RELIABILITY.md, section 2).

A producer faster than the writer's thread waits for it at most
``backpressure_timeout`` seconds; then it *sheds* events until the writer has
caught up. Shedding must never cost the events that the windows rule
(docs/FORMAT.md, "Circular buffers") promises, or a run whose first NaN came
while the writer was busy (writing a huge FULL_TENSOR record, say) would read
as a run without Inf/NaN. So, of one kind of event (executions, or traces), a
:class:`Shedder` keeps:

- every *anchor*: the first event holding Inf/NaN of each new (key, has NaN)
  pair (the key is an execution's op type, a trace's graph and op name; up to
  :data:`MAX_SHED_ANCHORS` pairs), and the first event with NaN in any case;
- the ``window`` events after each anchor, and the ``window`` events before it:
  the shed events are not let go of at once but wait in a small ring (at most
  ``window`` events, and a bound in bytes) until an anchor claims them or newer
  ones push them out;
- every other event holding Inf/NaN while the backlog leaves room (below twice
  the queue's bounds), so that memory stays bounded in a run full of NaN; and,
  as long as there is room, every event whose summaries are still on a device
  (fetching them on the producer's thread could wait for that very thread):
  past it, those are let go of and counted as events that may have held Inf/NaN.

Keys are finer than, or equal to, the anchor rule's (a trace's op type is
known only on the writer's thread), and the writer's streams apply the rule
again: keeping more here only keeps more candidates. Everything else is let go
of and counted (:attr:`Shedder.shed`, :attr:`Shedder.nonfinite_shed`). A
:class:`Shedder` is used under the writer's sequence lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nanscope.events._streams import MAX_ANCHORS

MAX_SHED_ANCHORS = 8 * MAX_ANCHORS
"""(key, has NaN) pairs whose first Inf/NaN producers keep while shedding, at most
(the first NaN is kept even past it). More than the streams' bound: a trace's key
(graph, op name) is finer than its op type, and the pairs that anchored before the
shedding began are not known here."""


@dataclass
class Piece:
    """Consecutive shed events, as one queue item ready to be enqueued after all."""

    item: Any
    events: int
    nonfinite: int  # how many of them hold Inf/NaN
    nbytes: int


class Shedder:
    """The shedding state of one kind of event (see the module's docstring)."""

    def __init__(self, window: int) -> None:
        self.window = max(0, window)
        self.after = 0  # events still to keep after the last anchor
        self.shed = 0  # events let go of
        self.nonfinite_shed = 0  # how many of them held Inf/NaN
        self._keys: set[tuple[Hashable, bool]] = set()
        self._nan_seen = False
        self._ring: deque[Piece] = deque()
        self._ring_events = 0
        self._ring_bytes = 0

    def _new_anchor(self, key: tuple[Hashable, bool]) -> bool:
        if key in self._keys:
            return False
        has_nan = key[1]
        if len(self._keys) >= MAX_SHED_ANCHORS and (self._nan_seen or not has_nan):
            return False
        self._keys.add(key)
        self._nan_seen |= has_nan
        return True

    def plan(
        self, n: int, bad: np.ndarray, nan: Sequence[bool], keys: Sequence[Hashable], room: bool
    ) -> tuple[np.ndarray, int]:
        """Which of ``n`` consecutive events to keep, and how many shed events before
        them an anchor's window wants back from the ring.

        ``bad``: the positions of those holding Inf/NaN, in order; ``nan`` and
        ``keys``: theirs. ``room``: whether the backlog leaves room for the
        non-finite events that are not anchors.
        """
        keep = np.zeros(n, dtype=bool)
        carried = min(self.after, n)
        keep[:carried] = True
        after = self.after - carried
        need = 0
        window = self.window
        for j, key, has_nan in zip(bad.tolist(), keys, nan, strict=True):
            if self._new_anchor((key, bool(has_nan))):
                need = max(need, window - j)
                keep[max(0, j - window) : j + window + 1] = True
                after = max(after, j + window + 1 - n)
        if room and len(bad):
            keep[bad] = True
        self.after = after
        return keep, need

    def hold(self, piece: Piece, limit_bytes: int) -> None:
        """Put shed events in the ring; those pushed out (beyond the newest ``window``
        events, or ``limit_bytes``) are let go of."""
        ring = self._ring
        ring.append(piece)
        self._ring_events += piece.events
        self._ring_bytes += piece.nbytes
        while ring and (
            self._ring_events - ring[0].events >= self.window or self._ring_bytes > limit_bytes
        ):
            self._let_go(ring.popleft())

    def release(self, need: int) -> list[Piece]:
        """The ring's newest pieces holding at least ``need`` events (to enqueue, in
        order, before the events kept now); the older ones are let go of."""
        ring = self._ring
        out: list[Piece] = []
        got = 0
        while ring and got < need:
            piece = ring.pop()
            out.append(piece)
            got += piece.events
        while ring:
            self._let_go(ring.popleft())
        self._ring_events = self._ring_bytes = 0
        out.reverse()
        return out

    def take_all(self) -> list[Piece]:
        """Everything in the ring, in order (the writer caught up, or is closing)."""
        out = list(self._ring)
        self._ring.clear()
        self._ring_events = self._ring_bytes = 0
        return out

    def _let_go(self, piece: Piece) -> None:
        self._ring_events -= piece.events
        self._ring_bytes -= piece.nbytes
        self.shed += piece.events
        self.nonfinite_shed += piece.nonfinite

    def drop(self, events: int, nonfinite: int) -> None:
        """Count events let go of without passing through the ring."""
        self.shed += events
        self.nonfinite_shed += nonfinite
