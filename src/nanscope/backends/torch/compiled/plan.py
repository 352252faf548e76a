"""What one compiled graph records at each call: the link between rewriting and calls.

:mod:`.rewrite` fills a :class:`GraphPlan` while it instruments a graph (at
compile time); :mod:`.calls` uses it at each call of the compiled graph to lay
out the summaries that the graph computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nanscope.format.counts import summary_matrix, with_statistics
from nanscope.format.modes import SHAPE_SLOTS, TensorDebugMode


@dataclass
class TracedValue:
    """One instrumented tensor of a graph: a node output whose summary is recorded."""

    op_name: str
    slot: int
    value: torch.fx.Node  # the node whose value is traced (the op, or its getitem)
    dtype: int
    rank: int
    shape: tuple[Any, ...]
    row: int = -1  # row of the in-graph counts (-1: none needed)


@dataclass
class GraphPlan:
    """What one compiled graph records at each call."""

    graph_id: str
    graph_name: str
    mode: TensorDebugMode
    traces: list[TracedValue] = field(default_factory=list)
    k: int = 0  # counts per computed row
    n_extra: int = 0  # extra graph outputs (0: NO_TENSOR, static SHAPE)
    device_name: str = ""
    op_names: list[str] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # Static sizes: the graph leaves NaN out of its counts, the size less the other classes.
    nan_from_size: bool = False
    # Counted by nanscope_graph::counts: one [NATIVE_COUNTS] vector per row, whatever the mode.
    native_counts: bool = False
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    static: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    output_traces: list[int] = field(default_factory=list)  # graph output -> trace index, -1
    # With statistics asked for: one [4] statistics output per row, after the counts'.
    statistics: int = 0

    def finish(self) -> None:
        self.op_names = [t.op_name for t in self.traces]
        self.slots = [t.slot for t in self.traces]
        self.rows = np.array([t.row for t in self.traces], dtype=np.int64)
        if self.nan_from_size:
            self.sizes = np.array([numel(t.shape) for t in self.traces], dtype=np.float64)
        if self.mode == TensorDebugMode.SHAPE:
            self.static = np.array(
                [
                    [-1, t.dtype, t.rank, numel(t.shape), *_shape_slots(t.shape)]
                    for t in self.traces
                ],
                dtype=np.float64,
            ).reshape(len(self.traces), 4 + SHAPE_SLOTS)
        elif self.mode == TensorDebugMode.FULL_HEALTH:
            self.static = np.array(
                [[t.dtype, t.rank] for t in self.traces], dtype=np.float64
            ).reshape(len(self.traces), 2)

    def matrix(self, counts: np.ndarray | None, stats: np.ndarray | None = None) -> np.ndarray:
        """The ``[n, width]`` float64 summaries in the mode's layout (``stats``: the
        ``[rows, 4]`` statistics, put after them: :func:`~nanscope.format.counts.with_statistics`)."""
        mode = self.mode
        if counts is None:
            assert mode == TensorDebugMode.SHAPE
            return self.static
        c = counts.reshape(-1, self.k)[self.rows].astype(np.float64)
        if self.native_counts:
            c = _mode_counts(c, mode)
        m = summary_matrix(mode, c, self.static, self.sizes if self.nan_from_size else None)
        if stats is not None and len(stats):
            m = with_statistics(m, stats.reshape(-1, 4)[self.rows])
        return m


# Counts per computed row of the in-graph summary vector, by mode.
COUNTS_PER_ROW = {
    TensorDebugMode.CURT_HEALTH: 1,
    TensorDebugMode.CONCISE_HEALTH: 4,
    TensorDebugMode.FULL_HEALTH: 6,
    TensorDebugMode.SHAPE: 1 + SHAPE_SLOTS,
}


# nanscope_graph::counts's vector: -inf, +inf, NaN, < 0, == 0, > 0 (infinities included).
NATIVE_COUNTS = 6


def _mode_counts(c: np.ndarray, mode: TensorDebugMode) -> np.ndarray:
    """nanscope_graph::counts's columns as the mode's in-graph counts (NaN counted)."""
    ninf, pinf, nan, neg, zero, pos = c.T
    if mode == TensorDebugMode.CURT_HEALTH:
        out: np.ndarray = (ninf + pinf + nan)[:, None]
        return out
    if mode == TensorDebugMode.CONCISE_HEALTH:
        return np.stack([ninf, pinf, nan, neg + zero + pos - ninf - pinf], axis=1)
    return c


def numel(shape: Sequence[Any]) -> int:
    """The number of elements of a shape (0 where a dim is symbolic)."""
    n = 1
    for d in shape:
        n *= int(d) if isinstance(d, int) else 0
    return n


def _shape_slots(shape: Sequence[Any]) -> list[float]:
    dims = [float(d) if isinstance(d, int) else 0.0 for d in shape][-SHAPE_SLOTS:]
    return dims + [0.0] * (SHAPE_SLOTS - len(dims))


def drop_output_strides(n: int) -> None:
    """Forget inductor's strides of our extra outputs (AOTAutograd aligns them with its own)."""
    if n <= 0:
        return
    tc = torch._guards.TracingContext.try_get()
    if tc is not None and tc.output_strides:
        del tc.output_strides[-n:]
