"""What one jitted function records at each call: the link between rewriting and calls.

:mod:`.rewrite` fills a :class:`GraphPlan` while it instruments a closed jaxpr
(once per function and argument signature); :mod:`.calls` runs the
instrumented program and hands each call's counts back to the plan, which lays
them out as summaries (:meth:`GraphPlan.matrix`) and says which rows held
Inf/NaN. Also here: the layout of those counts (:data:`COUNTS_PER_VALUE` per
value, then a loop-iteration column) and which values get counted
(:class:`Selection`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.format.counts import static_columns, summary_matrix
from nanscope.format.modes import HEALTH_MODES, SHAPE_SLOTS, TensorDebugMode
from nanscope.format.tensors import DTYPE_NAMES

# Counts per summarised value in the int32 vector, by mode (see nanscope.format.counts).
COUNTS_PER_VALUE = {
    TensorDebugMode.CURT_HEALTH: 1,
    TensorDebugMode.CONCISE_HEALTH: 3,
    TensorDebugMode.FULL_HEALTH: 5,
}


@dataclass
class OpInfo:
    """One equation (or argument) as a ``GraphOpCreation``: what the writer needs."""

    graph_id: str
    op_type: str
    op_name: str
    input_names: list[str]
    num_outputs: int
    frames: list[tuple[str, int, str]]  # outermost first
    module_path: str
    backward: bool


@dataclass
class GraphInfo:
    graph_id: str
    name: str
    outer_graph_id: str


@dataclass
class Row:
    """One summarised value: a row of each call's summaries."""

    graph_id: str
    op_name: str
    slot: int
    dtype: int
    shape: tuple[int, ...]


@dataclass
class GraphPlan:
    """What one jitted function records at each call."""

    graph_id: str
    name: str
    mode: TensorDebugMode
    closed: Any  # the instrumented ClosedJaxpr
    n_extra: int  # extra outputs of the instrumented program (after the original ones)
    graphs: list[GraphInfo] = field(default_factory=list)
    ops: list[OpInfo] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    output_rows: list[int] = field(default_factory=list)  # per original output: row or -1
    input_rows: list[int] = field(default_factory=list)  # per argument: row or -1
    backward: bool = False  # it holds backward equations (a training step's gradients)
    op_names: list[str] = field(default_factory=list)
    graph_ids: list[str] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    static: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    written: bool = False
    # Argument signature -> (executable, its constant arguments): see calls.run.
    executables: dict[Any, Any] = field(default_factory=dict)
    primitive: bool = False  # one eagerly applied primitive, not a jitted function
    op_by_name: dict[str, OpInfo] = field(default_factory=dict)
    row_of: dict[tuple[str, int], int] = field(default_factory=dict)  # (op, slot) -> row
    # Guarded (see guards.Flow): the rows the program counts at every call, in order (None: all).
    kept: np.ndarray | None = None
    full: GraphPlan | None = None  # guarded: the plan counting every row, made on first replay
    source: Any = None  # guarded: a weak reference to the closed jaxpr, to make ``full``
    selection: Selection | None = None
    counted: np.ndarray | None = None  # guarded: per row, whether ``kept`` holds it
    # Guarded: the kept rows where a result's Inf/NaN shows (the results are not all counted).
    covering: np.ndarray | None = None
    patterns: set[bytes] = field(default_factory=set)  # guarded: non-finite rows replayed

    def finish(self) -> None:
        self.op_by_name = {op.op_name: op for op in self.ops}
        self.row_of = {(r.op_name, r.slot): i for i, r in enumerate(self.rows)}
        self.op_names = [r.op_name for r in self.rows]
        self.graph_ids = [r.graph_id for r in self.rows]
        self.slots = [r.slot for r in self.rows]
        self.static = static_columns(
            self.mode, [r.dtype for r in self.rows], [r.shape for r in self.rows], SHAPE_SLOTS
        )
        self.sizes = np.array([numel(r.shape) for r in self.rows], dtype=np.float64)

    def matrix(self, counts: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        """One call's ``[rows, width]`` summaries, and each row's loop iteration (+1; 0: none).

        A guarded plan's rows that were not counted hold zeros (they are not written).
        """
        if self.mode == TensorDebugMode.SHAPE or counts is None:
            return self.static, None
        k = COUNTS_PER_VALUE[self.mode]
        c = self._rows_of(counts)  # the counts, then the iteration column
        rows = self.kept if self.kept is not None else slice(None)
        m = summary_matrix(self.mode, c[:, :k], self.static[rows], self.sizes[rows])
        # A branch (or loop) that did not run left -1: an empty summary, not a value.
        skipped = c[:, 0] < 0
        if skipped.any():
            m[skipped, 1:] = 0
            m[skipped, 0] = -1
        iterations = np.maximum(c[:, k], 0)
        if self.kept is not None:
            n = len(self.rows)
            m, iterations = _spread(m, self.kept, n), _spread(iterations, self.kept, n)
        return m, iterations if iterations.any() else None

    def nonfinite(self, counts: np.ndarray) -> np.ndarray:
        """Per row of a call's counts (as the program returned them: a guarded plan's kept
        rows only), whether it held -inf, +inf, NaN (CURT_HEALTH: any, in the first)."""
        sizes = self.sizes[self.kept] if self.kept is not None else self.sizes
        return np.stack(nonfinite_rows(self.mode, self._rows_of(counts), sizes), axis=1)

    @property
    def flagged(self) -> bool:
        """Whether the counts end with one more element, how many kept rows held Inf/NaN
        (a guarded plan's: computed in the program, the host's look at a healthy call is
        one element)."""
        return self.kept is not None

    def troubled(self, counts: np.ndarray) -> bool:
        """Whether any row of a call's counts held Inf/NaN. A guarded plan's program says
        so in its last element: right after a step, whose run has evicted the host's
        caches, this look costs a few microseconds where :meth:`nonfinite` took 0.2 ms."""
        if self.flagged:
            return bool(counts[-1])
        return bool(self.nonfinite(counts).any())

    def _rows_of(self, counts: np.ndarray) -> np.ndarray:
        k = COUNTS_PER_VALUE[self.mode]
        return (counts[:-1] if self.flagged else counts).reshape(-1, k + 1)


class Selection:
    """Which values get summaries: ``op_regex`` on the op type, ``tensor_dtypes`` on the dtype."""

    def __init__(self, op_regex: re.Pattern[str] | None, dtypes: Callable[[Any], bool] | None):
        self.op_regex = op_regex
        self.dtypes = dtypes

    def wants(self, op_type: str, dtype: Any, mode: TensorDebugMode) -> bool:
        import jax.numpy as jnp

        if self.op_regex is not None and not self.op_regex.match(op_type):
            return False
        if self.dtypes is not None:
            return bool(self.dtypes(dtype))
        if mode in HEALTH_MODES:
            return bool(jnp.issubdtype(dtype, jnp.floating))
        return True


def dtype_enum(dtype: Any) -> int:
    """A dtype's number in the dump's ``DataType`` enum (0: one it has none for)."""
    return int(DTYPE_NAMES.get(np.dtype(dtype).name, 0))


def numel(shape: Sequence[int]) -> int:
    """How many elements an array of ``shape`` holds."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def nonfinite_rows(mode: TensorDebugMode, c: Any, sizes: Any) -> tuple[Any, Any, Any]:
    """Per row of counts ``c`` (``[rows, k + 1]``, NumPy or traced): whether it held -inf,
    +inf, NaN; CURT_HEALTH counts only "any", given in the first. A row of -1 (a branch or
    loop that did not run) holds none."""
    ran = c[:, 0] >= 0
    if mode == TensorDebugMode.CURT_HEALTH:
        some = c[:, 0] > 0
        return some, some & ~ran, some & ~ran
    # Counted: CONCISE_HEALTH [-inf, +inf, finite]; FULL_HEALTH [-inf, +inf, <0, ==0, >0],
    # the infinities inside <0 and >0. NaN is what the counts leave of the size.
    if mode == TensorDebugMode.CONCISE_HEALTH:
        accounted = c[:, 0] + c[:, 1] + c[:, 2]
    else:
        accounted = c[:, 2] + c[:, 3] + c[:, 4]
    return ran & (c[:, 0] > 0), ran & (c[:, 1] > 0), ran & (accounted < sizes)


class Pending:
    """A value whose counts the program is still to compute (with the others of its shape):
    one row of a graph's counts, where a loop's or branch's block of counts is several."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def block_rows(block: Any, mode: TensorDebugMode) -> int:
    """How many rows a block of counts (a loop's or branch's) holds."""
    return int(np.shape(block)[0]) // (COUNTS_PER_VALUE[mode] + 1)


def _spread(part: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """``part``'s rows placed at ``rows`` of an ``n``-row array of zeros."""
    out = np.zeros((n, *part.shape[1:]), dtype=part.dtype)
    out[rows] = part
    return out
