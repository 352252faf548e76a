"""Statistics: what comparing two runs needs to know of each float output.

With statistics asked for (``enable_dump_debug_info(..., statistics=True)``,
``nanscope run --statistics``), a FULL_HEALTH summary carries four numbers more
than the ranges (:mod:`nanscope.format.headroom`): the mean and the standard
deviation of the finite elements, the L2 norm of the finite elements, and a
hash of every element's bits. In memory they are slots 13 to 16 of the summary
(:data:`STATISTICS_WIDTH` wide); on disk they go to ``Execution.output_statistics``
(field 1010), four doubles per output aligned with ``tensor_protos``, which
TensorFlow's reader ignores. ``NaN`` where nothing was computed.

The hash (:func:`bits_hash`) does not depend on the order of the elements: it is
the sum, modulo 2**64, of splitmix64 of each element's bit pattern, kept to its
low 52 bits so that a float64 holds it exactly. Equal hashes mean equal values
(with overwhelming likelihood) in any layout; the recorders compute the same
number in Python and in C++.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# Slots of an in-memory FULL_HEALTH summary with statistics (after the ranges' 11 and 12).
MEAN_SLOT = 13
STD_SLOT = 14
L2_SLOT = 15
HASH_SLOT = 16
STATISTICS_WIDTH = 17
PER_OUTPUT = 4  # doubles per output in the on-disk field
HASH_BITS = 52

_MASK64 = (1 << 64) - 1


class Statistics(NamedTuple):
    """One output's statistics over its finite elements, and a hash of all its bits."""

    mean: float
    std: float
    l2: float
    hash: int | None  # None where no hash was computed

    def to_json(self) -> dict[str, object]:
        return {
            "mean": _json_float(self.mean),
            "std": _json_float(self.std),
            "l2": _json_float(self.l2),
            "hash": None if self.hash is None else f"{self.hash:013x}",
        }


def _json_float(x: float) -> float | str | None:
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def splitmix64(bits: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser applied to each element of a ``uint64`` array (wrapping)."""
    z = bits.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z += np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def bits_hash(a: np.ndarray) -> int:
    """The order-free hash of an array's element bit patterns (any dtype of 1-8 bytes).

    Each element's bits, zero-extended to 64 bits, go through splitmix64; the
    results are summed modulo 2**64 and the low 52 bits kept.
    """
    flat = np.ascontiguousarray(a).reshape(-1)
    width = flat.dtype.itemsize
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    bits = flat.view(unsigned).astype(np.uint64)
    total = int(splitmix64(bits).sum(dtype=np.uint64)) & _MASK64
    return total & ((1 << HASH_BITS) - 1)


_CHUNK = 1 << 18  # elements per pass: the float64 and uint64 temporaries stay small
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class Accumulator:
    """The statistics of values seen a part at a time (a tensor's slabs, its chunks).

    Each part's mean and sum of squared deviations are combined with Chan's
    formula, so that the standard deviation keeps its precision when the values'
    mean is large; the hash's sums add modulo 2**64 (:func:`bits_hash`).
    """

    __slots__ = ("hash", "m2", "mean", "n")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.hash = 0

    def add(self, a: np.ndarray, finite: bool = False, bits_shift: int = 0) -> None:
        """Add a flat float array's elements. ``finite``: it holds no Inf/NaN (known);
        ``bits_shift``: how far each element's bits are shifted right before hashing
        (16 for bfloat16 values widened to float32, which keep their bits on top)."""
        unsigned = _UNSIGNED[a.dtype.itemsize]
        for lo in range(0, a.size, _CHUNK):
            part = a[lo : lo + _CHUNK]
            bits = part.view(unsigned)
            if bits_shift:
                bits = bits >> unsigned(bits_shift)
            self.hash = (self.hash + int(splitmix64(bits).sum(dtype=np.uint64))) & _MASK64
            if not finite:
                keep = np.isfinite(part)
                if not keep.all():
                    part = part[keep]
            if part.size:
                self._combine(part)

    def _combine(self, part: np.ndarray) -> None:
        x = part.astype(np.float64)  # a copy, centred in place
        n = x.size
        mean = float(x.mean())
        x -= mean
        m2 = float(np.dot(x, x))
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total

    def result(self, repeats: int = 1) -> tuple[float, float, float, float]:
        """``(mean, std, l2, hash)`` of what was added, each element ``repeats`` times
        (NaN for the first three when no element was finite)."""
        hashed = float(((self.hash * repeats) & _MASK64) & ((1 << HASH_BITS) - 1))
        if not self.n:
            return math.nan, math.nan, math.nan, hashed
        n = self.n * repeats
        m2 = self.m2 * repeats
        std = math.sqrt(m2 / n)
        l2 = math.sqrt(m2 + n * self.mean * self.mean)
        return self.mean, std, l2, hashed


def statistics_of(a: np.ndarray) -> Statistics:
    """The statistics of a float array (the reference the recorders are tested against)."""
    values = np.asarray(a)
    finite = values[np.isfinite(values)].astype(np.float64)
    if finite.size:
        mean = float(finite.mean())
        std = float(finite.std())
        l2 = float(np.sqrt(np.square(finite).sum()))
    else:
        mean = std = l2 = math.nan
    return Statistics(mean, std, l2, bits_hash(values))


def from_slots(slots: Sequence[float]) -> Statistics | None:
    """Statistics from four doubles (mean, std, l2, hash); ``None`` when all are NaN."""
    mean, std, l2, h = (float(x) for x in slots[:PER_OUTPUT])
    if all(math.isnan(x) for x in (mean, std, l2, h)):
        return None
    hashed = None if math.isnan(h) or h < 0 or h >= 2.0**HASH_BITS else int(h)
    return Statistics(mean, std, l2, hashed)


def per_output(values: Sequence[float]) -> tuple[Statistics | None, ...]:
    """An ``output_statistics`` field's doubles, four per output, as one entry per output."""
    n = len(values) // PER_OUTPUT
    return tuple(from_slots(values[PER_OUTPUT * i : PER_OUTPUT * (i + 1)]) for i in range(n))
