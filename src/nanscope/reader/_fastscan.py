"""Indexing the records of a chunk without decoding each one in Python.

A dump without a sidecar (TensorFlow's own) is indexed from its records. Decoding
every ``DebugEvent`` with protobuf costs about 20 µs a record; this module does the
same work in bulk:

* the TFRecord framing is walked with one tight loop over the length fields, and
  the payload CRCs are checked with one call each, compared with numpy;
* the top level of each ``DebugEvent`` (``wall_time``, ``step`` and the one
  ``execution`` / ``graph_execution_trace`` field) is decoded with numpy over all
  records at once;
* that field's bytes (op type or name, graph id, output slot, mode, the summary)
  repeat from step to step, so each *distinct* field is decoded once, by the very
  functions the careful path uses, and its row shared by every record that holds it.

Only what this module can vouch for is indexed here: a chunk with a framing error
(a bad CRC, a torn record that is not the file's tail) is handed back whole, and a
record laid out in any other way than ``[wall_time] [step] field`` (fields out of
order, repeated, unknown) is named for the careful path, one record at a time.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import google_crc32c
import numpy as np

from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import (
    FOOTER_SIZE,
    HEADER_SIZE,
    MAX_RECORD_SIZE,
    OVERHEAD,
    masked_crc32c,
)
from nanscope.reader._decode import DecodeError, RowData, parse_event

_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
_LENGTH_CRCS: dict[int, int] = {}  # record lengths repeat: their length CRCs too
_PAD = 16  # zeros after the chunk, so that gathers near its end stay inside the buffer
_MASK_DELTA = np.uint32(0xA282EAD8)

# Tags of the DebugEvent fields the fast path accepts (field number << 3 | wire type).
_WALL_TIME_TAG = (1 << 3) | 1  # fixed64
_STEP_TAG = (2 << 3) | 0  # varint
FIELD_TAGS = {"execution": (9 << 3) | 2, "graph_execution_trace": (10 << 3) | 2}


def _crc_table() -> np.ndarray:
    """CRC-32C's byte table (reflected polynomial 0x82F63B78)."""
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> np.uint32(1)) ^ np.uint32(0x82F63B78), t >> np.uint32(1))
    return t.astype(np.uint32)


_CRC_TABLE = _crc_table()


def _prefix_crcs(buf: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """CRC-32C of the ``length[i]`` bytes at ``start[i]`` for each i (short runs), in numpy."""
    out = np.empty(len(start), dtype=np.uint32)
    # By length (a dump's prefixes have one or two): no masking inside the loop.
    for n in np.unique(length).tolist():
        group = np.flatnonzero(length == n)
        at = start[group]
        state = np.full(len(group), 0xFFFFFFFF, dtype=np.uint32)
        for j in range(n):
            state = _CRC_TABLE[(state ^ buf[at + j]) & np.uint32(0xFF)] ^ (state >> np.uint32(8))
        out[group] = state ^ np.uint32(0xFFFFFFFF)
    return out


def _length_crc(length: int) -> int:
    crc = _LENGTH_CRCS.get(length)
    if crc is None:
        crc = masked_crc32c(length.to_bytes(8, "little"))
        if len(_LENGTH_CRCS) < 65536:
            _LENGTH_CRCS[length] = crc
    return crc


@dataclass
class Framed:
    """The complete records of a chunk: payload starts and lengths (chunk positions)."""

    starts: np.ndarray  # int64, where each payload starts
    lengths: np.ndarray  # int64, each payload's length
    end: int  # where the next chunk starts: after the last complete record
    torn: bool  # the chunk ends inside a record


def frame(blob: bytes) -> Framed | None:
    """Walk the records of ``blob``; None when a record's header is damaged.

    What a clean chunk yields is what :func:`nanscope.format.records.scan` yields
    for it; anything it would report as an error is left to it. The payloads' CRCs
    are checked by :func:`top_level`, which slices the payloads anyway.
    """
    size = len(blob)
    last = size - HEADER_SIZE
    buf = np.frombuffer(blob, dtype=np.uint8)
    s, pos = _walk(blob, buf)
    if pos <= last:
        # The record that does not fit: a torn tail only if its header is sound.
        length, length_crc = _HEADER.unpack_from(blob, pos)
        if length > MAX_RECORD_SIZE or _length_crc(length) != length_crc:
            return None
    if not len(s):
        return Framed(s, s, pos, pos < size)
    lengths = _at(buf, s, "<u8")
    if np.any(lengths > MAX_RECORD_SIZE):
        return None
    stored = _at(buf, s + 8, "<u4")
    sizes, which = np.unique(lengths, return_inverse=True)
    expected = np.array([_length_crc(int(n)) for n in sizes.tolist()], dtype=np.uint32)
    if np.any(expected[which] != stored):
        return None
    n = lengths.astype(np.int64)
    first = s + HEADER_SIZE
    return Framed(first, n, pos, pos < size)


_PROBE = 4096  # records walked one by one before guessing a period
_SPECULATE = 1 << 18  # records predicted at once from a period


def _walk(blob: bytes, buf: np.ndarray) -> tuple[np.ndarray, int]:
    """Where each complete record of ``blob`` starts, and where the walk stopped.

    The next record's position depends on this one's length, so the walk is a loop;
    but the lengths of a dump's records repeat with the graph (the same ops, the same
    summaries, one call after another). After ``_PROBE`` records walked one by one,
    the smallest period of their lengths predicts the positions of the next ones, and
    numpy checks every prediction against the length stored there: the records up to
    the first wrong guess are exactly those the loop would have found (each one's
    length was read where the previous one ends), and the loop resumes there.
    """
    size = len(blob)
    last = size - HEADER_SIZE
    unpack = _LENGTH.unpack_from
    parts: list[np.ndarray] = []
    pos = 0
    while pos <= last:
        starts: list[int] = []
        lengths: list[int] = []
        while pos <= last and len(starts) < _PROBE:
            length = unpack(blob, pos)[0]
            end = pos + OVERHEAD + length
            if end > size:
                break
            starts.append(pos)
            lengths.append(length)
            pos = end
        parts.append(np.asarray(starts, dtype=np.int64))
        if len(starts) < _PROBE:
            break  # the end of the chunk, or a record that does not fit in it
        walked = np.asarray(lengths, dtype=np.int64)
        period = _period(walked)
        if period is None:
            continue
        pattern = walked[-period:] + OVERHEAD
        count = min(_SPECULATE, (size - pos) // int(pattern.min()))
        sizes = np.tile(pattern, -(-count // period))[:count]
        ends = pos + np.cumsum(sizes)
        fit = int(np.searchsorted(ends, size, side="right"))
        ends, sizes = ends[:fit], sizes[:fit]
        guess = ends - sizes
        stored = _at(buf, guess, "<u8").astype(np.int64)
        wrong = np.flatnonzero(stored != sizes - OVERHEAD)
        good = int(wrong[0]) if len(wrong) else len(guess)
        if good:
            parts.append(guess[:good])
            pos = int(ends[good - 1])
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), pos


def _period(lengths: np.ndarray) -> int | None:
    """The smallest period of ``lengths`` (at most half of them), or None."""
    half = len(lengths) // 2
    for p in (np.flatnonzero(lengths[1 : half + 1] == lengths[0]) + 1).tolist():
        if np.array_equal(lengths[p:], lengths[:-p]):
            return int(p)
    return None


def _at(buf: np.ndarray, at: np.ndarray, dtype: str) -> np.ndarray:
    """The little-endian values of ``dtype`` that start at the byte positions ``at``.

    One gather through a view with a stride of one byte (every byte position is the
    start of a value), instead of a row of ``itemsize`` byte gathers per position.
    """
    width = np.dtype(dtype).itemsize
    view = np.ndarray((len(buf) - width + 1,), dtype=dtype, buffer=buf, strides=(1,))
    values: np.ndarray = view[at]
    return values


def _varints(buf: np.ndarray, pos: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The varints at ``pos``: (value as uint64, bytes taken; 0 where not a varint of ``width``)."""
    # Most are one or two bytes (lengths under 16 KiB, small steps): those without a gather
    # of ``width`` bytes each.
    b0 = buf[pos].astype(np.uint64)
    b1 = buf[pos + 1].astype(np.uint64)
    value = np.where(b0 < 0x80, b0, (b0 & np.uint64(0x7F)) | (b1 << np.uint64(7)))
    taken = np.where(b0 < 0x80, 1, np.where(b1 < 0x80, 2, 0))
    long = np.flatnonzero(taken == 0)
    if len(long):
        value[long], taken[long] = _long_varints(buf, pos[long], width)
    return value, taken


def _long_varints(buf: np.ndarray, pos: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_varints` for any length, one gather of ``width`` bytes each."""
    b = buf[pos[:, None] + np.arange(width)]
    more = b >= 0x80
    taken = np.argmin(more, axis=1) + 1
    taken[more.all(axis=1)] = 0
    if width == 10:
        # The tenth byte holds bit 63 only; more is not an int64 the fast path vouches for.
        taken[(taken == 10) & (b[:, 9] > 1)] = 0
    shifts = (7 * np.arange(width)).astype(np.uint64)
    parts = (b & 0x7F).astype(np.uint64) << shifts
    parts[np.arange(width) >= taken[:, None]] = 0
    return parts.sum(axis=1, dtype=np.uint64), taken


@dataclass
class FastRows:
    """Rows of the records the fast path read, and the records left to the careful path."""

    index: np.ndarray  # int64: which of the chunk's records each fast row is
    rows: list[RowData]  # one row per distinct field, ``wall_time`` and ``step`` 0
    damage: list[list[str]]  # what the careful path would say of each distinct field
    which: np.ndarray  # int64: the distinct field of each fast row
    wall_time: np.ndarray  # float64, per fast row (0.0 for NaN or an infinity)
    step: np.ndarray  # int64, per fast row
    careful: np.ndarray  # int64: records for the careful path, in order


def top_level(
    blob: bytes,
    framed: Framed,
    field: str,
    row_of: Callable[[pb.DebugEvent, list[str]], RowData],
) -> FastRows | None:
    """Decode the records of ``framed`` in bulk (see the module docstring); None when a
    payload's CRC is wrong."""
    buf = np.frombuffer(blob + bytes(_PAD + 10), dtype=np.uint8)
    start, length = framed.starts, framed.lengths
    end = start + length
    n = len(start)
    pos = start.copy()
    # [09 wall_time:8]
    has_time = (length >= 9) & (buf[pos] == _WALL_TIME_TAG)
    times = np.zeros(n, dtype=np.float64)
    if has_time.any():
        times[has_time] = _at(buf, pos[has_time] + 1, "<f8")
    pos += 9 * has_time
    # [10 step:varint]
    has_step = (pos < end) & (buf[pos] == _STEP_TAG)
    steps = np.zeros(n, dtype=np.uint64)
    ok = np.ones(n, dtype=bool)
    if has_step.any():
        value, taken = _varints(buf, pos[has_step] + 1, 10)
        steps[has_step] = value
        ok[has_step] = taken > 0
        pos[has_step] += 1 + taken
    # [tag len:varint field], ending exactly at the record's end
    tag = FIELD_TAGS[field]
    ok &= (pos < end) & (buf[pos] == tag)
    sub_len, taken = _varints(buf, pos + 1, 5)
    sub_start = pos + 1 + taken
    ok &= (taken > 0) & (sub_start + sub_len.astype(np.int64) == end)
    fast = np.flatnonzero(ok)
    careful = np.flatnonzero(~ok)
    # Each distinct field decoded once: the key is the field's bytes, tag and length included.
    keys = [blob[a:b] for a, b in zip(pos[fast].tolist(), end[fast].tolist(), strict=True)]
    # The payload CRCs: a record in the fast layout is [prefix][key], and the key is sliced
    # for the dictionary anyway, so its CRC continues the prefix's (computed in numpy).
    crcs = np.empty(n, dtype=np.uint32)
    prefix = _prefix_crcs(buf, start[fast], pos[fast] - start[fast])
    extend = google_crc32c.extend
    crcs[fast] = [extend(c, k) for c, k in zip(prefix.tolist(), keys, strict=True)]
    if len(careful):
        value = google_crc32c.value
        crcs[careful] = [
            value(blob[a:b])
            for a, b in zip(start[careful].tolist(), end[careful].tolist(), strict=True)
        ]
    masked = ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + _MASK_DELTA
    if np.any(masked != _at(buf, end, "<u4")):
        return None  # a damaged record: the chunk goes the careful way
    distinct = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    which = np.array([distinct[key] for key in keys], dtype=np.int64)
    rows: list[RowData] = []
    damage: list[list[str]] = []
    refused = np.zeros(len(distinct), dtype=bool)
    for i, key in enumerate(distinct):
        try:
            event = parse_event(key)
        except DecodeError:
            refused[i] = True  # the careful path says why, record by record
            rows.append(("", "", 0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
            damage.append([])
            continue
        found: list[str] = []
        rows.append(row_of(event, found))
        damage.append(found)
    if refused.any():
        bad = refused[which]
        careful = np.sort(np.concatenate([careful, fast[bad]]))
        fast, which = fast[~bad], which[~bad]
    times = times[fast]
    times[~np.isfinite(times)] = 0.0
    return FastRows(
        index=fast,
        rows=rows,
        damage=damage,
        which=which,
        wall_time=times,
        step=steps[fast].view(np.int64),
        careful=careful,
    )


# -- checking the records that a sidecar index points at -------------------------------------
#
# A sidecar's rows say where each record is, so its CRCs can be checked without walking the
# framing; but each record has a CRC of its own, and one call of google-crc32c per record
# (with the slice it needs) costs as much as reading the index. CRC-32C is affine over
# GF(2), which lets one call over a whole block check every record in it (verify_tiled).

_POLY = 0x82F63B78  # CRC-32C's polynomial, reflected
_X0 = 1 << 31  # the polynomial 1 in the reflected representation


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo CRC-32C's polynomial, reflected (zlib's ``multmodp``)."""
    if not a:
        return 0
    m, p = _X0, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table = [_X0 >> 1]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()  # x^(2^k) modulo the polynomial
_ZEROS_CRCS: dict[int, int] = {}


def zeros_crc(n: int) -> int:
    """The CRC-32C of ``n`` zero bytes (``google_crc32c.value(bytes(n))``), in a few
    microseconds whatever ``n``: the register ``0xFFFFFFFF`` times ``x^(8n)``, inverted."""
    crc = _ZEROS_CRCS.get(n)
    if crc is None:
        p, k, e = _X0, 3, n  # x^(8n) = x^(n * 2^3)
        while e:
            if e & 1:
                p = _multmodp(_X2N[k & 31], p)
            e >>= 1
            k += 1
        crc = _multmodp(p, 0xFFFFFFFF) ^ 0xFFFFFFFF
        if len(_ZEROS_CRCS) < 65536:
            _ZEROS_CRCS[n] = crc
    return crc


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for non-negative integers; for small
    ones (record lengths) a table instead of a sort."""
    top = int(values.max(initial=0))
    if top >= 1 << 20 or len(values) < 64:
        sizes, which = np.unique(values, return_inverse=True)
        return sizes, which.reshape(-1)
    present = np.zeros(top + 1, dtype=bool)
    present[values] = True
    sizes = np.flatnonzero(present)
    lookup = np.zeros(top + 1, dtype=np.int64)
    lookup[sizes] = np.arange(len(sizes))
    return sizes, lookup[values]


# verify_tiled's buffer: room for a footer before the first record and a header after the
# last, so that each record boundary is one 16-byte window (a footer, then a header).
BEFORE = FOOTER_SIZE
AFTER = HEADER_SIZE
_WINDOW = np.dtype("V16")  # gathered and scattered whole, read as four uint32 words


def verify_tiled(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """Which records of ``buf`` fail their payload CRC (indices into ``starts``, in order);
    None when a record's header does not say the length ``lengths`` gives it.

    ``buf`` (writable uint8, changed here) holds records back to back from
    :data:`BEFORE` on, and :data:`AFTER` more bytes after them: record ``i`` starts at
    ``BEFORE + starts[i]`` and holds a payload of ``lengths[i]`` bytes.

    The length fields and their CRCs are compared with numpy. The payloads are checked
    with one CRC over the whole of ``buf``: with ``F(s, d)`` the CRC register after the
    bytes ``d`` from the state ``s``, an intact ``payload + its CRC`` (unmasked) takes
    any ``s`` to ``A(s) ^ C``, where ``A`` depends on the length alone and ``C`` is the
    CRC's constant residue. So the records, footers unmasked, end in the same register
    as records whose payloads are zeros followed by the CRC of that many zeros; by
    linearity, the two XORed (the headers zeroed, each payload as it is, each footer its
    CRC XOR the zeros' CRC) have the CRC of as many zero bytes. Damage confined to one
    record changes that CRC exactly when it changes the record's own check (``x`` is
    invertible modulo the polynomial); damage in several records could cancel out with
    odds of 2^-32 (decoding an event checks its record again). A block that fails is
    checked record by record, which tells which records are damaged.
    """
    n = len(starts)
    if not n:
        return np.zeros(0, dtype=np.int64)
    width = len(buf)
    windows = np.ndarray((width - _WINDOW.itemsize + 1,), dtype=_WINDOW, buffer=buf, strides=(1,))
    # Window i: the footer of record i - 1 (of the room before, for i = 0) and the header of
    # record i (of the room after, for i = n); as words: footer, length (two), length CRC.
    at = np.empty(n + 1, dtype=np.int64)
    at[:n] = starts
    at[n] = starts[-1] + OVERHEAD + lengths[-1]
    old = windows[at]
    words = old.view("<u4").reshape(n + 1, 4)
    stated = words[:n, 1].astype(np.uint64) | (words[:n, 2].astype(np.uint64) << np.uint64(32))
    if np.any(stated != lengths.astype(np.uint64)):
        return None
    sizes, which = _distinct(lengths)
    length_crcs = np.array([_length_crc(int(k)) for k in sizes.tolist()], dtype=np.uint32)
    if np.any(words[:n, 3] != length_crcs[which]):
        return None
    r = words[1:, 0] - _MASK_DELTA
    crcs = (r << np.uint32(15)) | (r >> np.uint32(17))  # the payload CRCs, unmasked
    zeros = np.array([zeros_crc(int(k)) for k in sizes.tolist()], dtype=np.uint32)
    new = np.zeros((n + 1, 4), dtype="<u4")
    new[1:, 0] = crcs ^ zeros[which]
    windows[at] = new.view(_WINDOW).reshape(n + 1)
    if google_crc32c.value(buf) == zeros_crc(width):
        return np.zeros(0, dtype=np.int64)
    # Some record is damaged: put the bytes back and find which.
    windows[at] = old
    value = google_crc32c.value
    first = BEFORE + starts + HEADER_SIZE
    bad = [
        i
        for i, (a, b, c) in enumerate(
            zip(first.tolist(), (first + lengths).tolist(), crcs.tolist(), strict=True)
        )
        if value(buf[a:b]) != c
    ]
    return np.asarray(bad, dtype=np.int64)


__all__ = [
    "AFTER",
    "BEFORE",
    "FIELD_TAGS",
    "FastRows",
    "Framed",
    "frame",
    "parse_event",
    "top_level",
    "verify_tiled",
    "zeros_crc",
]
