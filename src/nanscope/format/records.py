"""TFRecord framing with masked CRC32C, the container of every tfdbg2 file.

A record is ``uint64 length | uint32 masked_crc(length bytes) | payload |
uint32 masked_crc(payload)``, all little-endian, with no file header. This
module frames payloads for the writer and walks records for the reader; it
knows nothing about what the payloads hold.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
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


def masked_crc32c(data: bytes | memoryview) -> int:
    """The CRC32C of ``data``, masked the way TFRecord stores it."""
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


def frame(payload: bytes) -> bytes:
    """One complete record holding ``payload``."""
    length = _LEN.pack(len(payload))
    return b"".join(
        (length, _CRC.pack(masked_crc32c(length)), payload, _CRC.pack(masked_crc32c(payload)))
    )


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
    payload: memoryview


@dataclass
class ScanResult:
    """What one pass over a byte range found.

    ``end`` is where the next pass should resume: the end of the last complete
    record. A torn tail (a record still being written) is not an error; it is
    reported through ``torn`` and read again by the next pass.
    """

    records: list[Record]
    end: int
    torn: bool
    error: RecordError | None


def scan(
    data: bytes | memoryview,
    path: str,
    start: int = 0,
    limit: int | None = None,
    verify_payload: bool = True,
) -> ScanResult:
    """Walk the records of ``data`` from ``start``.

    Stops at the first corrupt record (bad length CRC, bad payload CRC, or an
    absurd length) and returns it as ``error``, together with every good record
    before it. Stops quietly at a record that runs past the end of the data.
    ``limit`` caps the number of records returned in one call.
    """
    view = memoryview(data)
    size = len(view)
    records: list[Record] = []
    offset = start
    unpack_header = _HEADER.unpack_from
    unpack_crc = _CRC.unpack_from
    crc = masked_crc32c
    while offset < size:
        if limit is not None and len(records) >= limit:
            return ScanResult(records, offset, False, None)
        if offset + HEADER_SIZE > size:
            return ScanResult(records, offset, True, None)
        length, length_crc = unpack_header(view, offset)
        if crc(view[offset : offset + 8]) != length_crc:
            return ScanResult(records, offset, False, RecordError(path, offset, "bad length CRC"))
        if length > MAX_RECORD_SIZE:
            return ScanResult(
                records, offset, False, RecordError(path, offset, f"record length {length} is absurd")
            )
        body = offset + HEADER_SIZE
        end = body + length + FOOTER_SIZE
        if end > size:
            return ScanResult(records, offset, True, None)
        payload = view[body : body + length]
        if verify_payload and crc(payload) != unpack_crc(view, body + length)[0]:
            return ScanResult(records, offset, False, RecordError(path, offset, "bad payload CRC"))
        records.append(Record(offset, payload))
        offset = end
    return ScanResult(records, offset, False, None)


def read_at(data: bytes | memoryview, path: str, offset: int) -> memoryview:
    """The verified payload of the record at ``offset``; raises :class:`RecordError`."""
    result = scan(data, path, offset, limit=1)
    if result.records:
        return result.records[0].payload
    if result.error is not None:
        raise result.error
    raise RecordError(path, offset, "no complete record at this offset (truncated file?)")


def iter_payloads(data: bytes | memoryview, path: str) -> Iterator[memoryview]:
    """Every payload in ``data``; raises :class:`RecordError` at the first corrupt one."""
    result = scan(data, path)
    for record in result.records:
        yield record.payload
    if result.error is not None:
        raise result.error
