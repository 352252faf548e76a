"""Tensor debug modes and the layout of their float64 summary vectors.

The layouts are those of TensorFlow's ``DebugNumericSummaryV2``, so a summary
written by nanscope means the same thing to TensorBoard and vice versa:

* CURT_HEALTH ``[tensor_id, any_nonfinite]``
* CONCISE_HEALTH ``[tensor_id, size, -inf, +inf, nan]``
* FULL_HEALTH ``[tensor_id, device_id, dtype, rank, size, -inf, +inf, nan,
  neg_finite, zero, pos_finite]``
* SHAPE ``[tensor_id, dtype, rank, size, dim0..dim5]`` (the last six dims when
  rank > 6)
* REDUCE_INF_NAN_THREE_SLOTS ``[-inf or 0, +inf or 0, nan or 0]``
"""

from __future__ import annotations

import enum

import numpy as np

from nanscope.format.tensors import MAX_RANK


class TensorDebugMode(enum.IntEnum):
    """The tfdbg2 ``TensorDebugMode`` enum, with TensorFlow's numbers."""

    UNSPECIFIED = 0
    NO_TENSOR = 1
    CURT_HEALTH = 2
    CONCISE_HEALTH = 3
    FULL_HEALTH = 4
    SHAPE = 5
    FULL_NUMERICS = 6
    FULL_TENSOR = 7
    REDUCE_INF_NAN_THREE_SLOTS = 8


# Modes that a user may ask a writer for (TensorFlow accepts the same set).
WRITABLE_MODES = (
    TensorDebugMode.NO_TENSOR,
    TensorDebugMode.CURT_HEALTH,
    TensorDebugMode.CONCISE_HEALTH,
    TensorDebugMode.FULL_HEALTH,
    TensorDebugMode.SHAPE,
    TensorDebugMode.FULL_TENSOR,
)
HEALTH_MODES = (
    TensorDebugMode.CURT_HEALTH,
    TensorDebugMode.CONCISE_HEALTH,
    TensorDebugMode.FULL_HEALTH,
    TensorDebugMode.REDUCE_INF_NAN_THREE_SLOTS,
)

# Summary vector widths per mode (FULL_TENSOR writes whole values, NO_TENSOR nothing).
SUMMARY_LENGTH = {
    TensorDebugMode.CURT_HEALTH: 2,
    TensorDebugMode.CONCISE_HEALTH: 5,
    TensorDebugMode.FULL_HEALTH: 11,
    TensorDebugMode.SHAPE: 10,
    TensorDebugMode.REDUCE_INF_NAN_THREE_SLOTS: 3,
}

SHAPE_SLOTS = 6


def parse_mode(value: str | int | TensorDebugMode) -> TensorDebugMode:
    """A writable mode from its name (any case) or number; a clear ``ValueError`` otherwise."""
    try:
        if isinstance(value, str):
            mode = TensorDebugMode[value.strip().upper()]
        else:
            mode = TensorDebugMode(int(value))
    except (KeyError, ValueError):
        names = ", ".join(m.name for m in WRITABLE_MODES)
        raise ValueError(f"unknown tensor debug mode {value!r}; use one of: {names}") from None
    if mode not in WRITABLE_MODES:
        names = ", ".join(m.name for m in WRITABLE_MODES)
        raise ValueError(f"tensor debug mode {mode.name} cannot be written; use one of: {names}")
    return mode


# The largest count or size a summary may state: float64 holds integers exactly up to here.
MAX_COUNT = 2**53


def shape_from_summary(vector: np.ndarray) -> tuple[int | None, ...]:
    """The shape stored in a SHAPE summary; ``None`` for dims truncated off the head.

    Raises ``ValueError`` for a vector too short, a rank outside ``0..MAX_RANK`` or a
    dimension that is not a finite count up to ``MAX_COUNT`` (NaN, infinite, negative):
    the rank sizes the tuple, so it must not be taken on trust.
    """
    if len(vector) < 4:
        raise ValueError(f"a SHAPE summary has at least 4 slots, this one {len(vector)}")
    rank = float(vector[2])
    if not 0 <= rank <= MAX_RANK:
        raise ValueError(f"a SHAPE summary's rank is {rank:g} (0..{MAX_RANK})")
    slots = [float(d) for d in vector[4 : 4 + min(int(rank), SHAPE_SLOTS)]]
    if not all(0 <= d <= MAX_COUNT for d in slots):
        raise ValueError("a SHAPE summary holds a dimension that is not a count")
    return (None,) * max(0, int(rank) - SHAPE_SLOTS) + tuple(int(d) for d in slots)
