"""The range history the writer keeps beside the circular buffer (``.nsranges``).

See :mod:`nanscope.format.headroom` for what it holds and why. Updated on the
writer thread, once per recorded execution with ranges: one dictionary lookup
and, within a step, an in-place max and min. The points are kept in typed
arrays (``array.array``), so that writing the file is a copy per column, not
a conversion of Python numbers (the writer holds the GIL meanwhile).
"""

from __future__ import annotations

from array import array

import numpy as np

from nanscope.format.headroom import HISTORY_POINTS, POINT_DTYPE, format_of, history_records
from nanscope.format.records import frame

# DataType number -> its format's largest value (0: not a float).
_MAXES: dict[int, float] = {}


class _Series:
    """One (module, phase)'s points, oldest first, as parallel typed arrays."""

    __slots__ = ("amax", "amin", "dtype", "hi", "level", "lo")

    def __init__(self) -> None:
        self.lo = array("q")
        self.hi = array("q")
        self.amax = array("f")  # float32, as the file holds them
        self.amin = array("f")
        self.dtype = array("B")
        self.level = array("d")  # amax over its format's max: what "largest" compares

    def halve(self) -> None:
        """Merge the points two by two: the same steps at half the resolution."""
        n = len(self.lo) // 2 * 2
        lo, hi = np.frombuffer(self.lo, np.int64), np.frombuffer(self.hi, np.int64)
        amax, amin = np.frombuffer(self.amax, np.float32), np.frombuffer(self.amin, np.float32)
        dtype, level = np.frombuffer(self.dtype, np.uint8), np.frombuffer(self.level, np.float64)
        first = np.arange(0, n, 2)
        pick = np.where(level[first] >= level[first + 1], first, first + 1)
        if n != len(lo):  # an odd point out stays as it is
            first = np.append(first, len(lo) - 1)
            pick = np.append(pick, len(lo) - 1)
        ends = np.minimum(first + 1, len(lo) - 1)
        lows = np.minimum(amin[first], amin[ends])
        self.lo = array("q", lo[first].tobytes())
        self.hi = array("q", hi[ends].tobytes())
        self.amax = array("f", amax[pick].tobytes())
        self.amin = array("f", lows.tobytes())
        self.dtype = array("B", dtype[pick].tobytes())
        self.level = array("d", level[pick].tobytes())


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
        total = sum(len(s.lo) for s in self._series.values())
        points = np.zeros(total, dtype=POINT_DTYPE)
        at = 0
        for (module, phase), s in self._series.items():
            n = len(s.lo)
            p = points[at : at + n]
            p["module"] = modules.setdefault(module, len(modules))
            p["phase"] = phase
            p["range_dtype"] = np.frombuffer(s.dtype, np.uint8)
            p["step_lo"] = np.frombuffer(s.lo, np.int64)
            p["step_hi"] = np.frombuffer(s.hi, np.int64)
            p["amax"] = np.frombuffer(s.amax, np.float32)
            p["amin"] = np.frombuffer(s.amin, np.float32)
            at += n
        self.dirty = False
        return b"".join(frame(r) for r in history_records(list(modules), points))
