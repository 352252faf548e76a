"""The range history the writer keeps beside the circular buffer (``.nsranges``).

See :mod:`nanscope.format.headroom` for what it holds and why. Updated on the
writer thread, once per recorded execution with ranges: one dictionary lookup
and, within a step, an in-place max and min.
"""

from __future__ import annotations

import numpy as np

from nanscope.format.headroom import HISTORY_POINTS, POINT_DTYPE, format_of, history_records
from nanscope.format.records import frame

# DataType number -> its format's largest value (0: not a float).
_MAXES: dict[int, float] = {}


class _Series:
    """One (module, phase)'s points, oldest first, as parallel lists."""

    __slots__ = ("amax", "amin", "dtype", "hi", "level", "lo")

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.amax: list[float] = []
        self.amin: list[float] = []
        self.dtype: list[int] = []
        self.level: list[float] = []  # amax over its format's max: what "largest" compares

    def halve(self) -> None:
        """Merge the points two by two: the same steps at half the resolution."""
        n = len(self.lo) // 2 * 2
        lo, hi, amax, amin, dtype, level = (
            self.lo, self.hi, self.amax, self.amin, self.dtype, self.level
        )  # fmt: skip
        keep = [] if n == len(lo) else [(lo[-1], hi[-1], amax[-1], amin[-1], dtype[-1], level[-1])]
        merged = []
        for i in range(0, n, 2):
            j = i if level[i] >= level[i + 1] else i + 1
            merged.append(
                (lo[i], hi[i + 1], amax[j], min(amin[i], amin[i + 1]), dtype[j], level[j])
            )
        merged += keep
        self.lo, self.hi, self.amax, self.amin, self.dtype, self.level = (
            list(c) for c in zip(*merged, strict=True)
        )


class RangeHistory:
    """Per (module, phase): each step's largest |x| and smallest non-zero |x|."""

    def __init__(self, points: int = HISTORY_POINTS) -> None:
        self._points = max(2, points)
        self._series: dict[tuple[str, int], _Series] = {}
        self.dirty = False

    def add(self, module: str, phase: int, step: int, amax: float, amin: float, dtype: int) -> None:
        s = self._series.get((module, phase))
        if s is None:
            s = self._series[(module, phase)] = _Series()
        self.dirty = True
        top = _MAXES.get(dtype)
        if top is None:
            fmt = format_of(dtype)
            top = _MAXES[dtype] = fmt.max if fmt is not None else 0.0
        level = amax / top if top else 0.0
        if s.hi and s.hi[-1] >= step >= s.lo[-1]:
            if level > s.level[-1]:
                s.amax[-1] = amax
                s.dtype[-1] = dtype
                s.level[-1] = level
            if amin < s.amin[-1]:
                s.amin[-1] = amin
            return
        if len(s.lo) >= self._points:
            s.halve()
        s.lo.append(step)
        s.hi.append(step)
        s.amax.append(amax)
        s.amin.append(amin)
        s.dtype.append(dtype)
        s.level.append(level)

    def to_bytes(self) -> bytes:
        """The whole ``.nsranges`` file."""
        modules: dict[str, int] = {}
        parts = []
        for (module, phase), s in self._series.items():
            p = np.zeros(len(s.lo), dtype=POINT_DTYPE)
            p["module"] = modules.setdefault(module, len(modules))
            p["phase"] = phase
            p["range_dtype"] = s.dtype
            p["step_lo"] = s.lo
            p["step_hi"] = s.hi
            p["amax"] = s.amax
            p["amin"] = s.amin
            parts.append(p)
        points = np.concatenate(parts) if parts else np.zeros(0, dtype=POINT_DTYPE)
        self.dirty = False
        return b"".join(frame(r) for r in history_records(list(modules), points))
