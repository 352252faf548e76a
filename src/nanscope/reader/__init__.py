"""Reading tfdbg2 dumps (nanscope's and TensorFlow's) with a columnar index."""

from nanscope.format.records import RecordError
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
from nanscope.reader.decode import DecodeError
from nanscope.reader.dump import EXECUTIONS, TRACES, DumpError, DumpReader, EventRef, open_dump

# What decoding one indexed event can raise when its record is damaged.
UNREADABLE = (RecordError, DecodeError)

__all__ = [
    "EXECUTIONS",
    "TRACES",
    "UNREADABLE",
    "DecodeError",
    "DumpError",
    "DumpReader",
    "EventRef",
    "Execution",
    "GraphExecutionTrace",
    "GraphInfo",
    "GraphOpInfo",
    "Problem",
    "ProcessInfo",
    "RecordError",
    "SourceFileInfo",
    "StackFrame",
    "open_dump",
]
