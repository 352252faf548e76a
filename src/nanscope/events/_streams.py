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

The stream runs on the writer's thread, which shares the GIL with the
training thread: every step of its work must be short. Events are therefore
kept in *blocks* (a batch's framed records as one ``bytes`` and its sidecar
rows as one numpy array), and which events are kept is a rule over their
arrival numbers (the anchors' windows, and an eviction watermark), not a
per-event structure: adding a batch, evicting and rewriting the circular file
at a flush are a few numpy operations and byte joins per block, never a
Python loop over the events kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.events._io import Append, Op, Replace, Sync
from nanscope.format import sidecar
from nanscope.format.files import INDEX_SUFFIX
from nanscope.format.records import OVERHEAD, frame
from nanscope.format.strings import StringTable

# Row tuples in the order of sidecar.ROW_DTYPE without offset and length:
# (name, graph, slot, wall_time, step, sequence, size, neg_inf, pos_inf, nan,
#  nonfinite, phase, device).
RowTuple = tuple[int, int, int, float, int, int, int, int, int, int, int, int, int]
_NAN = 9  # the position of the NaN count in a RowTuple
_NONFINITE = 10  # and of the non-finite flag

# sidecar.ROW_DTYPE without offset and length (same item size): row tuples convert to it
# in one call, and the array is then viewed as ROW_DTYPE.
_FIELDS: Any = sidecar.ROW_DTYPE.fields
_TAIL_DTYPE = np.dtype(
    {
        "names": list(_FIELDS)[2:],
        "formats": [_FIELDS[n][0] for n in list(_FIELDS)[2:]],
        "offsets": [_FIELDS[n][1] for n in list(_FIELDS)[2:]],
        "itemsize": sidecar.ROW_DTYPE.itemsize,
    }
)

MAX_ANCHORS = 32
"""At most this many (op type, has NaN) pairs per circular stream get a window
kept around their first non-finite event; the first event with NaN gets one
even past the bound. Each window holds at most ``2 * window + 1`` events, so a
circular stream holds at most ``capacity + (MAX_ANCHORS + 1) * (2 * window + 1)``
events, however long the run."""

SEAL = 256
"""Events added one at a time are gathered into a block of this many."""


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
        self._pending: list[bytes | memoryview] = []
        self.pending_bytes = 0
        # While the disk takes nothing, at most this many bytes wait (0: no bound);
        # records past it are dropped and counted.
        self.limit = 0
        self.dropped = 0

    def write(self, payload: bytes) -> int:
        """Frame and append one payload; returns its record's offset (-1: dropped)."""
        return self.write_framed(frame(payload))

    def write_framed(self, records: bytes | memoryview) -> int:
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


class _Block:
    """Consecutive events of a stream (or, once ``index`` is set, the kept ones of them).

    Either ``data`` holds their framed records back to back, ``rows``' offset
    and length columns pointing into it; or ``items`` holds, per row, what is
    still to be framed at the next flush: a framed record (``bytes``), or a
    spec for the stream's ``encode`` (``raw``: payloads, framed only). Events
    that are evicted before a flush are thus never encoded.
    """

    __slots__ = ("data", "first", "freed", "index", "items", "raw", "rows")

    def __init__(
        self,
        first: int,
        rows: np.ndarray,
        data: bytes | None,
        items: list[Any] | None,
        raw: bool = False,
    ) -> None:
        self.first = first  # the arrival number of its first event
        self.rows = rows
        self.data = data
        self.items = items
        self.raw = raw
        self.index: np.ndarray | None = None  # arrival numbers, when not first + arange
        self.freed = 0  # items before it that were let go of are freed (None)

    def numbers(self) -> np.ndarray:
        if self.index is not None:
            return self.index
        return np.arange(self.first, self.first + len(self.rows), dtype=np.int64)

    @property
    def end(self) -> int:
        """One past the arrival number of its last event."""
        return int(self.index[-1]) + 1 if self.index is not None else self.first + len(self.rows)


def floor_below(windows: Sequence[Sequence[int]], end: int, bound: int) -> int:
    """The lowest position from which ``bound`` events before ``end`` lie outside the
    protected ``windows`` (``[start, end)`` pairs in order): where a buffer that keeps
    the last ``bound`` events, beside the windows, lets go of everything before."""
    pos, need = end, bound
    for s, e in reversed(windows):
        e = min(e, end)
        if e <= s:
            continue
        gap = pos - e
        if gap >= need:
            break
        need -= gap
        pos = s
    return max(0, pos - need)


class EventStream:
    """A circular (``capacity > 0``) or unbounded event file with its sidecar index.

    Events arrive one at a time (:meth:`add`: a *spec* that ``encode`` turns
    into payload bytes at flush time, or a framed record) or as batches
    (:meth:`add_framed`: framed records and their rows, as the native recorder
    makes them; :meth:`add_batch`: payloads to frame).

    ``op_kind(name, graph)`` names the op type of a non-finite event for the
    anchor rule (see :data:`MAX_ANCHORS`) from its row's string numbers; by
    default the ``name`` column, which is the op type of an execution.

    What is kept is decided by arrival numbers (0, 1, ... in order of
    arrival): protected *windows* (intervals around anchors, never let go of)
    and a *floor*, below which the unprotected events were let go of (the
    oldest first). The floor rises whenever more than ``capacity`` unprotected
    events are kept, so the unprotected events kept are always the most recent
    ones. An anchor's window takes up to ``window`` kept events before it, none
    from before the previous window, and the ``window`` events after it; an
    anchor inside an open window extends that window.

    An unbounded stream becomes bounded in the same way while the disk takes
    nothing (:meth:`hold`): it keeps at most ``limit`` unprotected events, and
    at most ``limit_bytes`` bytes of them, and the anchors' windows, and counts
    the others in ``dropped`` (those holding Inf/NaN also in
    ``nonfinite_dropped``); what it kept is appended when the disk works again
    (the sequence numbers then show the gap). An event's bytes are its
    record's length, or, before it is encoded, the estimate it was added with.
    """

    def __init__(
        self,
        path: Path,
        capacity: int,
        window: int,
        encode: Callable[[Any], bytes],
        op_kind: Callable[[int, int], Hashable] | None = None,
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
        self.nonfinite_dropped = 0  # how many of the dropped ones held Inf/NaN
        self._pending_mark = self._written_mark = 0  # evicted + kept, at a rewrite (circular)
        # The arrival number of the first event after a rewrite (circular): the events from
        # the last rewrite that reached the disk on are not in the file.
        self._pending_arrival = self._written_arrival = 0
        self._bound = capacity if capacity > 0 else 0  # 0: unbounded (now)
        self._byte_bound = 0  # while held: the unprotected events' bytes at most (0: none)
        # Bytes of the events added since the floor last moved by bytes: an upper bound
        # of what the unprotected events kept hold (exact walks only when it passes the bound).
        self._tail_bytes = 0
        self._blocks: list[_Block] = []
        self._pinned = 0  # leading blocks that hold only protected events
        # Events added one at a time since the last block was sealed, and their bytes.
        self._items: list[Any] = []
        self._rows: list[RowTuple] = []
        self._sizes: list[int] = []
        self._n = 0  # the next event's arrival number
        self._base = 0  # the first event not written yet (unbounded) or ever added (circular)
        self._floor = 0  # unprotected events below it were let go of
        self._windows: list[list[int]] = []  # [start, end) of each window, in order, disjoint
        self._tail_floor = 0  # no window reaches before it (the last append)
        self._unscanned = 0 if capacity > 0 else -1  # >= 0: events from here skipped the rule
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
            self._unscanned = 0

    @property
    def circular(self) -> bool:
        return self.capacity > 0

    # -- adding events --------------------------------------------------------------------

    def add(self, spec: Any, row: RowTuple, nonfinite: bool, nbytes: int = 0) -> None:
        """Add one event: ``spec`` for ``encode``, or its framed record (bytes).

        ``nbytes``: about how many bytes its record will take (a framed record's own
        length counts when not given); what bounds a hold in bytes.
        """
        self.dirty = True
        i = self._n
        if nonfinite and self._bound and self._anchoring:
            # Inline up to the one set lookup: in a run full of NaN, every event comes here.
            op_kind = self.op_kind
            key = (row[0] if op_kind is None else op_kind(row[0], row[1]), row[_NAN] > 0)
            if key not in self._anchors and self._new_anchor(key):
                self._anchor(i)
        if not nbytes:
            nbytes = len(spec) if type(spec) is bytes else OVERHEAD
        self._items.append(spec)
        self._rows.append(row)
        self._sizes.append(nbytes)
        self._tail_bytes += nbytes
        self._n = i + 1
        # Past the bound in bytes (large FULL_TENSOR events), at once, not a block later.
        if len(self._rows) >= SEAL or (self._byte_bound and self._tail_bytes > self._byte_bound):
            self._seal()
            self._trim()

    def add_framed(self, data: bytes, rows: np.ndarray) -> None:
        """Add a batch: ``data``, framed records back to back, and their full sidecar
        rows (``offset`` and ``length`` within ``data``; ``rows`` is kept, not copied)."""
        if not len(rows):
            return
        self._add_block(_Block(self._n, rows, data, None))

    def add_batch(self, payloads: list[bytes], rows: np.ndarray) -> None:
        """Add a batch of encoded payloads (framed at the next flush, if still kept);
        ``rows`` are full sidecar rows whose ``offset`` and ``length`` are filled then."""
        if not len(rows):
            return
        # Their records' lengths, for a hold's bound in bytes (set again when framed).
        rows["length"] = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        rows["length"] += OVERHEAD
        self._add_block(_Block(self._n, rows, None, payloads, raw=True))

    def _add_block(self, block: _Block) -> None:
        self.dirty = True
        self._seal()
        self._blocks.append(block)
        if self._byte_bound:
            self._tail_bytes += int(block.rows["length"].sum())
        self._n = block.first + len(block.rows)
        if self._bound:
            if self._anchoring:
                self._scan(block.rows, block.first)
            self._trim()

    def _seal(self) -> None:
        """Gather the events added one at a time into a block."""
        if not self._rows:
            return
        rows = np.array(self._rows, dtype=_TAIL_DTYPE).view(sidecar.ROW_DTYPE)
        # Until they are framed, the length column holds the estimates they came with.
        rows["length"] = self._sizes
        self._blocks.append(_Block(self._n - len(rows), rows, None, self._items))
        self._items, self._rows, self._sizes = [], [], []

    # -- the anchor rule ------------------------------------------------------------------

    def _scan(self, rows: np.ndarray, first: int) -> None:
        """Apply the anchor rule to a batch's rows (arrival numbers from ``first``): only the
        first non-finite event of each key can become an anchor, so only those are visited."""
        hits = np.flatnonzero(rows["nonfinite"] == 1)
        if not len(hits):
            return
        names = rows["name"][hits].astype(np.int64)
        nan = rows["nan"][hits] > 0
        candidates: list[tuple[int, tuple[Hashable, bool]]]
        if self.op_kind is None:
            _, firsts = np.unique(names * 2 + nan, return_index=True)
            candidates = [(int(j), (int(names[j]), bool(nan[j]))) for j in np.sort(firsts)]
        else:
            graphs = rows["graph"][hits].astype(np.int64)
            triples = np.stack((names, graphs, nan.astype(np.int64)), axis=1)
            _, firsts = np.unique(triples, axis=0, return_index=True)
            op_kind = self.op_kind
            candidates = [
                (int(j), (op_kind(int(names[j]), int(graphs[j])), bool(nan[j])))
                for j in np.sort(firsts)
            ]
        anchors = self._anchors
        for j, key in candidates:
            if not self._anchoring:
                return
            if key not in anchors and self._new_anchor(key):
                self._anchor(first + int(hits[j]))

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

    def _anchor(self, i: int) -> None:
        """Protect event ``i``, up to ``window`` kept events before it and the ``window``
        after it."""
        windows = self._windows
        end = i + self.window + 1
        if windows and i < windows[-1][1]:
            # Inside the previous anchor's window: the windows merge.
            windows[-1][1] = end
            return
        # What was let go of before the anchor stays let go of.
        self._evict_to(i)
        start = max(i - self.window, self._floor, windows[-1][1] if windows else self._tail_floor)
        if windows and windows[-1][1] == start:
            windows[-1][1] = end  # nothing unprotected in between: one window
        else:
            windows.append([start, end])

    def _protected(self, lo: int, hi: int) -> int:
        """Protected events in ``[lo, hi)``."""
        total = 0
        for s, e in self._windows:
            total += max(0, min(e, hi) - max(s, lo))
        return total

    def _evict_to(self, end: int) -> None:
        """Let go of the oldest unprotected events until at most the bound of them are
        kept among the events before ``end``."""
        bound = self._bound
        if not bound:
            return
        floor = floor_below(self._windows, end, bound)
        if self._byte_bound and self._tail_bytes > self._byte_bound:
            floor = max(floor, self._byte_floor(end))
        old = self._floor
        if floor <= old:
            return
        let_go = (floor - old) - self._protected(old, floor)
        if self.circular:
            self.evicted += let_go
        else:
            self.dropped += let_go
            if let_go:
                self.nonfinite_dropped += self._nonfinite_between(old, floor)
        self._floor = floor

    def _byte_floor(self, end: int) -> int:
        """The lowest floor that keeps at most the byte bound of unprotected events
        among those before ``end`` (the newest kept; one larger than the bound is not)."""
        numbers, lengths, _ = self._gather(self._floor, end)
        if not len(numbers):
            self._tail_bytes = 0
            return self._floor
        sizes = np.where(self._in_windows(numbers), 0, lengths)
        tail = np.cumsum(sizes[::-1])[::-1]  # bytes of the unprotected events from i on
        over = np.flatnonzero(tail > self._byte_bound)
        if not len(over):
            self._tail_bytes = int(tail[0])
            return self._floor
        k = int(over[-1]) + 1
        self._tail_bytes = int(tail[k]) if k < len(tail) else 0
        return int(numbers[k - 1]) + 1

    def _in_windows(self, numbers: np.ndarray) -> np.ndarray:
        """Which of the arrival numbers ``numbers`` lie in a window."""
        inside = np.zeros(len(numbers), dtype=bool)
        for s, e in self._windows:
            inside |= (numbers >= s) & (numbers < e)
        return inside

    def _gather(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The arrival numbers, bytes and non-finite flags of the events still held
        whose numbers are in ``[lo, hi)``, in order."""
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for block in self._blocks[self._pinned :] if lo >= self._floor else self._blocks:
            if block.end <= lo:
                continue
            if block.first >= hi:
                break
            numbers = block.numbers()
            pick = (numbers >= lo) & (numbers < hi)
            rows = block.rows
            parts.append(
                (numbers[pick], rows["length"][pick].astype(np.int64), rows["nonfinite"][pick] == 1)
            )
        if self._rows:
            first = self._n - len(self._rows)
            a, b = max(lo, first) - first, min(hi, self._n) - first
            if a < b:
                parts.append(
                    (
                        np.arange(first + a, first + b, dtype=np.int64),
                        np.array(self._sizes[a:b], dtype=np.int64),
                        np.array([r[_NONFINITE] == 1 for r in self._rows[a:b]], dtype=bool),
                    )
                )
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0, dtype=bool)
        if len(parts) == 1:
            return parts[0]
        return (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )

    def _nonfinite_between(self, lo: int, hi: int) -> int:
        """Unprotected events holding Inf/NaN among those held in ``[lo, hi)``."""
        numbers, _, bad = self._gather(lo, hi)
        if not bad.any():
            return 0
        return int((bad & ~self._in_windows(numbers)).sum())

    def _trim(self) -> None:
        """Evict up to the newest event, and free what the blocks no longer keep."""
        self._evict_to(self._n)
        blocks = self._blocks
        floor = self._floor
        # Blocks wholly below the floor keep only protected events, which stay kept:
        # once reduced to those, a block is passed over (``_pinned`` of them lead).
        i = self._pinned
        while i < len(blocks) and blocks[i].end <= floor:
            block = blocks[i]
            keep = self._kept_mask(block)
            if keep is not None:
                if not keep.any():
                    del blocks[i]
                    continue
                blocks[i] = self._compact(block, keep)
            i += 1
        self._pinned = i
        if i < len(blocks):
            self._free_items(blocks[i])

    def _free_items(self, block: _Block) -> None:
        """Free the items (event objects, large records) that a block straddling the
        floor let go of, before the block is wholly let go of."""
        items = block.items
        if items is None or block.index is not None:
            return
        upto = min(self._floor - block.first, len(items))
        if upto <= block.freed:
            return
        keep = self._kept_mask(block)
        if keep is not None:  # None: all of them protected
            for j in (np.flatnonzero(~keep[block.freed : upto]) + block.freed).tolist():
                items[j] = None
        block.freed = upto

    def _kept_mask(self, block: _Block) -> np.ndarray | None:
        """Which of ``block``'s events are kept (``None``: all of them)."""
        floor = self._floor
        if block.first >= floor and block.index is None:
            return None
        numbers = block.numbers()
        keep = numbers >= floor
        for s, e in self._windows:
            if e > block.first and s < block.end:
                keep |= (numbers >= s) & (numbers < e)
        return None if keep.all() else keep

    def _compact(self, block: _Block, keep: np.ndarray | None) -> _Block:
        """``block`` reduced to its kept events, framed (encoding those not encoded yet)."""
        numbers = block.numbers()
        rows = block.rows
        if keep is not None:
            rows = rows[keep]
            numbers = numbers[keep]
        if block.data is not None:
            if keep is None:
                out = _Block(block.first, rows, block.data, None)
            else:
                out = _Block(block.first, rows, _slices(block.data, rows), None)
                _renumber(rows, 0)
        else:
            items = block.items
            assert items is not None
            picked = items if keep is None else [items[j] for j in np.flatnonzero(keep).tolist()]
            if block.raw:
                framed = [frame(p) for p in picked]
            else:
                encode = self.encode
                framed = [p if type(p) is bytes else frame(encode(p)) for p in picked]
            rows["length"] = np.fromiter(map(len, framed), dtype=np.int64, count=len(framed))
            _renumber(rows, 0)
            out = _Block(block.first, rows, b"".join(framed), None)
        if keep is not None or block.index is not None:
            out.index = numbers
        return out

    def kept(self) -> int:
        """Events a circular stream holds now (0 for an unbounded one)."""
        return self._held() if self.circular else 0

    def _held(self) -> int:
        """Events added and not let go of (nor written, when unbounded)."""
        n, base = self._n, self._base
        floor = max(self._floor, base)
        return (n - floor) + self._protected(base, floor)

    # -- holding on while the disk takes nothing (unbounded streams) -----------------------

    def hold(self, limit: int, limit_bytes: int = 0) -> None:
        """Bound an unbounded stream to ``limit`` events and ``limit_bytes`` bytes of them
        (``0``: no bound in bytes), and the anchors' windows, while the disk takes
        nothing; ``limit`` 0 lifts the bound. No-op when circular."""
        if self.circular or (limit == self._bound and limit_bytes == self._byte_bound):
            return
        was = self._bound
        self._bound = max(0, limit)
        self._byte_bound = max(0, limit_bytes) if self._bound else 0
        if not self._bound:
            self._unscanned = self._n
            return
        if was:
            self._trim()  # only the bounds changed
            return
        # Every event held counts toward the bound in bytes until the first exact walk.
        self._tail_bytes = int(self._gather(self._floor, self._n)[1].sum())
        self._anchoring = len(self._anchors) < MAX_ANCHORS or not self._nan_seen
        # What arrived before the disk was known to fail goes through the anchor
        # rule too: the first NaN may be among it.
        self._seal()
        start, self._unscanned = self._unscanned, -1
        if self._anchoring:
            for block in list(self._blocks):
                if block.end <= start or block.index is not None:
                    continue
                skip = max(0, start - block.first)
                self._scan(block.rows[skip:], block.first + skip)
                if not self._anchoring:
                    break
        self._trim()

    # -- writing --------------------------------------------------------------------------

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

    def _collect(self, start: int) -> tuple[list[bytes | memoryview], np.ndarray]:
        """The kept events' framed records (pieces to join) and their rows, offsets from
        ``start``; the blocks are left framed and reduced to what they keep."""
        self._seal()
        self._trim()
        pieces: list[bytes | memoryview] = []
        tables: list[np.ndarray] = []
        blocks = self._blocks
        for k, block in enumerate(blocks):
            keep = self._kept_mask(block)
            if block.data is None:
                # Encoded now, the kept events only, and kept framed for the next flushes.
                block = blocks[k] = self._compact(block, keep)
                keep = None
            data = block.data
            assert data is not None
            if keep is None:
                pieces.append(data)
                tables.append(block.rows)
            else:
                rows = block.rows[keep]
                pieces.extend(_runs(data, rows))
                tables.append(rows)
        if not tables:
            return pieces, np.zeros(0, dtype=sidecar.ROW_DTYPE)
        table = tables[0].copy() if len(tables) == 1 else np.concatenate(tables)
        _renumber(table, start)
        return pieces, table

    def _append(self, sync: bool) -> list[Op]:
        pieces, rows = self._collect(self._data.offset)
        # What a hold kept goes out in order; the windows need no protection any more.
        self._blocks.clear()
        self._pinned = 0
        self._windows = []
        self._base = self._floor = self._tail_floor = self._n
        self._tail_bytes = 0
        if self._unscanned >= 0:
            self._unscanned = self._n
        if not len(rows):
            return self._data.take(sync) + self._index.take(sync)
        self._data.write_framed(b"".join(pieces))
        new = self.strings.take_new()
        if new:
            self._index.write(sidecar.strings_chunk(new))
        for chunk in sidecar.rows_chunks(rows):
            self._index.write(chunk)
        ops = self._data.take(sync)
        ops[0].events, ops[0].of = len(rows), self.kind
        ops[0].nonfinite = int((rows["nonfinite"] == 1).sum())
        # Data before index: a reader never finds a row whose record is not there yet
        # (the disk thread runs them in order and stops at the first failure).
        return ops + self._index.take(sync)

    def _rewrite(self, sync: bool) -> list[Op]:
        pieces, rows = self._collect(0)
        index = frame(sidecar.strings_chunk(self.strings.strings[1:])) + b"".join(
            frame(chunk) for chunk in sidecar.rows_chunks(rows)
        )
        self._pending_mark = self.evicted + len(rows)
        self._pending_arrival = self._n
        # The pieces are written one after the other: joined, a buffer of FULL_TENSOR
        # values would be copied whole at every flush.
        return [Replace(self.path, pieces, sync), Replace(self.index_path, index, sync)]

    def drop_held(self) -> None:
        """Count what an unbounded stream holds in memory as dropped (the disk never
        took it), or, when circular and not written since it changed, all it keeps."""
        self._seal()
        self._trim()
        kept = self._held()
        lo = self._written_arrival if self.circular else self._base
        numbers, _, bad = self._gather(lo, self._n)
        if bad.any():
            # Those of them that are kept: all at or above the floor, and those in windows.
            self.nonfinite_dropped += int(
                (bad & ((numbers >= self._floor) | self._in_windows(numbers))).sum()
            )
        if self.circular:
            # Every event added was evicted or is kept: those past the mark of the
            # last rewrite that reached the disk, and still kept, are not in the file.
            self.dropped += min(kept, self.evicted + kept - self._written_mark)
        else:
            self.dropped += kept
        self._blocks.clear()
        self._pinned = 0
        self._windows = []
        self._base = self._floor = self._tail_floor = self._n
        self._tail_bytes = 0
        self.dirty = False

    def confirm(self) -> None:
        """The operations of the last :meth:`flush` reached the disk."""
        self._written_mark = self._pending_mark
        self._written_arrival = self._pending_arrival

    def close(self) -> None:
        """Close the file descriptors (after the last :meth:`flush`'s operations ran)."""
        if not self.circular:
            self._data.close()
            self._index.close()


def _renumber(rows: np.ndarray, start: int) -> None:
    """Set ``rows``' offsets: their records back to back from ``start``."""
    lengths = rows["length"].astype(np.int64)
    ends = np.cumsum(lengths)
    rows["offset"] = start + ends - lengths


def _runs(data: bytes, rows: np.ndarray) -> list[memoryview]:
    """The pieces of ``data`` that hold ``rows``' records (runs of adjacent records)."""
    view = memoryview(data)
    if not len(rows):
        return []
    starts = rows["offset"].astype(np.int64)
    ends = starts + rows["length"].astype(np.int64)
    cuts = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    firsts = np.concatenate(([0], cuts)).tolist()
    lasts = np.concatenate((cuts - 1, [len(rows) - 1])).tolist()
    return [view[int(starts[a]) : int(ends[b])] for a, b in zip(firsts, lasts, strict=True)]


def _slices(data: bytes, rows: np.ndarray) -> bytes:
    """The records of ``rows`` out of ``data``, back to back."""
    return b"".join(_runs(data, rows))
