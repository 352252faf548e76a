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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


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


@dataclass(frozen=True)
class Health:
    """What a summary says about non-finite values; ``None`` where the mode does not tell."""

    size: int | None = None
    neg_inf: int | None = None
    pos_inf: int | None = None
    nan: int | None = None
    neg: int | None = None
    zero: int | None = None
    pos: int | None = None
    # True/False when the mode tells whether any element is non-finite.
    any_nonfinite: bool | None = None

    @property
    def has_inf(self) -> bool | None:
        if self.neg_inf is None or self.pos_inf is None:
            return None
        return (self.neg_inf + self.pos_inf) > 0

    @property
    def has_nan(self) -> bool | None:
        return None if self.nan is None else self.nan > 0


def sum_health(parts: Sequence[Health]) -> dict[str, int | bool | None]:
    """Field values of the sum of several outputs' health; a count is ``None`` if any is."""

    def total(name: str) -> int | None:
        vals = [getattr(p, name) for p in parts]
        return None if not vals or any(v is None for v in vals) else sum(vals)

    flags = [p.any_nonfinite for p in parts]
    fields = {n: total(n) for n in ("size", "neg_inf", "pos_inf", "nan", "neg", "zero", "pos")}
    any_nf: bool | None = None
    if any(f is not None for f in flags):
        any_nf = any(bool(f) for f in flags)
    return {**fields, "any_nonfinite": any_nf}


def health(mode: TensorDebugMode | int, vector: np.ndarray | None) -> Health:
    """Decode the health part of a summary vector written in ``mode``."""
    if vector is None or len(vector) == 0:
        return Health()
    v = vector
    m = TensorDebugMode(mode)
    if m == TensorDebugMode.CURT_HEALTH and len(v) >= 2:
        return Health(any_nonfinite=bool(v[1] != 0))
    if m == TensorDebugMode.CONCISE_HEALTH and len(v) >= 5:
        ni, pi, nn = int(v[2]), int(v[3]), int(v[4])
        return Health(
            size=int(v[1]), neg_inf=ni, pos_inf=pi, nan=nn, any_nonfinite=(ni + pi + nn) > 0
        )
    if m == TensorDebugMode.FULL_HEALTH and len(v) >= 11:
        ni, pi, nn = int(v[5]), int(v[6]), int(v[7])
        return Health(
            size=int(v[4]),
            neg_inf=ni,
            pos_inf=pi,
            nan=nn,
            neg=int(v[8]),
            zero=int(v[9]),
            pos=int(v[10]),
            any_nonfinite=(ni + pi + nn) > 0,
        )
    if m == TensorDebugMode.REDUCE_INF_NAN_THREE_SLOTS and len(v) >= 3:
        ni, pi, nn = int(v[0] != 0), int(v[1] != 0), int(not np.isfinite(v[2]) or v[2] != 0)
        # Only presence is known, not counts.
        return Health(any_nonfinite=(ni + pi + nn) > 0)
    if m == TensorDebugMode.SHAPE and len(v) >= 4:
        return Health(size=int(v[3]))
    return Health()


def full_tensor_health(array: np.ndarray) -> Health:
    """Health of a full tensor value (FULL_TENSOR mode), computed on the host."""
    if array.dtype.kind not in "fc" and array.dtype.name != "bfloat16":
        return Health(size=int(array.size), neg_inf=0, pos_inf=0, nan=0, any_nonfinite=False)
    a = np.asarray(array, dtype=np.complex128 if array.dtype.kind == "c" else np.float64)
    if a.dtype.kind == "c":
        nan = int(np.count_nonzero(np.isnan(a)))
        inf = int(np.count_nonzero(np.isinf(a)))
        return Health(size=int(a.size), nan=nan, any_nonfinite=(nan + inf) > 0)
    ni = int(np.count_nonzero(a == -np.inf))
    pi = int(np.count_nonzero(a == np.inf))
    nn = int(np.count_nonzero(np.isnan(a)))
    return Health(
        size=int(a.size),
        neg_inf=ni,
        pos_inf=pi,
        nan=nn,
        neg=int(np.count_nonzero(a < 0)) - ni,
        zero=int(np.count_nonzero(a == 0)),
        pos=int(np.count_nonzero(a > 0)) - pi,
        any_nonfinite=(ni + pi + nn) > 0,
    )


def shape_from_summary(vector: np.ndarray) -> tuple[int | None, ...]:
    """The shape stored in a SHAPE summary; ``None`` for dims truncated off the head."""
    rank = int(vector[2])
    kept = [int(d) for d in vector[4 : 4 + min(rank, SHAPE_SLOTS)]]
    return (None,) * max(0, rank - SHAPE_SLOTS) + tuple(kept)


class HealthRow(NamedTuple):
    """Health aggregated over an event's outputs, as the index stores it: -1 where unknown."""

    size: int
    neg_inf: int
    pos_inf: int
    nan: int
    nonfinite: int  # 1, 0, or -1 (the mode does not tell)


UNKNOWN_HEALTH = HealthRow(-1, -1, -1, -1, -1)


def summary_health(mode: TensorDebugMode, summaries: Sequence[np.ndarray | None]) -> HealthRow:
    """Sum the health slots of per-output summaries written in ``mode``."""
    if mode == TensorDebugMode.FULL_HEALTH:
        size = ni = pi = nn = 0
        seen = False
        for s in summaries:
            if s is None or len(s) < 11:
                continue
            v = s.tolist()
            seen = True
            size += int(v[4])
            ni += int(v[5])
            pi += int(v[6])
            nn += int(v[7])
        if not seen:
            return UNKNOWN_HEALTH
        return HealthRow(size, ni, pi, nn, int(ni + pi + nn > 0))
    if mode == TensorDebugMode.CONCISE_HEALTH:
        size = ni = pi = nn = 0
        seen = False
        for s in summaries:
            if s is None or len(s) < 5:
                continue
            v = s.tolist()
            seen = True
            size += int(v[1])
            ni += int(v[2])
            pi += int(v[3])
            nn += int(v[4])
        if not seen:
            return UNKNOWN_HEALTH
        return HealthRow(size, ni, pi, nn, int(ni + pi + nn > 0))
    if mode == TensorDebugMode.CURT_HEALTH:
        flags = [bool(s[1] != 0) for s in summaries if s is not None and len(s) >= 2]
        if not flags:
            return UNKNOWN_HEALTH
        return HealthRow(-1, -1, -1, -1, int(any(flags)))
    if mode == TensorDebugMode.SHAPE:
        sizes = [int(s[3]) for s in summaries if s is not None and len(s) >= 4]
        return HealthRow(sum(sizes) if sizes else -1, -1, -1, -1, -1)
    if mode == TensorDebugMode.FULL_TENSOR:
        size = ni = pi = nn = 0
        any_nf = False
        seen = False
        for s in summaries:
            if s is None:
                continue
            h = full_tensor_health(np.asarray(s))
            seen = True
            size += h.size or 0
            ni += h.neg_inf or 0
            pi += h.pos_inf or 0
            nn += h.nan or 0
            any_nf = any_nf or bool(h.any_nonfinite)
        if not seen:
            return UNKNOWN_HEALTH
        return HealthRow(size, ni, pi, nn, int(any_nf))
    return UNKNOWN_HEALTH
