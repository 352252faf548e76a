"""Tensor summaries in the tfdbg2 layouts, computed where the tensor lives.

CPU tensors are summarised with numpy on a zero-copy view, with a fast path
that proves "no Inf/NaN" with one vectorised sum (Inf and NaN propagate
through it) and counts the categories only when it fails. Tensors on an
accelerator are summarised with device ops into a small float64 tensor that
stays on the device; the caller batches those and copies them to the host
without blocking (see :mod:`nanscope.backends.torch.device_buffer`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from nanscope.format.modes import SHAPE_SLOTS, TensorDebugMode
from nanscope.format.statistics import HASH_BITS, Accumulator
from nanscope.format.tensors import DTYPE_NAMES

FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

# torch dtype -> tfdbg2 DataType number.
DTYPE_ENUM: dict[torch.dtype, int] = {}
for _name, _value in DTYPE_NAMES.items():
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        DTYPE_ENUM[_dt] = int(_value)
DTYPE_ENUM[torch.bool] = 10
DTYPE_ENUM[torch.complex64] = 8
DTYPE_ENUM[torch.complex128] = 18


# Whether FULL_HEALTH summaries carry the ranges (nanscope.format.headroom): set when a
# session starts, from NANSCOPE_HEADROOM (0: off, to measure what they cost).
RANGES = True


# Whether FULL_HEALTH summaries carry the statistics too (nanscope.format.statistics:
# slots 13-16, after the ranges, which they then always carry): set when a session starts,
# from its settings (``enable_dump_debug_info(..., statistics=True)``).
STATISTICS = False


def ranges_from_environment() -> None:
    global RANGES
    RANGES = os.environ.get("NANSCOPE_HEADROOM", "1") != "0"


def configure(statistics: bool) -> None:
    """Set what a session's FULL_HEALTH summaries carry: the ranges (unless
    ``NANSCOPE_HEADROOM=0``), and the statistics when asked for (with the ranges)."""
    global STATISTICS
    ranges_from_environment()
    STATISTICS = bool(statistics)
    if STATISTICS:
        global RANGES
        RANGES = True  # the statistics' slots come after the ranges'


# Elements copied at once from a layout numpy cannot walk in place.
_CHUNK = 1 << 22


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as numpy sees them, with its strides (bfloat16 widened: a copy)."""
    if t.dtype == torch.bfloat16:
        t = t.detach().float()
    elif t.is_conj() or t.is_neg():
        t = t.detach().resolve_conj().resolve_neg()
    try:
        return t.numpy()
    except RuntimeError:  # requires grad
        return t.detach().numpy()


def without_broadcast(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``t`` with its broadcast (stride-0) dimensions cut to one, and how often each element repeats.

    An ``expand``ed view costs no memory; counting one copy of it and
    multiplying keeps its summary free too. (PyTorch ops: for device tensors
    and bfloat16, which numpy has no type for.)
    """
    repeats = 1
    for d in range(t.dim()):
        if t.stride(d) == 0 and t.size(d) > 1:
            repeats *= t.size(d)
            t = t.narrow(d, 0, 1)
    return t, repeats


def host_parts(t: torch.Tensor) -> tuple[Iterator[np.ndarray], int]:
    """Flat arrays that together hold each distinct element of a CPU tensor once, and how
    often each repeats in the tensor (an ``expand``ed view's stride-0 dimensions).

    Runs no PyTorch op (but for bfloat16), so a dispatch mode of the program's own sees
    none of nanscope's. A layout with overlapping elements (a sliding window) is copied a
    slab of its first dimension at a time, never whole.
    """
    if t.dtype == torch.bfloat16:
        t, repeats = without_broadcast(t)
        return _slabs(_numpy(t)), repeats
    a = _numpy(t)
    cut = tuple(
        slice(0, 1) if stride == 0 and size > 1 else slice(None)
        for size, stride in zip(a.shape, a.strides, strict=True)
    )
    repeats = 1
    for size, part in zip(a.shape, cut, strict=True):
        if part.stop == 1:
            repeats *= size
    return _slabs(a[cut]), repeats


def _walkable(a: np.ndarray) -> bool:
    """Whether each element of ``a`` is in its memory once, with no gaps (any axis order)."""
    if a.flags.c_contiguous or a.flags.f_contiguous:
        return True
    expected = a.itemsize
    dims = sorted(
        (d for d in zip(a.shape, a.strides, strict=True) if d[0] != 1), key=lambda d: d[1]
    )
    for size, stride in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _slabs(a: np.ndarray) -> Iterator[np.ndarray]:
    if a.size <= _CHUNK or a.ndim == 0 or _walkable(a):
        yield a.ravel(order="K")  # a view where the layout allows it, else a bounded copy
        return
    if a.shape[0] == 1:
        yield from _slabs(a[0])
        return
    step = max(1, _CHUNK // (a.size // a.shape[0]))
    for i in range(0, a.shape[0], step):
        yield from _slabs(a[i : i + step])


def all_finite(a: np.ndarray) -> bool:
    """True when a flat float array holds no Inf and no NaN."""
    return bool(np.isfinite(a).all())


def counts(a: np.ndarray) -> tuple[int, int, int, int, int, int]:
    """``(-inf, +inf, nan, negative, zero, positive)`` of a flat float array.

    Comparisons into a boolean temporary and a count are the fastest passes
    numpy offers (``count_nonzero`` on floats is several times slower); NaN
    compares false everywhere, so it is in none of the first two counts.
    """
    n = a.size
    negative = int(np.count_nonzero(a < 0))
    zero = int(np.count_nonzero(a == 0))
    if all_finite(a):
        return 0, 0, 0, negative, zero, n - negative - zero
    neg_inf = int(np.count_nonzero(a == -np.inf))
    pos_inf = int(np.count_nonzero(a == np.inf))
    nan = int(np.count_nonzero(np.isnan(a)))
    return neg_inf, pos_inf, nan, negative - neg_inf, zero, n - negative - zero - nan - pos_inf


def tensor_counts(t: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """:func:`counts` over a CPU float tensor of any layout, without materialising views."""
    parts, repeats = host_parts(t)
    total = np.zeros(6, dtype=np.int64)
    for a in parts:
        total += counts(a)
    ni, pi, nn, neg, zero, pos = (int(v) * repeats for v in total)
    return ni, pi, nn, neg, zero, pos


def ranges(a: np.ndarray, finite: bool = False, zeros: bool = True) -> tuple[float, float]:
    """``(largest finite |x|, smallest non-zero finite |x|)`` of a flat float array
    (``0`` and ``inf`` where it holds no such element); see :mod:`nanscope.format.headroom`.

    ``finite``: the caller knows it holds no Inf/NaN; ``zeros=False``: no zero either
    (the counts said so), which saves the mask of non-zero values.
    """
    if not finite and not all_finite(a):
        a = a[np.isfinite(a)]
    if not a.size:
        return 0.0, math.inf
    hi = max(float(a.max()), -float(a.min()))  # two passes, no temporary
    mag = np.abs(a)
    lo = float(mag.min()) if not zeros else float(np.min(mag, where=mag > 0, initial=math.inf))
    return hi, lo


def tensor_ranges(t: torch.Tensor, finite: bool = False, zeros: bool = True) -> tuple[float, float]:
    """:func:`ranges` over a CPU float tensor of any layout, without materialising views."""
    hi, lo = 0.0, math.inf
    for a in host_parts(t)[0]:
        h, m = ranges(a, finite, zeros)
        hi, lo = max(hi, h), min(lo, m)
    return hi, lo


def tensor_statistics(t: torch.Tensor, finite: bool = False) -> tuple[float, float, float, float]:
    """``(mean, std, l2, hash)`` of a CPU float tensor of any layout, without
    materialising views (:mod:`nanscope.format.statistics`; ``finite``: the caller
    knows it holds no Inf/NaN). The hash is over each element's bits in its own
    dtype: a bfloat16 widened to float32 (exactly) keeps its bits in the upper half."""
    acc = Accumulator()
    parts, repeats = host_parts(t)
    shift = 16 if t.dtype == torch.bfloat16 else 0
    for a in parts:
        acc.add(a, finite=finite, bits_shift=shift)
    return acc.result(repeats)


def tensor_all_finite(t: torch.Tensor) -> bool:
    """True when a CPU float tensor of any layout holds no Inf and no NaN."""
    return all(all_finite(a) for a in host_parts(t)[0])


def shape_slots(t: torch.Tensor) -> list[float]:
    dims = list(t.shape)[-SHAPE_SLOTS:]
    return [float(d) for d in dims] + [0.0] * (SHAPE_SLOTS - len(dims))


def summarize_host(
    t: torch.Tensor, mode: TensorDebugMode, tensor_id: int = -1
) -> np.ndarray | None:
    """The summary vector of a CPU tensor, or ``None`` when the mode skips its dtype."""
    dtype = t.dtype
    if mode == TensorDebugMode.SHAPE:
        if dtype not in DTYPE_ENUM or dtype.is_complex:
            return None
        return np.array(
            [tensor_id, DTYPE_ENUM[dtype], t.dim(), t.numel(), *shape_slots(t)], dtype=np.float64
        )
    if mode == TensorDebugMode.FULL_TENSOR:
        return full_value(t)
    if dtype not in FLOAT_DTYPES:
        return None
    if mode == TensorDebugMode.CURT_HEALTH:
        return np.array([tensor_id, float(not tensor_all_finite(t))], dtype=np.float64)
    size = t.numel()
    if mode == TensorDebugMode.CONCISE_HEALTH:
        # No sign counts in this mode: one finiteness pass is enough when it holds.
        if tensor_all_finite(t):
            return np.array([tensor_id, size, 0, 0, 0], dtype=np.float64)
        ni, pi, nn, _, _, _ = tensor_counts(t)
        return np.array([tensor_id, size, ni, pi, nn], dtype=np.float64)
    ni, pi, nn, neg, zero, pos = tensor_counts(t)
    if not RANGES:
        return np.array(
            [tensor_id, -1, DTYPE_ENUM[dtype], t.dim(), size, ni, pi, nn, neg, zero, pos],
            dtype=np.float64,
        )
    # FULL_HEALTH's 11 slots, then the ranges (nanscope.format.headroom).
    finite = not (ni or pi or nn)
    hi, lo = tensor_ranges(t, finite=finite, zeros=zero > 0)
    if not STATISTICS:
        return np.array(
            [tensor_id, -1, DTYPE_ENUM[dtype], t.dim(), size, ni, pi, nn, neg, zero, pos, hi, lo],
            dtype=np.float64,
        )
    # Then the statistics (nanscope.format.statistics).
    return np.array(
        [
            *(tensor_id, -1, DTYPE_ENUM[dtype], t.dim(), size, ni, pi, nn, neg, zero, pos, hi, lo),
            *tensor_statistics(t, finite=finite),
        ],
        dtype=np.float64,
    )


def full_value(t: torch.Tensor) -> np.ndarray | None:
    """The whole value on the host, for FULL_TENSOR (bfloat16 widened to float32)."""
    x = t.detach()
    if x.dtype == torch.bfloat16:
        x = x.float()
    try:
        return np.array(x.cpu().resolve_conj().resolve_neg().numpy(), copy=True)
    except (TypeError, RuntimeError):
        return None


def summarize_device(t: torch.Tensor, mode: TensorDebugMode, tensor_id: int = -1) -> Any:
    """The summary of an accelerator tensor as a float64 device tensor (no host sync), or ``None``."""
    dtype = t.dtype
    if mode == TensorDebugMode.SHAPE:
        if dtype not in DTYPE_ENUM or dtype.is_complex:
            return None
        return torch.tensor(
            [tensor_id, DTYPE_ENUM[dtype], t.dim(), t.numel(), *shape_slots(t)], dtype=torch.float64
        ).to(t.device, non_blocking=True)
    if dtype not in FLOAT_DTYPES:
        return None
    base, repeats = without_broadcast(t.detach())
    x = base.reshape(-1)
    nan = torch.isnan(x).sum() * repeats
    if mode == TensorDebugMode.CURT_HEALTH:
        flag = (~torch.isfinite(x)).any().to(torch.float64)
        return torch.stack([torch.full_like(flag, tensor_id), flag])
    neg_inf = (x == float("-inf")).sum() * repeats
    pos_inf = (x == float("inf")).sum() * repeats
    size = torch.full_like(nan, t.numel())
    if mode == TensorDebugMode.CONCISE_HEALTH:
        return torch.stack([torch.full_like(nan, tensor_id), size, neg_inf, pos_inf, nan]).double()
    neg = (x < 0).sum() * repeats - neg_inf
    zero = (x == 0).sum() * repeats
    pos = (x > 0).sum() * repeats - pos_inf
    head = torch.tensor(
        [tensor_id, -1, DTYPE_ENUM[dtype], t.dim()], dtype=torch.float64, device=x.device
    )
    counts = torch.stack([size, neg_inf, pos_inf, nan, neg, zero, pos]).double()
    if not RANGES:
        return torch.cat([head, counts])
    # The ranges (nanscope.format.headroom), on the device like the counts.
    mag = torch.where(torch.isfinite(x), x.abs(), 0).double()
    hi = mag.max() if x.numel() else torch.zeros((), dtype=torch.float64, device=x.device)
    lo = torch.where(mag > 0, mag, math.inf).min() if x.numel() else torch.full_like(hi, math.inf)
    if not STATISTICS:
        return torch.cat([head, counts, torch.stack([hi, lo])])
    return torch.cat([head, counts, torch.stack([hi, lo]), device_statistics(x, repeats)])


# splitmix64's constants as signed 64-bit integers (torch has no unsigned 64-bit arithmetic;
# two's complement wraps the same way).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_BITS_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _logical_shift(z: torch.Tensor, k: int) -> torch.Tensor:
    """``z >> k`` as an unsigned 64-bit shift (torch's ``>>`` on int64 is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def device_statistics(x: torch.Tensor, repeats: int = 1) -> torch.Tensor:
    """``[mean, std, l2, hash]`` of a flat float tensor as a float64 tensor on its device
    (no host sync): the same numbers as :func:`nanscope.format.statistics.statistics_of`
    of the tensor with each element repeated ``repeats`` times."""
    if x.is_neg() or x.is_conj():
        x = x.resolve_neg().resolve_conj()  # the values, not the memory's bits
    finite = torch.isfinite(x)
    n = finite.sum().double()
    v = torch.where(finite, x.double(), 0.0)
    mean = v.sum() / n
    dev = torch.where(finite, v - mean, 0.0)
    std = (dev.square().sum() / n).sqrt()
    l2 = (v.square().sum() * repeats).sqrt()
    width = x.element_size()
    z = x.view(_BITS_VIEW[width]).to(torch.int64)
    if width < 8:
        z = z & ((1 << (8 * width)) - 1)  # zero-extended, not sign-extended
    z = z + _GOLDEN
    z = (z ^ _logical_shift(z, 30)) * _MIX1
    z = (z ^ _logical_shift(z, 27)) * _MIX2
    z = z ^ _logical_shift(z, 31)
    total = z.sum() * repeats  # modulo 2**64, as int64 arithmetic wraps
    hashed = (total & ((1 << HASH_BITS) - 1)).double()
    nan = torch.full_like(mean, math.nan)
    none = n == 0  # no finite element: NaN, as statistics_of says
    return torch.stack(
        [
            torch.where(none, nan, mean),
            torch.where(none, nan, std),
            torch.where(none, nan, l2),
            hashed,
        ]
    )
