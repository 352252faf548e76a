"""The GUI inside Jupyter: ``%load_ext nanscope``, then ``%nanscope LOGDIR`` (or :func:`show`).

The server runs in a background thread of the kernel, bound to 127.0.0.1, one
per logdir, and the page is shown in an iframe below the cell.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

from nanscope.server import Server, serve_in_thread

_servers: dict[Path, Server] = {}


def server_for(logdir: str | os.PathLike[str]) -> Server:
    """The kernel's server for ``logdir`` (started on first use, on a free port)."""
    key = Path(logdir).resolve()
    server = _servers.get(key)
    if server is None:
        server = _servers[key] = serve_in_thread(key)
    return server


def show(logdir: str | os.PathLike[str], height: int = 800) -> Any:
    """Show the GUI for ``logdir`` inline; returns an ``IPython.display.IFrame``."""
    from IPython.display import IFrame

    return IFrame(server_for(logdir).url, width="100%", height=height)


def stop_all() -> None:
    """Stop every server this kernel started."""
    for server in _servers.values():
        server.close()
    _servers.clear()


def _magic(line: str) -> Any:
    parser = argparse.ArgumentParser(prog="%nanscope", add_help=False)
    parser.add_argument("logdir")
    parser.add_argument("--height", type=int, default=800)
    try:
        args = parser.parse_args(shlex.split(line))
    except SystemExit:
        raise ValueError("usage: %nanscope LOGDIR [--height PIXELS]") from None
    return show(args.logdir, args.height)


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext nanscope``: registers the ``%nanscope`` line magic."""
    ipython.register_magic_function(_magic, magic_kind="line", magic_name="nanscope")
