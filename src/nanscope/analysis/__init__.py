"""Alerts and root cause: where the first Inf/NaN was born, and why; and ``diff``: the
first op where two runs (or two ranks of one run) part (docs/DIFF.md).

Every surface (the terminal report, the JSON report, the GUI's API) renders what
these functions return; none of them reads a dump or decodes a summary itself. What
they return is facts: the words (the headline, the notes' sentences) are the
reporters' (:mod:`nanscope.report`).
"""

from nanscope.analysis._dataflow import consumers, graph_op_edges, nearest_trace, producers
from nanscope.analysis._diff import DiffInputError, diff, diff_ranks
from nanscope.analysis._diff_result import (
    DIFF_SCHEMA,
    Alignment,
    DiffResult,
    InputCheck,
    LossDiff,
    LossStep,
    OpSide,
    OutputDiff,
    PartedOp,
    RankDiff,
    RunSide,
    SourceLine,
)
from nanscope.analysis._explain import explain, op_family
from nanscope.analysis._headroom import Headroom, HeadroomWarning, analyze_headroom, headroom_series
from nanscope.analysis._notes import Note
from nanscope.analysis._ranks import OpCopy, RankState, RankVerdict, analyze_ranks
from nanscope.analysis._rootcause import (
    ABSORBED,
    CLEAN,
    HARMFUL,
    INCOMPLETE,
    SCHEMA,
    Alerts,
    Analysis,
    LineageGroup,
    analyze,
    count_alerts,
)
from nanscope.analysis._tensors import values_json
from nanscope.analysis._tolerance import DEFAULT_ATOL, DEFAULT_RTOL, Tolerance
from nanscope.analysis._views import EventView, InputView, Producer, Source, ViewBuilder

__all__ = [
    "ABSORBED",
    "CLEAN",
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "DIFF_SCHEMA",
    "HARMFUL",
    "INCOMPLETE",
    "SCHEMA",
    "Alerts",
    "Alignment",
    "Analysis",
    "DiffInputError",
    "DiffResult",
    "EventView",
    "Headroom",
    "HeadroomWarning",
    "InputCheck",
    "InputView",
    "LineageGroup",
    "LossDiff",
    "LossStep",
    "Note",
    "OpCopy",
    "OpSide",
    "OutputDiff",
    "PartedOp",
    "Producer",
    "RankDiff",
    "RankState",
    "RankVerdict",
    "RunSide",
    "Source",
    "SourceLine",
    "Tolerance",
    "ViewBuilder",
    "analyze",
    "analyze_headroom",
    "analyze_ranks",
    "consumers",
    "count_alerts",
    "diff",
    "diff_ranks",
    "explain",
    "graph_op_edges",
    "headroom_series",
    "nearest_trace",
    "op_family",
    "producers",
    "values_json",
]
