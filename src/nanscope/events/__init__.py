"""The framework-neutral event model and the dump writer that every backend uses.

Backends describe what ran with the event types here and hand them to a
:class:`DumpWriter`; a backend's own buffer registers with
:func:`register_source` so that it is flushed before the writers at exit.
"""

from nanscope.events._lifecycle import register_source, unregister
from nanscope.events._model import ExecutionEvent, Graph, GraphOp, Phase, TraceEvent
from nanscope.events._writer import DumpWriter

__all__ = [
    "DumpWriter",
    "ExecutionEvent",
    "Graph",
    "GraphOp",
    "Phase",
    "TraceEvent",
    "register_source",
    "unregister",
]
