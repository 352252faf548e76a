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
from nanscope.events import DumpWriter
from nanscope.format.files import DumpNotFoundError
from nanscope.format.modes import TensorDebugMode
from nanscope.reader import DumpReader, open_dump


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext nanscope`` in Jupyter/IPython: adds the ``%nanscope LOGDIR`` magic."""
    from nanscope.notebook import load_ipython_extension as load

    load(ipython)


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
    "load_ipython_extension",
    "open_dump",
]
