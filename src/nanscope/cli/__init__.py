"""The ``nanscope`` command line: one module per subcommand."""

from nanscope.cli.main import main

__all__ = ["main"]
