"""Where framed records go: append-only files, and the two circular files.

``.execution`` and ``.graph_execution_traces`` are written through an
:class:`EventStream`, which also maintains the sidecar index. With a positive
``capacity`` it keeps, like TensorFlow, only the most recent events, but it
never lets go of the first non-finite event and the ``window`` events on each
side of it (the origin users are looking for is usually early, and a plain
ring buffer would have evicted it by the time training has filled with NaN).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from nanscope.format import sidecar
from nanscope.format.files import INDEX_SUFFIX
from nanscope.format.records import frame
from nanscope.format.strings import StringTable

# Row tuples in the order of sidecar.ROW_DTYPE without offset and length:
# (name, graph, slot, wall_time, step, sequence, size, neg_inf, pos_inf, nan,
#  nonfinite, phase, device).
RowTuple = tuple[int, int, int, float, int, int, int, int, int, int, int, int, int]


class AppendFile:
    """An append-only record file (metadata, source files, stack frames, graphs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: BinaryIO = open(path, "ab")  # noqa: SIM115 - owned for the writer's life
        self.offset = self._fh.tell()

    def write(self, payload: bytes) -> int:
        """Frame and append one payload; returns its record's offset."""
        return self.write_framed(frame(payload))

    def write_framed(self, records: bytes) -> int:
        """Append already framed records; returns the offset of the first."""
        offset = self.offset
        self._fh.write(records)
        self.offset += len(records)
        return offset

    def flush(self, sync: bool = False) -> None:
        self._fh.flush()
        if sync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()


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
    """

    def __init__(
        self, path: Path, capacity: int, window: int, encode: Callable[[Any], bytes]
    ) -> None:
        self.path = path
        self.index_path = Path(str(path) + INDEX_SUFFIX)
        self.capacity = capacity
        self.window = max(0, window)
        self.encode = encode
        self.strings = StringTable()
        self.origin_seen = False
        self.dirty = False
        self.dropped = 0
        # Items are [spec or framed record (bytes), row], or (framed record, row)
        # for events framed before they were added: a tuple of bytes and numbers
        # that the garbage collector stops tracking, however long it waits here.
        self._ring: deque[list[Any]] = deque()
        self._before: deque[list[Any]] = deque()
        self._protected: list[list[Any]] = []
        self._after_left = 0
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

    def add(self, spec: Any, row: RowTuple, nonfinite: bool) -> None:
        """Add one event: ``spec`` for ``encode``, or its framed record (bytes)."""
        self.dirty = True
        item: Any = (spec, row) if type(spec) is bytes else [spec, row]
        if not self.circular:
            self._ring.append(item)
            return
        if not self.origin_seen and nonfinite:
            self.origin_seen = True
            keep = min(self.window, len(self._ring))
            tail = [self._ring.pop() for _ in range(keep)]
            tail.reverse()
            self._before = self._ring
            self._ring = deque()
            self._protected = [*tail, item]
            self._after_left = self.window
            return
        if self._after_left > 0:
            self._protected.append(item)
            self._after_left -= 1
            return
        self._ring.append(item)
        if len(self._ring) > self.capacity:
            self._ring.popleft()
            self.dropped += 1
        # Pre-origin events beyond what the capacity allows are dropped too.
        while self._before and len(self._before) + len(self._ring) > self.capacity:
            self._before.popleft()
            self.dropped += 1

    def kept(self) -> int:
        if not self.circular:
            return 0
        return len(self._before) + len(self._protected) + len(self._ring)

    def flush(self, sync: bool = False) -> None:
        if not self.dirty:
            return
        self.dirty = False
        if self.circular:
            self._rewrite(sync)
        else:
            self._append(sync)

    def add_batch(self, payloads: list[bytes], rows: np.ndarray) -> None:
        """Append many encoded events at once (unbounded streams only).

        ``rows`` are full sidecar rows whose ``offset`` and ``length`` are
        filled in when the batch is written.
        """
        assert not self.circular
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

    def _append(self, sync: bool) -> None:
        if not self._ring:
            return
        items = list(self._ring)
        self._ring.clear()
        data, rows = self._records(items, self._data.offset)
        self._data.write_framed(data)
        # Data before index: a reader never finds a row whose record is not there yet.
        self._data.flush(sync)
        new = self.strings.take_new()
        if new:
            self._index.write(sidecar.strings_chunk(new))
        for chunk in sidecar.rows_chunks(rows):
            self._index.write(chunk)
        self._index.flush(sync)

    def _rewrite(self, sync: bool) -> None:
        data, rows = self._records([*self._before, *self._protected, *self._ring], 0)
        index = frame(sidecar.strings_chunk(self.strings.strings[1:])) + b"".join(
            frame(chunk) for chunk in sidecar.rows_chunks(rows)
        )
        _replace(self.path, data, sync)
        _replace(self.index_path, index, sync)

    def close(self) -> None:
        self.flush(sync=True)
        if not self.circular:
            self._data.close()
            self._index.close()


def _replace(path: Path, data: bytes, sync: bool) -> None:
    """Atomically replace ``path`` with ``data`` (a reader sees the old or the new file whole)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
