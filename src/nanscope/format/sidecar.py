"""The sidecar index next to each circular file: ``<file>.nsidx``.

TensorFlow's reader parses every record to learn anything about a dump.
nanscope's writer also writes, beside ``.execution`` and
``.graph_execution_traces``, one fixed-size row per record: where it is, when
and at which step it ran, and its health counts. A reader can then answer
"which events hold Inf/NaN" or "events i..j" from numpy columns without
decoding records. TensorFlow ignores the extra file.

The sidecar is itself a TFRecord stream (so torn tails and corruption are
detected the same way). Each record is one chunk: a one-byte kind, then

* ``R``: ``n`` rows of :data:`ROW_DTYPE`;
* ``S``: new entries of the chunk's string table, UTF-8, NUL-separated
  (op types, op names, graph ids; row columns ``name`` and ``graph`` index it,
  entry 0 being the empty string).

Readers must treat the sidecar as a hint: a row is trusted only if the record
header at its offset in the data file agrees with its length.
"""

from __future__ import annotations

import numpy as np

ROW_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("length", "<u4"),
        ("name", "<u4"),  # executions: op_type; traces: op_name (string-table index)
        ("graph", "<u4"),  # executions: graph_id; traces: tfdbg_context_id
        ("slot", "<i4"),  # executions: num_outputs; traces: output_slot
        ("wall_time", "<f8"),
        ("step", "<i8"),
        ("sequence", "<i8"),
        ("size", "<i8"),  # elements summed over the summarised outputs; -1 unknown
        ("neg_inf", "<i8"),  # -1 where the mode does not count
        ("pos_inf", "<i8"),
        ("nan", "<i8"),
        ("nonfinite", "i1"),  # 1 yes, 0 no, -1 the mode does not tell
        ("phase", "i1"),
        ("device", "<i2"),
    ]
)

KIND_ROWS = b"R"
KIND_STRINGS = b"S"


def rows_chunk(rows: np.ndarray) -> bytes:
    return KIND_ROWS + np.ascontiguousarray(rows, dtype=ROW_DTYPE).tobytes()


# Rows per chunk: a reader then needs at most one chunk's bytes (5.5 MB) beside its index.
ROWS_PER_CHUNK = 65536


def rows_chunks(rows: np.ndarray) -> list[bytes]:
    """``rows`` as chunks of at most :data:`ROWS_PER_CHUNK` rows (at least one chunk)."""
    if len(rows) <= ROWS_PER_CHUNK:
        return [rows_chunk(rows)]
    return [rows_chunk(rows[i : i + ROWS_PER_CHUNK]) for i in range(0, len(rows), ROWS_PER_CHUNK)]


def strings_chunk(strings: list[str]) -> bytes:
    return KIND_STRINGS + "\0".join(strings).encode()


def decode_chunk(payload: bytes | memoryview) -> tuple[np.ndarray | None, list[str] | None]:
    """``(rows, None)`` or ``(None, strings)``; raises ``ValueError`` on a malformed chunk."""
    kind = bytes(payload[:1])
    if kind == KIND_ROWS:
        if (len(payload) - 1) % ROW_DTYPE.itemsize:
            raise ValueError("row chunk size is not a multiple of the row size")
        # A read-only view of the chunk's bytes, no copy.
        return np.frombuffer(payload, dtype=ROW_DTYPE, offset=1), None
    if kind == KIND_STRINGS:
        return None, bytes(payload[1:]).decode("utf-8", errors="replace").split("\0")
    raise ValueError(f"unknown sidecar chunk kind {kind!r}")
