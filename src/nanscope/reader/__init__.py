"""Reading tfdbg2 dumps (nanscope's and TensorFlow's) with a columnar index."""

from nanscope.reader.data import (
    Execution,
    GraphExecutionTrace,
    GraphInfo,
    GraphOpInfo,
    Problem,
    ProcessInfo,
    SourceFileInfo,
    StackFrame,
)
from nanscope.reader.dump import EXECUTIONS, TRACES, DumpError, DumpReader, EventRef, open_dump

__all__ = [
    "EXECUTIONS",
    "TRACES",
    "DumpError",
    "DumpReader",
    "EventRef",
    "Execution",
    "GraphExecutionTrace",
    "GraphInfo",
    "GraphOpInfo",
    "Problem",
    "ProcessInfo",
    "SourceFileInfo",
    "StackFrame",
    "open_dump",
]
