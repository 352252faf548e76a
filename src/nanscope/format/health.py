"""Tensor health: what a summary says about a tensor's values, decoded in one place.

Every mode's summary vector (see :mod:`nanscope.format.modes` for the layouts)
and every FULL_TENSOR value is turned into one :class:`Health` here; the
reader attaches it to each decoded event, and the analysis, the reports and
the server use it as it is. The columnar index stores the same facts as five
integer columns (:meth:`Health.index_row`, ``-1`` where the mode does not tell).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from nanscope.format.modes import MAX_COUNT, TensorDebugMode, shape_from_summary
from nanscope.format.tensors import ValueView, dtype_name


class IndexRow(NamedTuple):
    """The columnar index's health columns (storage layout, not an analysis type): -1 unknown."""

    size: int
    neg_inf: int
    pos_inf: int
    nan: int
    nonfinite: int  # 1, 0, or -1 (the mode does not tell)


UNKNOWN_ROW = IndexRow(-1, -1, -1, -1, -1)


# Not frozen: a frozen dataclass costs 4x more to build, and one is built per output of
# every decoded event. Treat instances as immutable (``UNKNOWN`` is shared).
@dataclass(slots=True)
class Health:
    """A tensor's (or an event's outputs') health; ``None`` where the mode does not tell.

    - ``size``: elements; ``neg_inf``/``pos_inf``/``nan``: non-finite counts;
      ``neg``/``zero``/``pos``: finite counts (FULL_HEALTH and FULL_TENSOR only);
    - ``any_nonfinite``: whether any element is Inf or NaN (every health mode
      tells this, CURT_HEALTH and REDUCE_INF_NAN_THREE_SLOTS nothing more);
    - ``dtype``: the element type's name where the summary records it.
    """

    size: int | None = None
    neg_inf: int | None = None
    pos_inf: int | None = None
    nan: int | None = None
    neg: int | None = None
    zero: int | None = None
    pos: int | None = None
    any_nonfinite: bool | None = None
    dtype: str = ""

    @property
    def known(self) -> bool:
        """Whether the non-finite values are counted (not only flagged)."""
        return self.neg_inf is not None

    @property
    def nonfinite(self) -> bool | None:
        """Whether the values were counted and some are Inf or NaN (``None``: not counted)."""
        if self.neg_inf is None or self.pos_inf is None or self.nan is None:
            return None
        return (self.neg_inf + self.pos_inf + self.nan) > 0

    @property
    def has_inf(self) -> bool | None:
        if self.neg_inf is None or self.pos_inf is None:
            return None
        return (self.neg_inf + self.pos_inf) > 0

    def index_row(self) -> IndexRow:
        """The index's five health columns, ``-1`` where unknown."""
        flag = -1 if self.any_nonfinite is None else int(self.any_nonfinite)
        return IndexRow(
            -1 if self.size is None else self.size,
            -1 if self.neg_inf is None else self.neg_inf,
            -1 if self.pos_inf is None else self.pos_inf,
            -1 if self.nan is None else self.nan,
            flag,
        )

    def to_json(self) -> dict[str, Any]:
        """The counts as the report's and the API's JSON give them (``null`` where unknown)."""
        return asdict(self)


UNKNOWN = Health()
# Plain ints: comparing with an IntEnum member is several times slower, on every event.
_FULL_HEALTH = int(TensorDebugMode.FULL_HEALTH)
_CONCISE_HEALTH = int(TensorDebugMode.CONCISE_HEALTH)


def _counts(values: list[float]) -> bool:
    """Whether every slot is a count a summary may state: 0..MAX_COUNT (NaN fails too)."""
    return all(0.0 <= v <= MAX_COUNT for v in values)


# The slots of each mode that :func:`of_summary` turns into counts, sizes or a dtype.
_COUNTED = {
    _FULL_HEALTH: (11, slice(4, 11), 2),  # (width, counts, dtype slot)
    _CONCISE_HEALTH: (5, slice(1, 5), None),
    int(TensorDebugMode.SHAPE): (4, slice(3, 4), 1),
}


def summary_problem(mode: TensorDebugMode | int, vector: np.ndarray) -> str | None:
    """Why ``vector`` is not a summary of ``mode`` :func:`of_summary` can decode (None: it is).

    A count, size or dtype slot that is NaN, infinite, negative or above ``MAX_COUNT``
    is malformed (a SHAPE summary's rank and dims too); a vector too short for its mode
    is not reported (it is read as unknown, as TensorFlow's empty summaries are).
    """
    spec = _COUNTED.get(int(mode))
    if spec is None or len(vector) < spec[0]:
        return None
    _, counts, dt = spec
    used = vector[counts].tolist() + ([float(vector[dt])] if dt is not None else [])
    if not _counts(used):
        name = TensorDebugMode(int(mode)).name
        return f"its {name} summary holds a count that is NaN, infinite, negative or over 2**53"
    if mode == TensorDebugMode.SHAPE:
        try:
            shape_from_summary(vector)
        except ValueError as exc:
            return str(exc)
    return None


def of_summary(mode: TensorDebugMode | int, vector: np.ndarray | None) -> Health:
    """Decode one summary vector written in ``mode`` (a FULL_TENSOR value: its values).

    A malformed summary (see :func:`summary_problem`) is unknown, never an exception.
    """
    if vector is None:
        return UNKNOWN
    if mode == TensorDebugMode.FULL_TENSOR:
        if isinstance(vector, ValueView):  # a recorder's view: the counts it took
            return of_view(vector)
        return of_array(np.asarray(vector))
    if len(vector) == 0:
        return UNKNOWN
    n = len(vector)
    if mode == _FULL_HEALTH and n >= 11:
        _, _, dt, _, size, ni, pi, nn, neg, zero, pos = head = vector[:11].tolist()
        if not _counts([*head[4:], dt]):
            return UNKNOWN
        return Health(
            int(size),
            int(ni),
            int(pi),
            int(nn),
            int(neg),
            int(zero),
            int(pos),
            (ni + pi + nn) > 0,
            dtype_name(int(dt)),
        )
    if mode == _CONCISE_HEALTH and n >= 5:
        _, size, ni, pi, nn = head = vector[:5].tolist()
        if not _counts(head[1:]):
            return UNKNOWN
        return Health(int(size), int(ni), int(pi), int(nn), any_nonfinite=(ni + pi + nn) > 0)
    if mode == TensorDebugMode.CURT_HEALTH and len(vector) >= 2:
        return Health(any_nonfinite=bool(vector[1] != 0))
    if mode == TensorDebugMode.REDUCE_INF_NAN_THREE_SLOTS and len(vector) >= 3:
        # Each slot holds -inf, +inf or NaN when present (else 0): presence only, no counts.
        return Health(any_nonfinite=bool(np.any(vector[:3] != 0)))
    if mode == TensorDebugMode.SHAPE and len(vector) >= 4:
        _, dt, _, size = vector[:4].tolist()
        if not _counts([dt, size]):
            return UNKNOWN
        return Health(size=int(size), dtype=dtype_name(int(dt)))
    return UNKNOWN


# Elements counted at a time: a value's float64 copy and masks then cost tens of MB at most,
# whatever its dtype (a float8 value's float64 copy alone would be 8x its bytes).
_CHUNK = 1 << 21


def of_array(array: np.ndarray) -> Health:
    """Health of a full tensor value (FULL_TENSOR mode), counted on the host."""
    dtype = str(array.dtype)
    if array.dtype.kind not in "fc" and array.dtype.name != "bfloat16":
        return Health(int(array.size), 0, 0, 0, any_nonfinite=False, dtype=dtype)
    flat = array.reshape(-1)
    if array.dtype.kind == "c":
        nan = inf = 0
        for lo in range(0, flat.size, _CHUNK):
            a = np.asarray(flat[lo : lo + _CHUNK], dtype=np.complex128)
            nan += int(np.count_nonzero(np.isnan(a)))
            inf += int(np.count_nonzero(np.isinf(a)))
        return Health(size=int(flat.size), nan=nan, any_nonfinite=(nan + inf) > 0, dtype=dtype)
    ni = pi = nn = neg = zero = pos = 0
    for lo in range(0, flat.size, _CHUNK):
        a = np.asarray(flat[lo : lo + _CHUNK], dtype=np.float64)
        ni += int(np.count_nonzero(a == -np.inf))
        pi += int(np.count_nonzero(a == np.inf))
        nn += int(np.count_nonzero(np.isnan(a)))
        neg += int(np.count_nonzero(a < 0))
        zero += int(np.count_nonzero(a == 0))
        pos += int(np.count_nonzero(a > 0))
    return Health(int(flat.size), ni, pi, nn, neg - ni, zero, pos - pi, (ni + pi + nn) > 0, dtype)


def of_view(view: ValueView) -> Health:
    """Health of a FULL_TENSOR view from the counts its recorder took (unknown without)."""
    counts = [int(c) for c in view.counts]
    if len(counts) not in (1, 7) or not _counts([float(c) for c in counts]):
        return UNKNOWN  # malformed
    if len(counts) == 1:  # not a float type: no Inf/NaN
        return Health(counts[0], 0, 0, 0, any_nonfinite=False)
    size, ni, pi, nn, neg, zero, pos = counts
    return Health(size, ni, pi, nn, neg, zero, pos, (ni + pi + nn) > 0)


def total(parts: Sequence[Health]) -> Health:
    """Several outputs' health summed: a count is ``None`` if any part's is; the first dtype."""
    if not parts:
        return UNKNOWN
    if len(parts) == 1:
        return parts[0]

    counts: list[int | None] = [0] * 7
    flag: bool | None = None
    for p in parts:
        for k, value in enumerate((p.size, p.neg_inf, p.pos_inf, p.nan, p.neg, p.zero, p.pos)):
            total_k = counts[k]
            counts[k] = None if value is None or total_k is None else total_k + value
        if p.any_nonfinite is not None:
            flag = bool(flag) or p.any_nonfinite
    size, neg_inf, pos_inf, nan, neg, zero, pos = counts
    return Health(size, neg_inf, pos_inf, nan, neg, zero, pos, flag, parts[0].dtype)


def per_output(
    mode: TensorDebugMode | int, values: Iterable[np.ndarray | None]
) -> tuple[Health | None, ...]:
    """Each recorded output's health (``None`` for an output without a summary)."""
    return tuple([None if v is None else of_summary(mode, v) for v in values])


def combined(outputs: Iterable[Health | None]) -> Health:
    """Each output's health (from :func:`per_output`) together, malformed summaries left out."""
    return total([h for h in outputs if h is not None and h != UNKNOWN])


def of_outputs(mode: TensorDebugMode | int, values: Iterable[np.ndarray | None]) -> Health:
    """The health of an event's recorded outputs together (malformed summaries left out)."""
    return combined(per_output(mode, values))


_SATURATED = 2**62


def index_row(mode: TensorDebugMode | int, values: Sequence[np.ndarray | None]) -> IndexRow:
    """The index's health columns for an event's outputs (what the writer and reader store).

    The same facts as ``of_outputs(mode, values).index_row()``, summed straight from the
    vectors for the counting modes: the index is built from every event of a dump.
    """
    if mode in (_FULL_HEALTH, _CONCISE_HEALTH):
        width, first = (11, 4) if mode == _FULL_HEALTH else (5, 1)
        size = ni = pi = nn = 0
        seen = False
        for v in values:
            if v is None or len(v) < width:
                continue
            head = v[:width].tolist()
            if not _counts(head[first:] + ([head[2]] if width == 11 else [])):
                continue  # malformed (NaN, negative, huge): unknown, as of_summary says
            s, a, b, c = head[first : first + 4]
            size += int(s)
            ni += int(a)
            pi += int(b)
            nn += int(c)
            seen = True
        if not seen:
            return UNKNOWN_ROW
        # Thousands of outputs of MAX_COUNT each would overflow the index's int64 columns.
        size, ni, pi, nn = (min(x, _SATURATED) for x in (size, ni, pi, nn))
        return IndexRow(size, ni, pi, nn, int(ni + pi + nn > 0))
    if mode in (TensorDebugMode.NO_TENSOR, TensorDebugMode.UNSPECIFIED):
        return UNKNOWN_ROW
    row = of_outputs(mode, values).index_row()
    sat = _SATURATED
    return IndexRow(
        min(row.size, sat),
        min(row.neg_inf, sat),
        min(row.pos_inf, sat),
        min(row.nan, sat),
        row.nonfinite,
    )
