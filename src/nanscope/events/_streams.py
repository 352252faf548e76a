"""Where framed records go: append-only files, and the two circular files.

``.execution`` and ``.graph_execution_traces`` are written through an
:class:`EventStream`, which also maintains the sidecar index. With a positive
``capacity`` it keeps, like TensorFlow, only the most recent events, but it
never lets go of a few *anchors* and the ``window`` events on each side of
them: the first non-finite event of each (op type, has NaN) pair, up to
:data:`MAX_ANCHORS`, and the first event with NaN in any case. The origin users
are looking for is usually early, and a plain ring buffer would have evicted
it by the time training has filled with NaN; and the first Inf is often a
benign mask repeated every step, while the birth that matters (an overflow,
the first NaN) comes later, from another op.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.events._io import Append, Op, Replace, Sync
from nanscope.format import sidecar
from nanscope.format.files import INDEX_SUFFIX
from nanscope.format.records import frame
from nanscope.format.strings import StringTable

# Row tuples in the order of sidecar.ROW_DTYPE without offset and length:
# (name, graph, slot, wall_time, step, sequence, size, neg_inf, pos_inf, nan,
#  nonfinite, phase, device).
RowTuple = tuple[int, int, int, float, int, int, int, int, int, int, int, int, int]
_NAN = 9  # the position of the NaN count in a RowTuple
_NONFINITE = 12  # the position of the nonfinite flag in a full sidecar row

MAX_ANCHORS = 32
"""At most this many (op type, has NaN) pairs per circular stream get a window
kept around their first non-finite event; the first event with NaN gets one
even past the bound. Each window holds at most ``2 * window + 1`` events, so a
circular stream holds at most ``capacity + (MAX_ANCHORS + 1) * (2 * window + 1)``
events, however long the run."""


class AppendFile:
    """An append-only record file (metadata, source files, stack frames, graphs).

    Records wait in memory until :meth:`take` hands them over as one
    :class:`~nanscope.events._io.Append` for the disk thread; ``offset``
    counts every byte handed over, written yet or not (a failed append is
    retried from where it stopped, so offsets stay exact).
    """

    def __init__(self, path: Path, *, exclusive: bool = False) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_EXCL if exclusive else 0)
        self.fd = os.open(path, flags, 0o644)
        self.offset = os.lseek(self.fd, 0, os.SEEK_END)
        self._pending: list[bytes] = []
        self.pending_bytes = 0
        # While the disk takes nothing, at most this many bytes wait (0: no bound);
        # records past it are dropped and counted.
        self.limit = 0
        self.dropped = 0

    def write(self, payload: bytes) -> int:
        """Frame and append one payload; returns its record's offset (-1: dropped)."""
        return self.write_framed(frame(payload))

    def write_framed(self, records: bytes) -> int:
        """Append already framed records; returns the offset of the first (-1: dropped)."""
        if self.limit and self.pending_bytes + len(records) > self.limit:
            self.dropped += 1
            return -1
        offset = self.offset
        self._pending.append(records)
        self.pending_bytes += len(records)
        self.offset += len(records)
        return offset

    def take(self, sync: bool = False) -> list[Op]:
        """The operations that write what is pending (and ``fsync`` with ``sync``)."""
        ops: list[Op] = []
        if self._pending:
            ops.append(Append(self.fd, b"".join(self._pending)))
            self._pending.clear()
            self.pending_bytes = 0
        if sync:
            ops.append(Sync(self.fd))
        return ops

    def close(self) -> None:
        """Close the file descriptor (what was not taken is lost)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class _Batch:
    """Payloads of one graph call, kept together until written."""

    __slots__ = ("payloads",)

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads


class EventStream:
    """A circular (``capacity > 0``) or unbounded event file with its sidecar index.

    Events arrive as *specs* that ``encode`` turns into payload bytes. Encoding
    is deferred to flush time: in a circular buffer most events are evicted
    before any flush, and are then never encoded at all.

    ``op_kind(row)`` names the op type of a non-finite event for the anchor
    rule (see :data:`MAX_ANCHORS`); by default the row's ``name`` column,
    which is the op type of an execution.

    A circular stream holds, in order, *parts* and then ``_ring``: a part is a
    protected window (a list, never evicted) or an unprotected run that an
    anchor cut off from the ring (a deque). The unprotected runs and the ring
    share the ``capacity``, and the oldest of their events is evicted first,
    so the unprotected events kept are always the most recent ones.

    An unbounded stream becomes bounded in the same way while the disk takes
    nothing (:meth:`hold`): it keeps at most ``limit`` unprotected events and
    the anchors' windows, and counts the others in ``dropped``; what it kept is
    appended when the disk works again (the sequence numbers then show the gap).
    """

    def __init__(
        self,
        path: Path,
        capacity: int,
        window: int,
        encode: Callable[[Any], bytes],
        op_kind: Callable[[RowTuple], Hashable] | None = None,
    ) -> None:
        self.path = path
        self.kind = path.name.rsplit(".", 1)[-1]  # files.EXECUTION or GRAPH_EXECUTION_TRACES
        self.index_path = Path(str(path) + INDEX_SUFFIX)
        self.capacity = capacity
        self.window = max(0, window)
        self.encode = encode
        self.op_kind = op_kind
        self.strings = StringTable()
        self.dirty = False
        self.evicted = 0  # events the circular buffer let go of
        self.dropped = 0  # events an unbounded stream let go of while the disk took nothing
        self._pending_mark = self._written_mark = 0  # evicted + kept, at a rewrite (circular)
        self._bound = capacity if capacity > 0 else 0  # 0: unbounded (now)
        # Items are [spec or framed record (bytes), row], or (framed record, row)
        # for events framed before they were added: a tuple of bytes and numbers
        # that the garbage collector stops tracking, however long it waits here.
        self._ring: deque[list[Any]] = deque()
        self._parts: list[list[list[Any]] | deque[list[Any]]] = []
        # The unprotected runs that still hold events, oldest first.
        self._runs: deque[deque[list[Any]]] = deque()
        self._runs_len = 0  # events in them
        self._open: list[list[Any]] = []  # the window that takes the events after an anchor
        self._after_left = 0
        # The anchor rule's state: (op kind, has NaN) pairs anchored so far.
        self._anchors: set[tuple[Hashable, bool]] = set()
        self._nan_seen = False
        # False once no event can become an anchor: then non-finite events cost nothing more.
        self._anchoring = capacity > 0
        if capacity > 0:
            # Circular: the files are rewritten whole at each flush.
            for p in (self.path, self.index_path):
                p.touch()
        else:
            self._data = AppendFile(path)
            self._index = AppendFile(self.index_path)

    @property
    def circular(self) -> bool:
        return self.capacity > 0

    def hold(self, limit: int) -> None:
        """Bound an unbounded stream to ``limit`` events (and the anchors' windows)
        while the disk takes nothing; ``0`` lifts the bound. No-op when circular."""
        if self.circular or limit == self._bound:
            return
        self._bound = max(0, limit)
        if self._bound:
            self._anchoring = len(self._anchors) < MAX_ANCHORS or not self._nan_seen
            # What arrived before the disk was known to fail goes through the anchor
            # rule too: the first NaN may be among it.
            items = list(self._ring)
            self._ring.clear()
            for item in items:
                if type(item[0]) is _Batch:
                    for payload, full in zip(item[0].payloads, item[1].tolist(), strict=True):
                        row = tuple(full[2:])
                        self._place((frame(payload), row), row, full[_NONFINITE] == 1)
                else:
                    self._place(item, item[1], item[1][_NONFINITE - 2] == 1)

    def _drop_oldest(self) -> None:
        """Let go of the oldest unprotected event (evicted when circular, else dropped)."""
        if self._runs_len:
            run = self._runs[0]
            item = run.popleft()
            self._runs_len -= 1
            if not run:
                self._runs.popleft()
        else:
            item = self._ring.popleft()
        n = len(item[0].payloads) if type(item[0]) is _Batch else 1
        if self.circular:
            self.evicted += n
        else:
            self.dropped += n

    def add(self, spec: Any, row: RowTuple, nonfinite: bool) -> None:
        """Add one event: ``spec`` for ``encode``, or its framed record (bytes)."""
        self.dirty = True
        item: Any = (spec, row) if type(spec) is bytes else [spec, row]
        if not self._bound:
            self._ring.append(item)
            return
        self._place(item, row, nonfinite)

    def _place(self, item: Any, row: RowTuple, nonfinite: bool) -> None:
        """Add ``item`` to a bounded stream: anchor it, or the open window, or the ring."""
        if nonfinite and self._anchoring:
            # Inline up to the one set lookup: in a run full of NaN, every event comes here.
            op_kind = self.op_kind
            key = (row[0] if op_kind is None else op_kind(row), row[_NAN] > 0)
            if key not in self._anchors and self._new_anchor(key):
                self._anchor(item)
                return
        if self._after_left > 0:
            self._open.append(item)
            self._after_left -= 1
            return
        ring = self._ring
        ring.append(item)
        if len(ring) + self._runs_len > self._bound:
            self._drop_oldest()

    def _new_anchor(self, key: tuple[Hashable, bool]) -> bool:
        """Whether the first non-finite event of ``key`` (op kind, has NaN) gets a window."""
        anchors = self._anchors
        has_nan = key[1]
        if len(anchors) >= MAX_ANCHORS and (self._nan_seen or not has_nan):
            return False
        anchors.add(key)
        self._nan_seen |= has_nan
        if len(anchors) >= MAX_ANCHORS and self._nan_seen:
            self._anchoring = False
        return True

    def _anchor(self, item: Any) -> None:
        """Protect ``item``, up to ``window`` events before it and the ``window`` after it."""
        if self._after_left > 0:
            # Inside the previous anchor's window: the windows merge.
            self._open.append(item)
            self._after_left = self.window
            return
        ring = self._ring
        keep = min(self.window, len(ring))
        tail = [ring.pop() for _ in range(keep)]
        tail.reverse()
        if ring:
            # What stays unprotected before the window is evicted oldest first, as before.
            self._parts.append(ring)
            self._runs.append(ring)
            self._runs_len += len(ring)
            self._ring = deque()
        if self._parts and self._parts[-1] is self._open:
            # Nothing unprotected between this window and the previous one: one part.
            self._open.extend(tail)
            self._open.append(item)
        else:
            self._open = [*tail, item]
            self._parts.append(self._open)
        self._after_left = self.window

    def kept(self) -> int:
        """Events a circular stream holds now (0 for an unbounded one)."""
        if not self.circular:
            return 0
        return sum(map(len, self._parts)) + len(self._ring)

    def flush(self, sync: bool = False) -> list[Op]:
        """The disk operations that bring the files up to date (encoding what is not yet)."""
        if not self.dirty:
            return (
                self._data.take(sync) + self._index.take(sync) if sync and not self.circular else []
            )
        self.dirty = False
        if self.circular:
            return self._rewrite(sync)
        return self._append(sync)

    def add_batch(self, payloads: list[bytes], rows: np.ndarray) -> None:
        """Append many encoded events at once (unbounded streams only).

        ``rows`` are full sidecar rows whose ``offset`` and ``length`` are
        filled in when the batch is written.
        """
        assert not self.circular
        if self._bound:
            # Held back: event by event, so that the anchor rule sees each one.
            for payload, row in zip(payloads, rows.tolist(), strict=True):
                self.add(frame(payload), tuple(row[2:]), row[_NONFINITE] == 1)
            return
        self.dirty = True
        self._ring.append([_Batch(payloads), rows])

    def _records(self, items: list[list[Any]], start: int) -> tuple[bytes, np.ndarray]:
        """The framed records of ``items`` (encoding those not encoded yet) and their rows."""
        encode = self.encode
        records: list[bytes] = []
        chunks: list[np.ndarray] = []
        rows: list[tuple[Any, ...]] = []
        offset = start
        for item in items:
            record = item[0]
            if type(record) is _Batch:
                if rows:
                    chunks.append(np.array(rows, dtype=sidecar.ROW_DTYPE))
                    rows = []
                framed = [frame(p) for p in record.payloads]
                lengths = np.fromiter(map(len, framed), dtype=np.int64, count=len(framed))
                batch_rows = item[1]
                batch_rows["length"] = lengths
                batch_rows["offset"] = offset + np.concatenate(([0], np.cumsum(lengths)[:-1]))
                offset += int(lengths.sum())
                records.extend(framed)
                chunks.append(batch_rows)
                continue
            if not isinstance(record, bytes):
                record = item[0] = frame(encode(record))
            records.append(record)
            rows.append((offset, len(record), *item[1]))
            offset += len(record)
        if rows or not chunks:
            chunks.append(np.array(rows, dtype=sidecar.ROW_DTYPE))
        table = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        return b"".join(records), table

    def _append(self, sync: bool) -> list[Op]:
        items = [item for part in self._parts for item in part]
        items.extend(self._ring)
        if not items:
            return self._data.take(sync) + self._index.take(sync)
        # What a hold kept goes out in order; the windows need no protection any more.
        self._ring.clear()
        self._parts, self._runs, self._runs_len, self._open = [], deque(), 0, []
        self._after_left = 0
        data, rows = self._records(items, self._data.offset)
        self._data.write_framed(data)
        new = self.strings.take_new()
        if new:
            self._index.write(sidecar.strings_chunk(new))
        for chunk in sidecar.rows_chunks(rows):
            self._index.write(chunk)
        ops = self._data.take(sync)
        ops[0].events, ops[0].of = len(rows), self.kind
        # Data before index: a reader never finds a row whose record is not there yet
        # (the disk thread runs them in order and stops at the first failure).
        return ops + self._index.take(sync)

    def _rewrite(self, sync: bool) -> list[Op]:
        items = [item for part in self._parts for item in part]
        items.extend(self._ring)
        data, rows = self._records(items, 0)
        index = frame(sidecar.strings_chunk(self.strings.strings[1:])) + b"".join(
            frame(chunk) for chunk in sidecar.rows_chunks(rows)
        )
        self._pending_mark = self.evicted + len(items)
        return [Replace(self.path, data, sync), Replace(self.index_path, index, sync)]

    def drop_held(self) -> None:
        """Count what an unbounded stream holds in memory as dropped (the disk never
        took it), or, when circular and not written since it changed, all it keeps."""
        items = [i for part in self._parts for i in part]
        items.extend(self._ring)
        if self.circular:
            # Every event added was evicted or is kept: those past the mark of the
            # last rewrite that reached the disk, and still kept, are not in the file.
            kept = self.kept()
            self.dropped += min(kept, self.evicted + kept - self._written_mark)
        else:
            self.dropped += sum(len(i[0].payloads) if type(i[0]) is _Batch else 1 for i in items)
        self._parts, self._runs, self._runs_len, self._open = [], deque(), 0, []
        self._ring.clear()
        self.dirty = False

    def confirm(self) -> None:
        """The operations of the last :meth:`flush` reached the disk."""
        self._written_mark = self._pending_mark

    def close(self) -> None:
        """Close the file descriptors (after the last :meth:`flush`'s operations ran)."""
        if not self.circular:
            self._data.close()
            self._index.close()
