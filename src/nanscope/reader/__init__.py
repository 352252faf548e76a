"""Reading tfdbg2 dumps (nanscope's and TensorFlow's) with a columnar index."""

from nanscope.format.records import RecordError
from nanscope.reader._data import (
    PHASES,
    Collective,
    Execution,
    GraphExecutionTrace,
    GraphInfo,
    GraphOpInfo,
    Problem,
    ProcessInfo,
    SourceFileInfo,
    StackFrame,
)
from nanscope.reader._decode import DecodeError
from nanscope.reader._drops import WriterDrops
from nanscope.reader._dump import (
    EXECUTIONS,
    HISTORY_DTYPE,
    TRACES,
    DumpError,
    DumpReader,
    EventRef,
    open_dump,
)
from nanscope.reader._eventfile import INDEX_DTYPE
from nanscope.reader._logs import read_run_id

# What decoding one indexed event can raise when its record is damaged.
UNREADABLE = (RecordError, DecodeError)

__all__ = [
    "EXECUTIONS",
    "HISTORY_DTYPE",
    "INDEX_DTYPE",
    "PHASES",
    "TRACES",
    "UNREADABLE",
    "Collective",
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
    "WriterDrops",
    "open_dump",
    "read_run_id",
]
