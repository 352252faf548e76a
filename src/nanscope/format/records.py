"""TFRecord framing with masked CRC32C, the container of every tfdbg2 file.

A record is ``uint64 length | uint32 masked_crc(length bytes) | payload |
uint32 masked_crc(payload)``, all little-endian, with no file header. This
module frames payloads for the writer and walks records for the reader; it
knows nothing about what the payloads hold.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import google_crc32c

HEADER_SIZE = 12
FOOTER_SIZE = 4
OVERHEAD = HEADER_SIZE + FOOTER_SIZE
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LEN = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")

# Records above this size are treated as corrupt instead of being allocated:
# a flipped bit in a length field must not make the reader ask for terabytes.
MAX_RECORD_SIZE = 1 << 31


def mask(crc: int) -> int:
    """A CRC32C masked the way TFRecord stores it."""
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def masked_crc32c(data: bytes) -> int:
    """The CRC32C of ``data``, masked the way TFRecord stores it."""
    crc: int = google_crc32c.value(data)
    return mask(crc)


_HEADERS: dict[int, bytes] = {}


def _header(n: int) -> bytes:
    header = _HEADERS.get(n)
    if header is None:
        length = _LEN.pack(n)
        header = length + _CRC.pack(masked_crc32c(length))
        if len(_HEADERS) < 65536:  # record sizes repeat: cache their headers
            _HEADERS[n] = header
    return header


def header(length: int) -> bytes:
    """The 12 bytes that start a record holding a payload of ``length`` bytes."""
    return _header(length)


def frame(payload: bytes) -> bytes:
    """One complete record holding ``payload``."""
    return b"".join((_header(len(payload)), payload, _CRC.pack(masked_crc32c(payload))))


class RecordError(Exception):
    """A record that cannot be read: where it is and what is wrong with it."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt record at byte offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True)
class Record:
    """A payload and where its record starts in the file."""

    offset: int
    payload: bytes


@dataclass
class ScanResult:
    """What one pass over a byte range found.

    ``end`` is where the next pass should resume: the end of the last complete
    record, or the start of a torn tail (a record still being written, which is
    not an error and is read again by the next pass; ``torn`` says so).
    Corrupt records are skipped and listed in ``errors``; when a corrupt length
    makes the next record's position unknown, the scan searches forward for a
    valid record header (at most ``resync_limit`` bytes) and says how many bytes
    it skipped.
    """

    records: list[Record]
    end: int
    torn: bool
    errors: list[RecordError]


def _find_header(view: bytes, start: int, stop: int) -> int:
    """The first offset in ``[start, stop)`` where a record header's length CRC checks out."""
    unpack_header = _HEADER.unpack_from
    for pos in range(start, min(stop, len(view) - HEADER_SIZE + 1)):
        length, length_crc = unpack_header(view, pos)
        if length <= MAX_RECORD_SIZE and masked_crc32c(view[pos : pos + 8]) == length_crc:
            return pos
    return -1


def scan(
    data: bytes | memoryview,
    path: str,
    start: int = 0,
    limit: int | None = None,
    verify_payload: bool = True,
    base: int = 0,
    resync_limit: int = 1 << 20,
) -> ScanResult:
    """Walk the records of ``data`` from ``start``.

    Offsets in the result are ``base + position in data`` (so a caller can scan
    a chunk read from the middle of a file). ``limit`` caps the number of
    records returned in one call.
    """
    # google-crc32c wants bytes, not memoryviews; slicing bytes copies, which
    # costs less than the conversion would.
    view = data if isinstance(data, bytes) else bytes(data)
    size = len(view)
    records: list[Record] = []
    errors: list[RecordError] = []
    offset = start
    unpack_header = _HEADER.unpack_from
    unpack_crc = _CRC.unpack_from
    crc = masked_crc32c
    while offset < size:
        if limit is not None and len(records) >= limit:
            return ScanResult(records, base + offset, False, errors)
        if offset + HEADER_SIZE > size:
            return ScanResult(records, base + offset, True, errors)
        length, length_crc = unpack_header(view, offset)
        if length > MAX_RECORD_SIZE or crc(view[offset : offset + 8]) != length_crc:
            found = _find_header(view, offset + 1, offset + 1 + resync_limit)
            reason = "bad length CRC" if length <= MAX_RECORD_SIZE else f"absurd length {length}"
            if found < 0:
                errors.append(
                    RecordError(path, base + offset, f"{reason}; no valid record follows")
                )
                return ScanResult(records, base + size, False, errors)
            errors.append(
                RecordError(path, base + offset, f"{reason}; skipped {found - offset} bytes")
            )
            offset = found
            continue
        body = offset + HEADER_SIZE
        end = body + length + FOOTER_SIZE
        if end > size:
            return ScanResult(records, base + offset, True, errors)
        payload = view[body : body + length]
        if verify_payload and crc(payload) != unpack_crc(view, body + length)[0]:
            errors.append(RecordError(path, base + offset, "bad payload CRC; record skipped"))
        else:
            records.append(Record(base + offset, payload))
        offset = end
    return ScanResult(records, base + offset, False, errors)


def read_one(fd: int, offset: int, size: int) -> tuple[bytes, int] | None:
    """The payload of the intact record at ``offset`` of an open file of ``size`` bytes, and
    where the next one starts; None for anything else (torn, damaged: scan to tell which).

    Reads the payload alone into its own bytes: checking its CRC then copies nothing,
    where scanning a block copies each payload out of it (for large sidecar chunks, the
    copy costs as much as reading).
    """
    if offset + HEADER_SIZE > size:
        return None
    head = os.pread(fd, HEADER_SIZE, offset)
    if len(head) < HEADER_SIZE:
        return None
    length, length_crc = _HEADER.unpack(head)
    end = offset + HEADER_SIZE + length + FOOTER_SIZE
    if length > MAX_RECORD_SIZE or end > size or masked_crc32c(head[:8]) != length_crc:
        return None
    payload = os.pread(fd, length, offset + HEADER_SIZE)
    footer = os.pread(fd, FOOTER_SIZE, offset + HEADER_SIZE + length)
    if len(payload) != length or len(footer) != FOOTER_SIZE:
        return None
    if masked_crc32c(payload) != _CRC.unpack(footer)[0]:
        return None
    return payload, end
