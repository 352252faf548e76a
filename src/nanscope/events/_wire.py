"""A small protobuf wire encoder for the two hot event kinds.

Building a protobuf message object per event costs several microseconds in
Python; most of an execution or trace record is the same from one call of an
op to the next (its type, graph, stack, module path). The writer therefore
encodes these records by hand from cached byte strings, and only the parts
that change (time, ids, summary bytes) are encoded per event. Fields are
emitted in field-number order, so the bytes equal what ``SerializeToString``
produces for the same message (a test holds this).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_DOUBLE = struct.Struct("<d")

# Wire types.
VARINT = 0
FIXED64 = 1
LEN = 2


def _encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Most varints on the hot path (lengths, ids, slots, tags) are small: look them up.
_SMALL = [_encode_varint(v) for v in range(1 << 14)]


def varint(value: int) -> bytes:
    """Base-128 varint; negative numbers use 10 bytes, as int64 fields do."""
    if 0 <= value < 16384:
        return _SMALL[value]
    if 0 <= value < 1 << 28:  # sequence numbers, offsets: four bytes at most
        if value < 1 << 21:
            return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
        return bytes(
            (
                (value & 0x7F) | 0x80,
                ((value >> 7) & 0x7F) | 0x80,
                ((value >> 14) & 0x7F) | 0x80,
                value >> 21,
            )
        )
    return _encode_varint(value)


def tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


_tag = tag


def len_field(field: int, payload: bytes) -> bytes:
    return _tag(field, LEN) + varint(len(payload)) + payload


def str_field(field: int, value: str) -> bytes:
    """A string field; empty strings are omitted, as proto3 does."""
    return len_field(field, value.encode()) if value else b""


def int_field(field: int, value: int) -> bytes:
    """A varint field (int32/int64/enum); zero is omitted, as proto3 does."""
    return tag(field, VARINT) + varint(value) if value else b""


def double_field(field: int, value: float) -> bytes:
    return tag(field, FIXED64) + _DOUBLE.pack(value) if value else b""


def repeated_str(field: int, values: Sequence[str]) -> bytes:
    prefix = tag(field, LEN)
    return b"".join(prefix + varint(len(b)) + b for b in (v.encode() for v in values))
