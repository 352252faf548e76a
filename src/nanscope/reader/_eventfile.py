"""The columnar index of one ``.execution`` or ``.graph_execution_traces`` file.

Rows come from the sidecar index when the writer left one that agrees with the
data file, and otherwise from the records themselves (TensorFlow's dumps, a
damaged sidecar, or the tail that the writer has not indexed yet). Records are
read in bulk where :mod:`._fastscan` can vouch for them (numpy over the framing
and the top-level fields, each distinct trace or execution decoded once) and one
by one with protobuf otherwise; both give the same rows and problems. A file
indexed from its records, whole and without a problem, gets a sidecar written
next to it in a background thread (:meth:`EventFile._leave_sidecar`), so that the
next open reads none.
``update()`` is incremental: an appended file is read from where the last
call stopped; a file that was replaced (a circular buffer's periodic rewrite)
is indexed again from scratch.

Every record the index holds had a sound CRC when it was indexed: rows that the
sidecar serves are checked against the data file in bulk
(:func:`._fastscan.verify_tiled`), and a damaged record is skipped and reported,
as the scan does. Records are read through a :class:`._handles.Handle`, which
the reader's descriptor budget may close and reopen.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import google_crc32c
import numpy as np

from nanscope.format import sidecar
from nanscope.format.files import INDEX_SUFFIX
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import (
    HEADER_SIZE,
    OVERHEAD,
    RecordError,
    frame,
    header,
    mask,
    read_one,
    scan,
)
from nanscope.format.strings import StringTable
from nanscope.reader import _fastscan
from nanscope.reader._data import Problem
from nanscope.reader._decode import DecodeError, RowData, parse_event
from nanscope.reader._handles import FileChanged, Handle
from nanscope.reader._logs import open_regular, record_problem, unreadable

CHUNK = 32 << 20
# The blocks in which the records a sidecar points at are checked (:meth:`EventFile._verify`):
# small enough to add little to the peak memory, large enough that numpy's calls pay.
VERIFY_CHUNK = 8 << 20
_VERIFY_ROWS = 1 << 16
# A file not modified for this long is taken as finished: its sidecar may be written.
SETTLED_S = 5.0


ROW_DTYPE = sidecar.ROW_DTYPE
# Inf/NaN counts are kept as int32 in memory, saturated at 2**31 - 1 (only "how many events
# hold Inf/NaN" is asked of the index; counts shown to people are decoded from the records).
_NARROW = ("neg_inf", "pos_inf", "nan")
_I32_MAX = 2**31 - 1
# The reader's in-memory row: the sidecar's without the element count and with narrow
# counts, 64 bytes an event instead of 84 (a 10M-event dump's index fits in 640 MB).
INDEX_DTYPE = np.dtype(
    [
        (name, "<i4" if name in _NARROW else ROW_DTYPE.fields[name][0])  # type: ignore[index]
        for name in ROW_DTYPE.names or ()
        if name != "size"
    ]
)


def _offset(dtype: np.dtype, name: str) -> int:
    return int(dtype.fields[name][1])  # type: ignore[index]


# Both row types start with the same fields up to ``size`` and end with the same fields
# from ``nonfinite`` on: those parts are copied as bytes, the counts converted.
_HEAD = _offset(ROW_DTYPE, "size")
_SRC_COUNTS, _DST_COUNTS = _offset(ROW_DTYPE, "neg_inf"), _offset(INDEX_DTYPE, "neg_inf")
_SRC_TAIL, _DST_TAIL = _offset(ROW_DTYPE, "nonfinite"), _offset(INDEX_DTYPE, "nonfinite")
assert _DST_COUNTS == _HEAD
assert ROW_DTYPE.itemsize - _SRC_TAIL == INDEX_DTYPE.itemsize - _DST_TAIL


def copy_rows(src: np.ndarray, dst: np.ndarray) -> None:
    """Copy sidecar rows (:data:`ROW_DTYPE`) into index rows (:data:`INDEX_DTYPE`)."""
    n = len(src)
    if not n:
        return
    s = np.ascontiguousarray(src).view(np.uint8).reshape(n, ROW_DTYPE.itemsize)
    d = dst.view(np.uint8).reshape(n, INDEX_DTYPE.itemsize)
    d[:, :_HEAD] = s[:, :_HEAD]
    d[:, _DST_TAIL:] = s[:, _SRC_TAIL:]
    counts = s[:, _SRC_COUNTS:_SRC_TAIL].view("<i8")
    d[:, _DST_COUNTS:_DST_TAIL].view("<i4")[:] = np.minimum(counts, _I32_MAX)


def sidecar_rows(src: np.ndarray) -> np.ndarray:
    """Index rows (:data:`INDEX_DTYPE`) as sidecar rows (:data:`ROW_DTYPE`), ``size`` -1
    (unknown: the index does not keep it); the inverse of :func:`copy_rows` for counts
    that were not saturated."""
    n = len(src)
    out = np.empty(n, dtype=ROW_DTYPE)
    if not n:
        return out
    s = np.ascontiguousarray(src).view(np.uint8).reshape(n, INDEX_DTYPE.itemsize)
    d = out.view(np.uint8).reshape(n, ROW_DTYPE.itemsize)
    d[:, :_HEAD] = s[:, :_HEAD]
    d[:, _SRC_TAIL:] = s[:, _DST_TAIL:]
    d[:, _SRC_COUNTS:_SRC_TAIL].view("<i8")[:] = s[:, _DST_COUNTS:_DST_TAIL].view("<i4")
    out["size"] = -1
    return out


_SLICE = 1 << 20
# Record headers compared with a sidecar's rows before saying its data file was cut short.
_CUT_SAMPLES = 16


class FileReplaced(RecordError):
    """An indexed record that cannot be read because its file is no longer the one
    indexed (replaced or deleted since its handle was closed): call ``update()``."""


class EventFile:
    """Index rows of one event file; ``name`` and ``graph`` index :attr:`strings`."""

    # Read records in bulk where that is safe (:mod:`._fastscan`); False decodes each one
    # with protobuf (the reference the fast path is tested against).
    fast = True
    # After indexing a file without a sidecar (TensorFlow's), leave one next to it so that the
    # next open reads no record (see :meth:`_leave_sidecar`); False never writes anything.
    write_sidecar = True

    def __init__(
        self,
        path: Path,
        row_of: Callable[[pb.DebugEvent, list[str]], RowData],
        field: str,
        strings: StringTable,
    ) -> None:
        self.path = path
        self.index_path = Path(str(path) + INDEX_SUFFIX)
        self._row_of = row_of
        self._field = field  # "execution" or "graph_execution_trace"
        self._intern = strings.intern
        self._strings = strings
        # Opened at the first update() and kept (the cache may close it and reopen the
        # same file): records are read from the file that was indexed.
        self._handle = Handle(path)
        self.reset_count = -1
        self.decoded = 0  # records decoded to build the index (0 when the sidecar served)
        self.fast_decoded = 0  # of those, records the fast path (:mod:`._fastscan`) read
        self._sidecar_thread: threading.Thread | None = None
        self._reset()

    def _reset(self) -> None:
        self._identity: tuple[int, int] | None = None
        self._confirmed: list[np.ndarray] = []  # rows from the sidecar or a finished scan
        self._confirmed_end = 0  # data offset covered by confirmed rows
        self._sidecar_offset = 0
        # The writer never sends string 0 (the empty string): it is implied.
        self._sidecar_strings: list[str] = [""]
        self._sidecar_ok = True
        self._tail = np.zeros(0, dtype=INDEX_DTYPE)  # scanned, not yet in the sidecar
        self.torn_at: int | None = None
        self.rows = np.zeros(0, dtype=INDEX_DTYPE)
        self.reset_count += 1
        self.join_sidecar()
        self._handle.close()

    def read(self, offset: int, length: int) -> bytes:
        """The bytes of one indexed record, from the very file that was indexed.

        Its handle stays open (or is reopened only if the path still names that file),
        so a circular file replaced since the last ``update()`` still yields the records
        its index points at; where that can no longer be (the handle was closed to stay
        within the descriptor limit, and the file replaced since), :class:`FileReplaced`.
        """
        try:
            return self._handle.pread(length, offset)
        except FileChanged as exc:
            raise FileReplaced(str(self.path), offset, str(exc.strerror)) from None

    def adopt(self, rows: np.ndarray) -> None:
        """Hold ``rows`` (equal to :attr:`rows`, a view of a merged index) instead of a copy."""
        n_confirmed = len(rows) - len(self._tail)
        self.rows = rows
        self._confirmed = [rows[:n_confirmed]] if n_confirmed else []
        self._tail = rows[n_confirmed:]

    def join_sidecar(self) -> None:
        """Wait for the sidecar being written in the background, if any (:meth:`_leave_sidecar`)."""
        if self._sidecar_thread is not None:
            self._sidecar_thread.join()
            self._sidecar_thread = None

    def close(self) -> None:
        self.join_sidecar()
        self._handle.close()

    def sidecar_capacity(self) -> int | None:
        """At most how many rows a first :meth:`update` reads, when the sidecar alone will
        serve them (None: unknown, e.g. no sidecar)."""
        try:
            if not self.index_path.is_file():
                return None
            return self.index_path.stat().st_size // ROW_DTYPE.itemsize + 1
        except OSError:
            return None

    def update(
        self, problems: list[Problem], into: np.ndarray | None = None, retry: bool = True
    ) -> bool:
        """Catch up with the file; True when rows changed (False: nothing new).

        ``into``: room for the rows that the sidecar holds (at least
        :meth:`sidecar_capacity` rows), so that they are read straight into a merged
        index instead of a copy of their own; see :attr:`rows` for where they went.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        except OSError as exc:  # a looping symlink, no access
            problems.append(unreadable(self.path, exc, events=True))
            return False
        identity = (st.st_ino, st.st_dev)
        if self._identity is not None and (
            identity != self._identity or st.st_size < self._confirmed_end
        ):
            self._reset()  # replaced (circular rewrite) or truncated
        first = self._identity is None
        if first:
            try:
                st = self._handle.open()  # the file read() reads from, until the next reset
            except FileNotFoundError:
                return False
            except OSError as exc:  # a directory, FIFO or device in the dump's name
                problems.append(unreadable(self.path, exc, events=True))
                return False
            identity = (st.st_ino, st.st_dev)
        self._identity = identity
        said = len(problems)
        try:
            with self._handle.held():  # not closed by the cache while it is read
                return self._catch_up(first, st.st_size, problems, into)
        except FileReplaced:
            # Replaced between the stat above and a read (its handle had been closed to stay
            # within the descriptor limit): what was read of it is void; read the new file.
            del problems[said:]
            self._reset()
            return self.update(problems, into, retry=False) if retry else True
        except OSError as exc:  # an I/O error: what the file holds from here on is unknown
            problems.append(unreadable(self.path, exc, events=True))
            return False

    def _catch_up(
        self, first: bool, size: int, problems: list[Problem], into: np.ndarray | None
    ) -> bool:
        """:meth:`update`'s reading, the file's handle held."""
        before = len(self.rows)
        before_end = self._confirmed_end + self._tail.size
        if self._sidecar_ok and self.index_path.exists():
            self._read_sidecar(size, problems, into if first else None)
        if self._confirmed_end < size:
            no_sidecar = not self.index_path.exists()
            said = len(problems)
            self._tail = self._scan(
                self._confirmed_end,
                size,
                problems,
                confirm=no_sidecar or not self._sidecar_ok,
            )
            if first and no_sidecar and len(problems) == said and self.write_sidecar:
                rows = self._confirmed[0] if len(self._confirmed) == 1 else None
                if rows is not None and self.torn_at is None:
                    # In the background: the index is ready, the first alert needs no sidecar.
                    # Not a daemon: the process waits for it at exit (no half-written file).
                    self._sidecar_thread = threading.Thread(
                        target=self._leave_sidecar,
                        args=(rows, size),
                        name=f"nanscope-sidecar {self.path.name}",
                    )
                    self._sidecar_thread.start()
        else:
            self._tail = np.zeros(0, dtype=INDEX_DTYPE)
        if len(self._confirmed) > 1:
            # Merge what earlier updates confirmed: later updates only append.
            self._confirmed = [np.concatenate(self._confirmed)]
        parts = [p for p in (*self._confirmed, self._tail) if p.size] or [self._tail]
        self.rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return (
            first or len(self.rows) != before or before_end != self._confirmed_end + self._tail.size
        )

    def _leave_sidecar(self, rows: np.ndarray, size: int) -> None:
        """Write the sidecar of a file indexed from its records, for the next open.

        Only for a whole file read without a word of complaint (no damage, no torn
        tail: a sidecar cannot repeat what was said of a record) and left alone for
        :data:`SETTLED_S` (a writer still appending would leave a tail that every
        update reads again); only when the directory is writable, and never over a
        sidecar that exists (written to a temporary name, then hard-linked into place,
        which fails when the name is taken). The data file is never touched. Any
        error leaves things as they were: the sidecar is a hint.

        Runs in a thread of its own; ``rows`` (the file's confirmed rows) is only read,
        and the reader never changes an array in place once it is confirmed.
        """
        with contextlib.suppress(Exception):  # a hint that could not be left changes nothing
            self._write_sidecar(rows, size)

    def _write_sidecar(self, rows: np.ndarray, size: int) -> None:
        if not len(rows):
            return
        offsets, lengths = rows["offset"].astype(np.int64), rows["length"].astype(np.int64)
        if offsets[0] != 0 or offsets[-1] + lengths[-1] != size:
            return
        if np.any(offsets[1:] != offsets[:-1] + lengths[:-1]):
            return  # records that are not rows (another kind of event): rows must tile
        if any(np.any(rows[c] >= _I32_MAX) for c in _NARROW):
            return  # a count the index saturated: the sidecar would hold a wrong one
        try:
            if time.time() - os.stat(self.path).st_mtime < SETTLED_S:
                return
            directory = self.path.parent
            if not os.access(directory, os.W_OK) or self.index_path.exists():
                return
        except OSError:
            return
        # The sidecar's own string table: "" first, then the strings its rows use.
        used = np.unique(np.concatenate([rows["name"], rows["graph"]]))
        used = used[used != 0]
        table = np.zeros(int(max(used.max(initial=0), 0)) + 1, dtype=np.uint32)
        table[used] = np.arange(1, len(used) + 1, dtype=np.uint32)
        out = sidecar_rows(rows)
        out["name"] = table[rows["name"]]
        out["graph"] = table[rows["graph"]]
        strings = self._strings.strings
        chunks = [sidecar.strings_chunk([strings[i] for i in used.tolist()])]
        chunks += sidecar.rows_chunks(out)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{self.index_path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(frame(chunk))
            # Not fsynced: a sidecar cut short by a crash fails its CRCs and is ignored.
            os.link(tmp, self.index_path)  # fails when a sidecar appeared meanwhile
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    # -- the sidecar path ------------------------------------------------------------------

    def _read_sidecar(
        self, data_size: int, problems: list[Problem], into: np.ndarray | None = None
    ) -> None:
        try:
            with open_regular(self.index_path) as fh:
                found = self._sidecar_rows(fh, into)
        except (OSError, ValueError):
            self._sidecar_ok = False
            return
        if found is None:
            self._sidecar_ok = False
            return
        rows, strings, end = found
        if not rows.size:
            self._sidecar_offset = end
            self._sidecar_strings = strings
            return
        if not self._consistent(rows, data_size, len(strings)):
            # A sidecar that disagrees with its data file is ignored from now on.
            self._sidecar_ok = False
            self._cut_short(rows, problems)
            return
        end_of_rows = int(rows["offset"][-1]) + int(rows["length"][-1])
        damaged = self._verify(rows)
        if damaged is None:  # a record header that is not what the sidecar says
            self._sidecar_ok = False
            return
        if len(damaged):
            # Skipped, as the scan skips them; the rows after them close up in place (so
            # that rows read into a merged index stay where they are).
            for i in damaged.tolist():
                err = RecordError(
                    str(self.path), int(rows["offset"][i]), "bad payload CRC; record skipped"
                )
                problems.append(record_problem(err, incomplete=True))
            keep = np.ones(len(rows), dtype=bool)
            keep[damaged] = False
            kept = int(keep.sum())
            rows[:kept] = rows[keep]
            rows = rows[:kept]
        times = rows["wall_time"]
        times[~np.isfinite(times)] = 0.0  # as for decoded records: JSON has no NaN
        remap = np.array([self._intern(s) for s in strings], dtype=np.uint32)
        rows["name"] = remap[rows["name"]]
        rows["graph"] = remap[rows["graph"]]
        if len(rows):
            self._confirmed.append(rows)
        self._confirmed_end = end_of_rows
        self._sidecar_offset = end
        self._sidecar_strings = strings

    def _sidecar_rows(
        self, fh: BinaryIO, into: np.ndarray | None = None
    ) -> tuple[np.ndarray, list[str], int] | None:
        """The new rows, the string table and the end offset; None when the sidecar is damaged.

        Read a chunk at a time into one array sized for the worst case, so that
        the peak memory is the rows plus one chunk (never the file twice); the
        pages of the array that no row reaches are never touched.
        """
        size = os.fstat(fh.fileno()).st_size
        offset = self._sidecar_offset
        need = max(0, size - offset) // ROW_DTYPE.itemsize + 1
        rows = (
            into[:need] if into is not None and len(into) >= need else np.empty(need, INDEX_DTYPE)
        )
        n = 0
        strings = list(self._sidecar_strings)
        fd = fh.fileno()

        def take(payload: bytes) -> None:
            nonlocal n
            chunk, new_strings = sidecar.decode_chunk(payload)  # ValueError: damaged
            if new_strings is not None:
                strings.extend(new_strings)
            elif chunk is not None and chunk.size:
                copy_rows(chunk, rows[n : n + len(chunk)])
                n += len(chunk)

        # Record by record while every record is intact (the common case, and the one
        # that reads a dump of many ranks: no copy of the payloads); the block scan below
        # takes over at anything else (a torn tail, damage).
        while (found := read_one(fd, offset, size)) is not None:
            take(found[0])
            offset = found[1]
        want = CHUNK
        while offset < size:
            blob = os.pread(fd, min(want, size - offset), offset)
            want = CHUNK
            result = scan(blob, str(self.index_path), base=offset, resync_limit=0)
            if result.errors:
                return None
            for rec in result.records:
                take(rec.payload)
            if result.end == offset:
                if result.torn and offset + len(blob) < size and len(blob) >= HEADER_SIZE:
                    # One chunk larger than what was read: read exactly that record next.
                    want = int.from_bytes(blob[:8], "little") + OVERHEAD
                    continue
                break  # a torn tail: the writer is still writing it
            offset = result.end
        return rows[:n], strings, offset

    def _cut_short(self, rows: np.ndarray, problems: list[Problem]) -> None:
        """Say so when the data file ends before records its sidecar indexed.

        The writer appends records before it indexes them, so a sidecar reaching past
        the data file's end (as measured now, not when the update began: a live
        writer may have appended both since) means the file lost its tail: a copy
        cut short, a truncation. The scan then reads what is left.
        """
        end = int(rows["offset"][-1]) + int(rows["length"][-1])
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return
        if end <= size:
            return
        offsets = rows["offset"].astype(np.int64)
        within = np.flatnonzero(offsets + rows["length"] <= size)
        picks = within[
            np.linspace(0, len(within) - 1, min(_CUT_SAMPLES, len(within))).astype(np.int64)
        ]
        try:
            for i in picks.tolist():
                if self.read(int(offsets[i]), HEADER_SIZE) != header(
                    int(rows["length"][i]) - OVERHEAD
                ):
                    # Other records where the index says: not this file's index (a circular
                    # file replaced between the two reads), so no claim on its tail.
                    return
        except OSError:
            return
        lost = int(np.count_nonzero(offsets >= size))
        err = RecordError(
            str(self.path),
            size,
            f"the file ends here, but its index ({self.index_path.name}) lists records up to "
            f"byte offset {end} ({lost} records or more are lost: the file was cut short)",
        )
        problems.append(record_problem(err, incomplete=True))

    def _consistent(self, rows: np.ndarray, data_size: int, n_strings: int) -> bool:
        """Rows must tile the data file from where we are (their headers are compared
        with the records by :meth:`_verify`)."""
        offsets, lengths = rows["offset"], rows["length"]
        if int(offsets[0]) != self._confirmed_end:
            return False
        # In slices: int64 temporaries of a 10M-row index would cost hundreds of MB.
        for lo in range(0, len(rows) - 1, _SLICE):
            hi = min(len(rows), lo + _SLICE + 1)
            o = offsets[lo:hi].astype(np.int64)
            if np.any(o[1:] != o[:-1] + lengths[lo : hi - 1]):
                return False
        if int(offsets[-1]) + int(lengths[-1]) > data_size:
            return False
        return not (
            rows["name"].max(initial=0) >= n_strings or rows["graph"].max(initial=0) >= n_strings
        )

    def _verify(self, rows: np.ndarray) -> np.ndarray | None:
        """The rows (indices) whose records fail their payload CRC; None when a record's
        header disagrees with its row, or the file ends before the rows do.

        Reads the records the rows tile, a block of at most :data:`VERIFY_CHUNK` bytes at
        a time into one buffer, each block checked at once
        (:func:`._fastscan.verify_tiled`); a record larger than a block is checked in
        pieces. Rows are taken :data:`_VERIFY_ROWS` at a time: int64 copies of a 10M-row
        index's columns would cost more memory than the blocks.
        """
        bad: list[np.ndarray] = []
        buf: np.ndarray | None = None
        for lo in range(0, len(rows), _VERIFY_ROWS):
            part = rows[lo : lo + _VERIFY_ROWS]
            offsets = part["offset"].astype(np.int64)
            lengths = part["length"].astype(np.int64)
            ends = offsets + lengths
            i, n = 0, len(part)
            while i < n:
                start = int(offsets[i])
                if lengths[i] > VERIFY_CHUNK:
                    found = self._verify_large(start, int(lengths[i]))
                    if found is None:
                        return None
                    if not found:
                        bad.append(np.array([lo + i], dtype=np.int64))
                    i += 1
                    continue
                # Whole records only, up to VERIFY_CHUNK bytes (a larger one ends the block).
                j = max(i + 1, int(np.searchsorted(ends, start + VERIFY_CHUNK, side="right")))
                span = int(ends[j - 1]) - start
                if buf is None:
                    room = min(VERIFY_CHUNK, int(rows["offset"][-1]) + int(rows["length"][-1]))
                    buf = np.empty(_fastscan.BEFORE + room + _fastscan.AFTER, dtype=np.uint8)
                block = buf[: _fastscan.BEFORE + span + _fastscan.AFTER]
                body = block[_fastscan.BEFORE : _fastscan.BEFORE + span]
                try:
                    got = self._handle.readinto(body.data, start)
                except FileChanged:
                    raise FileReplaced(str(self.path), start, "replaced while read") from None
                if got != span:
                    return None  # shorter than when it was stat'ed: truncated meanwhile
                found_bad = _fastscan.verify_tiled(
                    block, offsets[i:j] - start, lengths[i:j] - OVERHEAD
                )
                if found_bad is None:
                    return None
                if len(found_bad):
                    bad.append(found_bad + lo + i)
                i = j
        return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)

    def _verify_large(self, offset: int, length: int) -> bool | None:
        """Whether the record of ``length`` bytes at ``offset`` is intact (its CRC read in
        pieces); None when its header does not say that length."""
        payload = length - OVERHEAD
        if self.read(offset, HEADER_SIZE) != header(payload):
            return None
        crc = 0
        at, stop = offset + HEADER_SIZE, offset + HEADER_SIZE + payload
        while at < stop:
            piece = self.read(at, min(VERIFY_CHUNK, stop - at))
            if not piece:
                return None
            crc = google_crc32c.extend(crc, piece)
            at += len(piece)
        footer = self.read(stop, 4)
        return len(footer) == 4 and mask(crc) == int.from_bytes(footer, "little")

    # -- the scanning path -----------------------------------------------------------------

    def _scan(self, start: int, size: int, problems: list[Problem], confirm: bool) -> np.ndarray:
        """Index the records in ``[start, size)``; what is wrong with them goes to ``problems``.

        Each chunk is read by :mod:`._fastscan` when it can vouch for it (whole chunks
        whose framing is clean; within them, the records laid out as TensorFlow and
        nanscope write them), and record by record with protobuf otherwise: both give
        the same rows and the same problems, in the same order.
        """
        parts: list[np.ndarray] = []
        local: dict[str, int] = {}  # strings numbered per scan; interned in row order below
        offset = start
        self.torn_at = None
        want = CHUNK
        while offset < size:
            blob = self.read(offset, min(want, size - offset))
            want = CHUNK
            framed = _fastscan.frame(blob) if self.fast else None
            fast = (
                _fastscan.top_level(blob, framed, self._field, self._row_of)
                if framed is not None
                else None
            )
            if framed is not None and fast is not None:
                parts.append(self._fast_chunk(blob, offset, framed, fast, local, problems))
                end, torn = offset + framed.end, framed.torn
            else:
                result = scan(blob, str(self.path), base=offset)
                for err in result.errors:
                    # A record skipped, or bytes skipped to find the next: events lost.
                    problems.append(record_problem(err, incomplete=True))
                out: list[tuple[int, int, RowData]] = []
                for rec in result.records:
                    row = self._careful_record(rec.payload, rec.offset, problems)
                    if row is not None:
                        out.append((rec.offset, len(rec.payload) + OVERHEAD, row))
                parts.append(self._rows(out, local))
                end, torn = result.end, result.torn
            if torn and end == offset:
                if offset + len(blob) >= size:
                    self.torn_at = offset  # the file ends in a partial record
                    break
                # One record larger than a chunk: read exactly that record next.
                want = int.from_bytes(blob[:8], "little") + OVERHEAD
                continue
            offset = end
        rows = np.concatenate(parts) if parts else np.zeros(0, dtype=INDEX_DTYPE)
        self._intern_local(rows, local)
        if confirm:
            # Without a sidecar, what was scanned is final: keep it and resume
            # from its end (a torn tail is read again by the next update).
            self._confirmed.append(rows)
            self._confirmed_end = self.torn_at if self.torn_at is not None else min(offset, size)
            return np.zeros(0, dtype=INDEX_DTYPE)
        return rows

    def _careful_record(
        self, payload: bytes, offset: int, problems: list[Problem]
    ) -> RowData | None:
        """One record decoded with protobuf: its row, or None (not an event of this file)."""
        try:
            event = parse_event(payload)
        except DecodeError as exc:
            problems.append(
                Problem(
                    "error",
                    f"{self.path}: record at byte offset {offset}: {exc}; skipped",
                    incomplete=True,
                    file=str(self.path),
                    offset=offset,
                )
            )
            return None
        if event.WhichOneof("what") != self._field:
            return None
        self.decoded += 1
        damage: list[str] = []
        row = self._row_of(event, damage)
        for what in damage:  # the row is kept: only that output's health is unknown
            problems.append(self._damage(offset, what))
        return row

    def _damage(self, offset: int, what: str) -> Problem:
        """What decoding a record's outputs found wrong: the event is kept (only that
        output's health is unknown), so no event is missing."""
        return Problem(
            "error",
            f"{self.path}: record at byte offset {offset}: {what}",
            file=str(self.path),
            offset=offset,
        )

    def _fast_chunk(
        self,
        blob: bytes,
        base: int,
        framed: _fastscan.Framed,
        fr: _fastscan.FastRows,
        local: dict[str, int],
        problems: list[Problem],
    ) -> np.ndarray:
        """The rows of a chunk whose framing is clean (see :mod:`._fastscan`)."""
        n = len(framed.starts)
        offsets = base + framed.starts - HEADER_SIZE
        distinct = self._rows([(0, 0, row) for row in fr.rows], local)
        picked = distinct[fr.which]
        picked["wall_time"] = fr.wall_time
        picked["step"] = fr.step
        if len(fr.index) == n:  # the common case: every record read in bulk
            rows, keep = picked, None
        else:
            rows = np.zeros(n, dtype=INDEX_DTYPE)
            keep = np.zeros(n, dtype=bool)
            rows[fr.index] = picked
            keep[fr.index] = True
        self.decoded += len(fr.index)
        self.fast_decoded += len(fr.index)
        # Problems in record order, as the careful path says them: the records it reads,
        # and the fast records whose field it would find damaged.
        damaged = [i for i, d in enumerate(fr.damage) if d]
        hurt = fr.index[np.isin(fr.which, damaged)] if damaged else fr.index[:0]
        which_of = dict(zip(fr.index.tolist(), fr.which.tolist(), strict=True)) if damaged else {}
        careful = set(fr.careful.tolist())
        for i in sorted(careful.union(hurt.tolist())):
            offset = int(offsets[i])
            if i in careful:
                a = int(framed.starts[i])
                payload = blob[a : a + int(framed.lengths[i])]
                row = self._careful_record(payload, offset, problems)
                if row is not None:
                    assert keep is not None  # careful records are not in fr.index
                    rows[i] = self._rows([(0, 0, row)], local)[0]
                    keep[i] = True
            else:
                for what in fr.damage[which_of[i]]:
                    problems.append(self._damage(offset, what))
        rows["offset"] = offsets
        rows["length"] = framed.lengths + OVERHEAD
        kept: np.ndarray = rows if keep is None else rows[keep]
        return kept

    @staticmethod
    def _rows(out: list[tuple[int, int, RowData]], local: dict[str, int]) -> np.ndarray:
        """Index rows of ``(offset, length, row)``; strings numbered in ``local``."""
        rows = np.zeros(len(out), dtype=INDEX_DTYPE)
        if not out:
            return rows
        rows["offset"] = [o for o, _, _ in out]
        rows["length"] = [n for _, n, _ in out]
        rows["name"] = [local.setdefault(r[0], len(local)) for _, _, r in out]
        rows["graph"] = [local.setdefault(r[1], len(local)) for _, _, r in out]
        cols = list(zip(*(r[2:] for _, _, r in out), strict=True))
        for name, col in zip(_ROW_COLUMNS, cols, strict=True):
            if name == "size":
                continue
            rows[name] = (
                np.minimum(np.asarray(col, dtype=np.int64), _I32_MAX) if name in _NARROW else col
            )
        return rows

    def _intern_local(self, rows: np.ndarray, local: dict[str, int]) -> None:
        """Replace per-scan string numbers by the table's, interning names then graphs in
        row order (the order in which decoding every record one by one interns them)."""
        if not len(rows):
            return
        strings = list(local)
        remap = np.zeros(len(strings), dtype=np.uint32)
        for column in ("name", "graph"):
            codes, first = np.unique(rows[column], return_index=True)
            for code in codes[np.argsort(first, kind="stable")].tolist():
                remap[code] = self._intern(strings[code])
        rows["name"] = remap[rows["name"]]
        rows["graph"] = remap[rows["graph"]]


# The columns of a RowData after its two strings, in order.
_ROW_COLUMNS = (
    "slot",
    "wall_time",
    "step",
    "sequence",
    "size",
    "neg_inf",
    "pos_inf",
    "nan",
    "nonfinite",
    "phase",
    "device",
)
