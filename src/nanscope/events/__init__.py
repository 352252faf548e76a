"""The framework-neutral event model and the dump writer that every backend uses."""

from nanscope.events.model import ExecutionEvent, Graph, GraphOp, Phase, TraceEvent
from nanscope.events.writer import DumpWriter

__all__ = ["DumpWriter", "ExecutionEvent", "Graph", "GraphOp", "Phase", "TraceEvent"]
