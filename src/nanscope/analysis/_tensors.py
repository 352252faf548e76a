"""A recorded tensor value (FULL_TENSOR mode) as JSON: its first values and statistics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _json_number(x: float) -> float | str:
    """JSON has no NaN or infinities: they travel as strings."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


# Values summarised at a time: float64 copies of a float8 or float16 value would cost 4-8x
# its bytes if made whole; by chunks they cost tens of MB at most.
_CHUNK = 1 << 21


def statistics(arr: np.ndarray) -> dict[str, Any]:
    """How many values are finite, and their min, max and mean (``None`` where undefined)."""
    stats: dict[str, Any] = {"finite": None, "min": None, "max": None, "mean": None}
    if arr.dtype.kind in "fciub":
        flat = arr.reshape(-1)
        count, lo, hi, total = 0, math.inf, -math.inf, 0.0
        for start in range(0, flat.size, _CHUNK):
            part = flat[start : start + _CHUNK]
            as_float = _as_float(part)
            finite = as_float[np.isfinite(as_float)]
            if finite.size:
                count += int(finite.size)
                lo, hi = min(lo, float(finite.min())), max(hi, float(finite.max()))
                total += float(finite.sum())
        stats["finite"] = count
        if count:
            mean = total / count
            if math.isinf(mean):  # finite values whose sum overflows: sum them scaled
                mean = sum(
                    float((f[np.isfinite(f)] / count).sum())
                    for f in (_as_float(flat[i : i + _CHUNK]) for i in range(0, flat.size, _CHUNK))
                )
            stats.update(min=lo, max=hi, mean=mean)
    return stats


def _as_float(part: np.ndarray) -> np.ndarray:
    """Values as float64 (complex values: their magnitudes)."""
    return np.abs(part) if part.dtype.kind == "c" else part.astype(np.float64)


def values_json(value: np.ndarray, limit: int) -> dict[str, Any]:
    """Dtype, shape, the first ``limit`` values (flattened) and the statistics of all."""
    arr = np.asarray(value)
    shown = arr.reshape(-1)[:limit]
    values: list[Any]
    if arr.dtype.kind == "c":
        values = [[_json_number(float(v.real)), _json_number(float(v.imag))] for v in shown]
    elif arr.dtype.kind == "b":
        values = [bool(v) for v in shown]
    elif arr.dtype.kind in "iu":
        values = [int(v) for v in shown]
    else:
        values = [_json_number(float(v)) for v in shown]
    return {
        "dtype": str(arr.dtype),
        "shape": list(arr.shape),
        "size": int(arr.size),
        "values": values,
        "truncated": int(arr.size) > limit,
        "stats": statistics(arr),
    }
