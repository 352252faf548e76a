"""nanscope: a numerics debugger for deep-learning programs.

Importing ``nanscope`` imports no deep-learning framework; backends load their
framework only when they are enabled.
"""

from nanscope._version import __version__
from nanscope.api import (
    DebugSession,
    disable_check_numerics,
    disable_dump_debug_info,
    enable_check_numerics,
    enable_dump_debug_info,
)
from nanscope.errors import NonFiniteError
from nanscope.events.writer import DumpWriter
from nanscope.format.files import DumpNotFoundError
from nanscope.format.modes import TensorDebugMode
from nanscope.reader import DumpReader, open_dump

__all__ = [
    "DebugSession",
    "DumpNotFoundError",
    "DumpReader",
    "DumpWriter",
    "NonFiniteError",
    "TensorDebugMode",
    "__version__",
    "disable_check_numerics",
    "disable_dump_debug_info",
    "enable_check_numerics",
    "enable_dump_debug_info",
    "open_dump",
]
