"""Open the web GUI on a logdir: alerts, execution timeline, graph executions, graph
structure, source code and stack traces, for every run and process under it.

The server binds 127.0.0.1 unless --host says otherwise (then every request needs the
token printed in its URL), serves only what the dumps hold (source files only as the
dump recorded them), and is read-only.
It follows dumps that are still being written.
"""

from __future__ import annotations

import argparse
import os
import sys

from nanscope.cli.errors import CommandError
from nanscope.server import DEFAULT_HOST, DEFAULT_PORT, ServeError, Server
from nanscope.server.serving import TOKEN_ENV, is_loopback

HELP = "open the web GUI on a logdir (every run and process under it, live)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "logdir",
        nargs="+",
        help="the logdir: a dump root, or a directory with runs below it; several (one per "
        "host) are served together, the directories of one run id making one run",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free port)",
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}, this machine only; "
        "0.0.0.0 serves the network: whoever has the printed URL, with its token, can read "
        f"your dumps and source files; ${TOKEN_ENV} sets the token)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer to this host name (a DNS name or proxy the page is opened "
        "through; IP addresses and this machine's name are always answered)",
    )


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port {args.port} is not a port number (0 to 65535)")
    try:
        server = Server(
            args.logdir,
            args.host,
            args.port,
            token=os.environ.get(TOKEN_ENV) or None,
            allow_hosts=args.allow_host,
        )
    except ServeError as exc:
        raise CommandError(str(exc)) from None
    runs = server.runs.names()
    found = f"{len(runs)} run{'s' if len(runs) != 1 else ''}" if runs else "no dump yet (waiting)"
    where = ", ".join(str(d) for d in server.runs.logdirs)
    print(f"nanscope serve: {where} ({found})", flush=True)
    if not is_loopback(args.host):
        print(
            f"nanscope serve: listening on {args.host}: the page needs the token in the URL; "
            "whoever has the URL can read these dumps and their source files (plain HTTP)",
            file=sys.stderr,
        )
    print(f"nanscope serve: open {server.url}  (Ctrl+C to stop)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.close()
    return 0
