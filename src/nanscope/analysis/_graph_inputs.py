"""Inside a compiled graph, moving values makes no Inf/NaN.

A ``torch.compile`` graph's inputs (its parameters, the user's tensors, and in a
backward graph the activations saved by the forward graph and the incoming
gradients) are placeholders: they are not traced, only node outputs are
(docs/TORCH_COMPILE.md). So when non-finite values come into a graph, the first
node that reads them has no traced non-finite input, and would be taken for a
birth: a ``view`` of a saved activation, the ``embedding`` of a weight an earlier
update made NaN, every ``permute`` of a NaN gradient. An op that only moves or
selects values cannot make one (docs/ROOT_CAUSE.md, "Compiled graphs' inputs"):

* it continues the lineage whose values most likely came in: of the lineages
  that left a graph before it (returned from a graph, as a loss, an activation
  saved for the backward graph, a gradient), those that carry NaN first, then the
  one with the earliest NaN, then the latest born;
* with none, one lineage per process stands for "came in through the graph's
  inputs" (``entered``), which every such op continues: one entry in the report,
  not one per op.

An op that computes (``mul``, ``mm``, ``sum``...) from a placeholder continues
them too where the call recorded that this input held Inf/NaN (:class:`CallInputs`);
where it did not (older dumps, accelerators), it is a birth: finite inputs can
overflow.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nanscope.analysis._explain import short_name
from nanscope.analysis._lineage import Lineage
from nanscope.reader import (
    EXECUTIONS,
    UNREADABLE,
    DumpReader,
    GraphExecutionTrace,
    GraphInfo,
    GraphOpInfo,
)

# Ops whose output elements are some of their inputs' (moved, selected, repeated, copied
# with the same dtype kind), and neg/abs, which cannot make a non-finite value either.
MOVES = frozenset(
    {
        "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand",
        "slice", "select", "index", "index_select", "gather", "embedding", "cat", "stack",
        "clone", "copy", "copy_", "alias", "squeeze", "unsqueeze", "flatten", "unflatten",
        "split", "split_with_sizes", "chunk", "narrow", "as_strided", "unbind", "diagonal",
        "contiguous", "detach", "lift_fresh_copy", "expand_copy", "permute_copy",
        "view_copy", "slice_copy", "select_copy", "transpose_copy", "t_copy",
        "squeeze_copy", "unsqueeze_copy", "roll", "flip", "repeat", "masked_select",
        "neg", "abs",
    }
)  # fmt: skip
CAME_IN = "came in through the graph's inputs"


def moves_values(op_type: str) -> bool:
    """Whether a graph op (``aten.view.default``) only moves or selects its input's values."""
    return short_name(op_type) in MOVES


def came_in_from(
    lineages: list[Lineage], before: int, left_graph: Callable[[Lineage], bool]
) -> int | None:
    """The lineage whose values a graph input most likely held: see the module's docstring.

    ``lineages`` are the process's trace lineages so far; ``left_graph(lin)`` says whether
    a lineage's values left their graph; only those born before trace ``before`` count.
    """
    left = [k for k, lin in enumerate(lineages) if lin.birth < before and left_graph(lin)]
    if not left:
        return None
    nan = [k for k in left if lineages[k].first_nan is not None]
    if nan:
        return min(nan, key=lambda k: (lineages[k].first_nan or 0, k))
    return left[-1]


class CallInputs:
    """What each graph call's inputs held, where the call recorded it.

    The torch.compile recorder summarises a call's inputs (one per placeholder, in
    order) when a traced value of the call holds Inf/NaN
    (``backends/torch/compiled/calls.py``). A node that computes from a placeholder
    that held Inf/NaN made none itself: they came in.
    """

    LOOK_AHEAD = 8  # graph calls decoded, from the trace's wall time, to find its call

    def __init__(self, reader: DumpReader, process: int) -> None:
        self.reader = reader
        self.process = process
        self._calls: np.ndarray | None = None  # indices of this process's graph calls
        self._bad: dict[tuple[str, float], set[str] | None] = {}

    def _graph_calls(self) -> np.ndarray:
        if self._calls is None:
            rows = self.reader.index(EXECUTIONS)
            mine = np.flatnonzero(self.reader.processes_of(EXECUTIONS) == self.process)
            graphs = rows["graph"][mine]
            # Eager ops (no graph) are the commonest value of the graph column.
            eager = np.bincount(graphs.astype(np.int64)).argmax() if graphs.size else 0
            self._calls = mine[graphs != eager]
        return self._calls

    def _nonfinite(self, graph: GraphInfo, tr: GraphExecutionTrace) -> set[str] | None:
        """The placeholders of ``tr``'s call that held Inf/NaN (None: not recorded)."""
        key = (tr.graph_id, tr.wall_time)
        if key in self._bad:
            return self._bad[key]
        self._bad[key] = None
        calls = self._graph_calls()
        times = self.reader.index(EXECUTIONS)["wall_time"][calls]
        start = int(np.searchsorted(times, tr.wall_time, side="left"))
        for j in calls[start : start + self.LOOK_AHEAD].tolist():
            try:
                ex = self.reader.execution(j)
            except UNREADABLE:
                continue
            if ex.graph_id != tr.graph_id:
                continue
            if ex.input_health:
                names = [n for n, op in graph.ops.items() if op.op_type == "Placeholder"]
                self._bad[key] = {
                    n
                    for n, h in zip(names, ex.input_health, strict=False)
                    if h is not None and h.any_nonfinite
                }
            break
        return self._bad[key]

    def came_in(self, graph: GraphInfo, op: GraphOpInfo, tr: GraphExecutionTrace) -> bool:
        """Whether ``op`` read a graph input that held Inf/NaN at ``tr``'s call."""
        if not any(
            graph.ops.get(src) is not None and graph.ops[src].op_type == "Placeholder"
            for src, _ in op.inputs
        ):
            return False
        bad = self._nonfinite(graph, tr)
        return bool(bad) and any(src in bad for src, _ in op.inputs)  # type: ignore[operator]
