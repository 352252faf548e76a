"""Counts computed inside a compiled graph, laid out as tfdbg2 summary vectors.

Compiled code (a ``torch.compile`` graph, a jitted JAX function) computes, for
each instrumented value, a few counts in one fused pass and returns them all as
one vector; the host turns them into the mode's layout
(:mod:`nanscope.format.modes`) here, on the writer's thread. The counts per
value, by mode, when the size is known statically (``nan_from_size``: NaN is
the size less the other classes, so the graph need not count it):

* CURT_HEALTH: ``[non-finite]``
* CONCISE_HEALTH: ``[-inf, +inf, finite]`` (with NaN counted: ``[-inf, +inf, nan, finite]``)
* FULL_HEALTH: ``[-inf, +inf, < 0, == 0, > 0]``, infinities included in ``< 0``
  and ``> 0`` (with NaN counted: ``[-inf, +inf, nan, < 0, == 0, > 0]``)
* SHAPE: ``[size, dim0..dim5]`` (or all static)

With statistics asked for (FULL_HEALTH), the graph also computes each value's
``[mean, std, l2, hash]`` (:mod:`nanscope.format.statistics`), which
:func:`with_statistics` puts after the summary, in the slots an eager summary has them.
"""

from __future__ import annotations

import numpy as np

from nanscope.format.headroom import TFDBG_WIDTH
from nanscope.format.modes import SUMMARY_LENGTH, TensorDebugMode
from nanscope.format.statistics import MEAN_SLOT, STATISTICS_WIDTH


def summary_matrix(
    mode: TensorDebugMode,
    counts: np.ndarray,
    static: np.ndarray,
    sizes: np.ndarray | None = None,
) -> np.ndarray:
    """The ``[n, width]`` float64 summaries of ``n`` values from their ``[n, k]`` counts.

    ``static`` holds what is known before the graph runs: FULL_HEALTH's
    ``[dtype, rank]`` per value, SHAPE's whole ``[-1, dtype, rank, size, dims]``
    rows (whose columns from 3 on the counts replace, where the graph counted
    them). ``sizes``: each value's number of elements, when NaN is to be derived
    from it (``nan_from_size``); ``None`` when the graph counted NaN.
    """
    n = len(counts) if counts is not None else len(static)
    if mode == TensorDebugMode.SHAPE:
        if counts is None or counts.size == 0:
            return static
        m: np.ndarray = static.copy()
        m[:, 3:] = counts
        return m
    c = counts.astype(np.float64, copy=False)
    out = np.empty((n, SUMMARY_LENGTH[mode]), dtype=np.float64)
    out[:, 0] = -1
    if mode == TensorDebugMode.CURT_HEALTH:
        out[:, 1] = c[:, 0] > 0
    elif mode == TensorDebugMode.CONCISE_HEALTH:
        if sizes is not None:
            ninf, pinf, finite = c.T
            nan = sizes - finite - ninf - pinf
        else:
            ninf, pinf, nan, finite = c.T
        out[:, 1] = finite + ninf + pinf + nan
        out[:, 2], out[:, 3], out[:, 4] = ninf, pinf, nan
    else:
        if sizes is not None:
            ninf, pinf, neg, zero, pos = c.T
            nan = sizes - neg - zero - pos
        else:
            ninf, pinf, nan, neg, zero, pos = c.T
        out[:, 1] = -1
        out[:, 2:4] = static
        out[:, 4] = neg + zero + pos + nan
        out[:, 5], out[:, 6], out[:, 7] = ninf, pinf, nan
        out[:, 8], out[:, 9], out[:, 10] = neg - ninf, zero, pos - pinf
    return out


def with_statistics(matrix: np.ndarray, statistics: np.ndarray) -> np.ndarray:
    """FULL_HEALTH summaries ``[n, 11]`` with each value's ``[n, 4]`` statistics after them:
    ``[n, 17]``, the ranges' slots NaN (a graph computes no ranges)."""
    n = len(matrix)
    out = np.full((n, STATISTICS_WIDTH), np.nan, dtype=np.float64)
    out[:, :TFDBG_WIDTH] = matrix[:, :TFDBG_WIDTH]
    out[:, MEAN_SLOT:] = statistics
    return out


def static_columns(
    mode: TensorDebugMode, dtypes: list[int], shapes: list[tuple[int, ...]], slots: int
) -> np.ndarray:
    """What :func:`summary_matrix` needs to know before the graph runs (see ``static``)."""
    n = len(dtypes)
    if mode == TensorDebugMode.SHAPE:
        rows = []
        for dt, shape in zip(dtypes, shapes, strict=True):
            dims = [float(d) for d in shape][-slots:]
            rows.append([-1, dt, len(shape), _numel(shape), *dims, *[0.0] * (slots - len(dims))])
        return np.array(rows, dtype=np.float64).reshape(n, 4 + slots)
    if mode == TensorDebugMode.FULL_HEALTH:
        return np.array(
            [[dt, len(shape)] for dt, shape in zip(dtypes, shapes, strict=True)], dtype=np.float64
        ).reshape(n, 2)
    return np.zeros((n, 0))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
