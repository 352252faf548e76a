"""Headroom: how close a tensor's values came to what its floating-point format holds.

In FULL_HEALTH mode the recorders summarise each float output with two numbers
more than tfdbg2's eleven slots: the largest finite ``|x|`` and the smallest
non-zero finite ``|x|``. In memory they are slots 11 and 12 of the summary
(:data:`RECORDED_WIDTH` wide); on disk the first eleven slots stay where
TensorFlow's reader expects them (``Execution.tensor_protos``) and the pairs
go to ``Execution.output_ranges`` (field 1008), which TensorFlow ignores.
In FULL_TENSOR mode the same two numbers are computed from the values.

The writer's range history keeps one pair per event (:class:`RangeRow`):
over the event's float outputs, the output that came closest to its format's
largest value gives ``amax`` and ``dtype``; ``amin`` is the smallest non-zero
over all of them. ``NaN`` where nothing was recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from nanscope.format.proto.types_pb2 import DataType

# Slots of an in-memory FULL_HEALTH summary that hold the ranges (after tfdbg2's 11).
AMAX_SLOT = 11
AMIN_SLOT = 12
TFDBG_WIDTH = 11
RECORDED_WIDTH = 13


@dataclass(frozen=True)
class FloatFormat:
    """A floating-point format's limits: what a value must stay within to be held."""

    name: str
    max: float  # the largest finite value
    tiny: float  # the smallest normal value: below it, precision is lost
    smallest: float  # the smallest subnormal value: below half of it, a value becomes 0


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("float16", 65504.0, 2.0**-14, 2.0**-24),
        FloatFormat("bfloat16", 3.3895313892515355e38, 2.0**-126, 2.0**-133),
        FloatFormat("float32", 3.4028234663852886e38, 2.0**-126, 2.0**-149),
        FloatFormat("float64", 1.7976931348623157e308, 2.0**-1022, 2.0**-1074),
        FloatFormat("float8_e4m3fn", 448.0, 2.0**-6, 2.0**-9),
        FloatFormat("float8_e5m2", 57344.0, 2.0**-14, 2.0**-16),
    )
}
# Formats a user may ask values to be checked against (``--headroom-format``).
TARGET_FORMATS = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")

_OF_DTYPE: dict[int, FloatFormat] = {
    DataType.DT_HALF: FORMATS["float16"],
    DataType.DT_BFLOAT16: FORMATS["bfloat16"],
    DataType.DT_FLOAT: FORMATS["float32"],
    DataType.DT_DOUBLE: FORMATS["float64"],
    DataType.DT_FLOAT8_E4M3FN: FORMATS["float8_e4m3fn"],
    DataType.DT_FLOAT8_E5M2: FORMATS["float8_e5m2"],
}
_DTYPE_OF_NUMPY = {
    "float16": DataType.DT_HALF,
    "float32": DataType.DT_FLOAT,
    "float64": DataType.DT_DOUBLE,
    "bfloat16": DataType.DT_BFLOAT16,
}


def format_of(dtype: int) -> FloatFormat | None:
    """The format of a ``DataType`` number; ``None`` for one that is not a float."""
    return _OF_DTYPE.get(int(dtype))


class RangeRow(NamedTuple):
    """One event's ranges as the range history takes them (not an analysis type)."""

    amax: float  # the largest finite |x| of the output nearest its format's max; NaN unknown
    amin: float  # the smallest non-zero finite |x| over the float outputs; NaN unknown
    dtype: int  # the DataType of the output that gave ``amax``; 0 unknown


UNKNOWN_RANGES = RangeRow(math.nan, math.nan, 0)
_F32_MAX = FORMATS["float32"].max
_F32_SMALLEST = FORMATS["float32"].smallest


def combine(dtypes: Sequence[int], pairs: Sequence[tuple[float, float] | None]) -> RangeRow:
    """One event's :class:`RangeRow` from each output's dtype and ``(amax, amin)`` pair."""
    best = -1.0
    row = UNKNOWN_RANGES
    amin = math.inf
    seen = False
    for dtype, pair in zip(dtypes, pairs, strict=False):
        fmt = _OF_DTYPE.get(int(dtype))
        if pair is None or fmt is None or not (pair[0] >= 0.0):  # NaN: not recorded
            continue
        seen = True
        ratio = pair[0] / fmt.max
        if ratio > best:
            best = ratio
            row = RangeRow(pair[0], row.amin, int(dtype))
        if pair[1] < amin:
            amin = pair[1]
    if not seen:
        return UNKNOWN_RANGES
    # The history stores float32: a float64 tensor's extremes are held at float32's limits.
    return RangeRow(
        min(row.amax, _F32_MAX), max(amin, _F32_SMALLEST) if amin > 0 else amin, row.dtype
    )


def of_summaries(summaries: Sequence[np.ndarray | None]) -> RangeRow:
    """The range columns of in-memory FULL_HEALTH summaries (:data:`RECORDED_WIDTH` wide)."""
    dtypes: list[int] = []
    pairs: list[tuple[float, float] | None] = []
    for s in summaries:
        if s is None or len(s) < RECORDED_WIDTH:
            continue
        dtypes.append(int(s[2]))
        pairs.append((float(s[AMAX_SLOT]), float(s[AMIN_SLOT])))
    return combine(dtypes, pairs) if pairs else UNKNOWN_RANGES


def of_value(value: np.ndarray) -> tuple[int, tuple[float, float]] | None:
    """``(dtype, (amax, amin))`` of a float array (FULL_TENSOR); ``None`` for other types."""
    dtype = _DTYPE_OF_NUMPY.get(value.dtype.name)
    if dtype is None:
        return None
    a = np.abs(value.astype(np.float64, copy=False)).ravel()
    a = a[np.isfinite(a)]
    if not a.size:
        return int(dtype), (0.0, math.inf)
    nonzero = a[a > 0]
    return int(dtype), (float(a.max()), float(nonzero.min()) if nonzero.size else math.inf)


def of_values(values: Sequence[np.ndarray | None]) -> RangeRow:
    """The range columns of FULL_TENSOR values."""
    found = [r for v in values if v is not None and (r := of_value(np.asarray(v))) is not None]
    if not found:
        return UNKNOWN_RANGES
    return combine([d for d, _ in found], [p for _, p in found])


def pairs_of(flat: Sequence[float]) -> list[tuple[float, float] | None]:
    """``Execution.output_ranges`` as one pair per output (``None`` where not recorded)."""
    out: list[tuple[float, float] | None] = []
    for i in range(0, len(flat) - 1, 2):
        amax, amin = float(flat[i]), float(flat[i + 1])
        out.append(None if math.isnan(amax) else (amax, amin))
    return out


# -- the range history: ``<file set>.nsranges`` ------------------------------------------------
#
# A circular buffer keeps the last events only, but a trend needs every step. The writer
# keeps, per (module, phase), each step's largest |x| and smallest non-zero |x| (at most
# HISTORY_POINTS points per pair: when full, the oldest points are merged two by two, so
# older steps are kept at a coarser grain) and rewrites this small file whole. It is a
# TFRecord stream of two records: ``S`` then the module paths, NUL-separated (the
# ``module`` column indexes them), and ``P`` then rows of POINT_DTYPE.

HISTORY_POINTS = 1024
POINT_DTYPE = np.dtype(
    [
        ("module", "<u4"),
        ("phase", "i1"),
        ("range_dtype", "u1"),  # the DataType of amax
        ("step_lo", "<i8"),  # the steps the point covers (one step, or a merged run)
        ("step_hi", "<i8"),
        ("amax", "<f4"),
        ("amin", "<f4"),
    ]
)


def history_records(modules: Sequence[str], points: np.ndarray) -> tuple[bytes, bytes]:
    """The two record payloads of an ``.nsranges`` file."""
    return (
        b"S" + "\0".join(modules).encode(),
        b"P" + np.ascontiguousarray(points, dtype=POINT_DTYPE).tobytes(),
    )


def parse_history(payloads: Sequence[bytes]) -> tuple[list[str], np.ndarray]:
    """The module paths and the points of an ``.nsranges`` file's records; ``ValueError``
    when they are not what :func:`history_records` writes."""
    if len(payloads) != 2 or payloads[0][:1] != b"S" or payloads[1][:1] != b"P":
        raise ValueError("not a range history (expected a string record, then a point record)")
    modules = bytes(payloads[0][1:]).decode("utf-8", errors="replace").split("\0")
    body = payloads[1]
    if (len(body) - 1) % POINT_DTYPE.itemsize:
        raise ValueError("the point record's size is not a multiple of the point size")
    points = np.frombuffer(body, dtype=POINT_DTYPE, offset=1)
    if len(points) and int(points["module"].max()) >= len(modules):
        raise ValueError("a point names a module the history does not list")
    return modules, points
