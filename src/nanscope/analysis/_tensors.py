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


def statistics(arr: np.ndarray) -> dict[str, Any]:
    """How many values are finite, and their min, max and mean (``None`` where undefined)."""
    stats: dict[str, Any] = {"finite": None, "min": None, "max": None, "mean": None}
    if arr.dtype.kind in "fciub":
        flat = arr.ravel()
        as_float = flat.astype(np.float64) if arr.dtype.kind != "c" else np.abs(flat)
        finite = as_float[np.isfinite(as_float)]
        stats["finite"] = int(finite.size)
        if finite.size:
            stats.update(
                min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean())
            )
    return stats


def values_json(value: np.ndarray, limit: int) -> dict[str, Any]:
    """Dtype, shape, the first ``limit`` values (flattened) and the statistics of all."""
    arr = np.asarray(value)
    shown = arr.ravel()[:limit]
    values: list[Any]
    if arr.dtype.kind == "c":
        values = [[_json_number(float(v.real)), _json_number(float(v.imag))] for v in shown]
    elif arr.dtype.kind == "b":
        values = [bool(v) for v in shown]
    elif arr.dtype.kind in "iu":
        values = [int(v) for v in shown]
    else:
        values = [_json_number(float(v)) for v in shown]
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "size": int(arr.size),
            "values": values, "truncated": int(arr.size) > limit, "stats": statistics(arr)}  # fmt: skip
