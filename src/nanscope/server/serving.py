"""Binding and running the HTTP server (the standard library's WSGI server, one thread per request)."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import socketserver
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from nanscope.server.app import LOOPBACK_NAMES, App
from nanscope.server.runs import RunSet

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6007


class ServeError(Exception):
    """The server cannot start (the message says why and what to do)."""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would drown the terminal


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = os.name != "nt"  # on Windows it would let two servers share a port


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Server:
    """A running ``nanscope serve``: its URL, and :meth:`close` to stop it."""

    def __init__(self, logdir: str | os.PathLike[str], host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT) -> None:  # fmt: skip
        self.runs = RunSet(logdir)
        app = App(self.runs, LOOPBACK_NAMES if is_loopback(host) else None)
        cls = _ThreadingServer6 if ":" in host.strip("[]") else _ThreadingServer
        try:
            self._httpd = cls((host.strip("[]"), port), _QuietHandler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServeError(
                    f"port {port} on {host} is in use; pick another with --port "
                    "(--port 0 picks a free one)"
                ) from None
            if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME):
                raise ServeError(
                    f"cannot listen on {host}: not an address of this machine"
                ) from None
            if exc.errno == errno.EACCES:
                raise ServeError(
                    f"not allowed to listen on port {port}; use a port above 1023"
                ) from None
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._httpd.set_app(app)
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        name = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        if name in ("0.0.0.0", "[::]"):
            name = socket.gethostname()
        return f"http://{name}:{self.port}/"

    def serve_forever(self) -> None:
        # Readers open in the background so the page can load at once.
        threading.Thread(target=self.runs.preload, daemon=True, name="nanscope-preload").start()
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> Server:
        """Serve from a daemon thread (for notebooks and tests); returns ``self``."""
        self._thread = threading.Thread(
            target=self.serve_forever, daemon=True, name="nanscope-serve"
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()
        self.runs.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_in_thread(
    logdir: str | os.PathLike[str], host: str = DEFAULT_HOST, port: int = 0
) -> Server:
    """Start serving ``logdir`` in the background; ``port=0`` picks a free port."""
    return Server(logdir, host, port).start()
