"""Binding and running the HTTP server (the standard library's WSGI server, one thread per
connection, one request per connection).

A connection gets ``connection_timeout`` seconds for each read and write, and at most
``max_connections`` are open at once (fewer when the process may open few descriptors).
When the cap is reached, the connection open longest without having sent a whole
request is closed to make room: idle or slow clients cannot keep others out. When
every open connection has a request in progress, a new one is answered 503 at once.
"""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import logging
import os
import secrets
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import IO, Any, cast
from urllib.parse import quote
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

from nanscope.server.app import LOOPBACK_NAMES, App
from nanscope.server.runs import RunSet

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6007
# Seconds a connection may take for each read or write (a request line, a header, a
# response chunk) before it is closed.
CONNECTION_TIMEOUT = 20.0
# Connections open at once, at most (see connection_cap).
MAX_CONNECTIONS = 128
# Connections the kernel queues before they are accepted: a burst of clients must not
# overflow it (an overflow costs a client a 1 s SYN retransmission).
LISTEN_BACKLOG = 1024
# The environment variable that fixes the token of a server bound beyond loopback.
TOKEN_ENV = "NANSCOPE_TOKEN"

_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n\r\n"
    b'{"error":"the server is busy answering other requests; try again"}'
)

log = logging.getLogger("nanscope.server")


class ServeError(Exception):
    """The server cannot start (the message says why and what to do)."""


def connection_cap(requested: int = MAX_CONNECTIONS) -> int:
    """``requested``, lowered to half the descriptors this process may open (the other
    half is for the dumps' files and the rest of the process)."""
    try:
        import resource
    except ImportError:  # Windows: no descriptor limit to respect
        return requested
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return requested
    return min(requested, max(4, (int(soft) - 32) // 2))


class _Handler(WSGIRequestHandler):
    """wsgiref's handler with a timeout per socket operation, quiet, and telling the server
    when a whole request has arrived (from then on its connection is not closed for room)."""

    server: _ThreadingServer

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would drown the terminal

    def get_stderr(self) -> Any:
        # wsgiref writes tracebacks of failed writes (a client gone, a timeout) here; the
        # application reports its own errors through logging.
        return io.StringIO()

    def handle(self) -> None:
        # wsgiref's handle(), with the connection marked busy once its request is read.
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        if not self.server.mark_busy(self.connection):
            return  # closed for room meanwhile
        app = self.server.get_app()
        assert app is not None
        wfile = cast(IO[bytes], self.wfile)  # a socket writer, typed loosely by typeshed
        handler = ServerHandler(
            self.rfile, wfile, self.get_stderr(), self.get_environ(), multithread=True
        )
        handler.request_handler = self  # type: ignore[attr-defined]  # wsgiref's back pointer
        handler.run(app)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = os.name != "nt"  # on Windows it would let two servers share a port
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], max_connections: int, timeout: float) -> None:
        self.max_connections = connection_cap(max_connections)
        self.connection_timeout = timeout
        # Open connections, oldest first -> whether a request is in progress on it.
        self._open: dict[socket.socket, bool] = {}
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def _evict_idle(self) -> bool:
        """Close the oldest connection without a request in progress (call with the lock)."""
        for sock, busy in self._open.items():
            if not busy:
                del self._open[sock]
                # Its thread, waiting in recv(), sees the end of the stream and closes it.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                return True
        return False

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            sock, address = super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors
                with self._open_lock:
                    evicted = self._evict_idle()
                if not evicted:
                    time.sleep(0.05)  # wait for a request to finish instead of spinning
            raise
        sock.settimeout(self.connection_timeout)  # for each read and write of the handler
        return sock, address

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._open_lock:
            if len(self._open) < self.max_connections or self._evict_idle():
                self._open[request] = False
                return True
        with contextlib.suppress(OSError):
            request.sendall(_BUSY)  # a fresh socket's buffer takes it without blocking
        return False

    def mark_busy(self, sock: socket.socket) -> bool:
        """Note that ``sock`` has sent its request; False when it was closed for room."""
        with self._open_lock:
            if sock not in self._open:
                return False
            self._open[sock] = True
            return True

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out, went away or was closed for room is no error of ours.
        if not isinstance(sys.exc_info()[1], OSError):
            log.exception("request from %s failed", client_address)


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class Server:
    """A running ``nanscope serve``: its URL, and :meth:`close` to stop it.

    Bound to loopback (the default), it answers only to loopback names and addresses
    (any of 127.0.0.0/8, so the URL of a server bound to 127.0.0.2 works) and asks
    for no token. Bound beyond loopback, every request must carry ``token`` (random
    unless given; :attr:`url` holds it): as ``?token=`` (opening the page with it sets
    a cookie, so the page's own requests carry it), in that cookie, or as an
    ``Authorization: token ...`` header. It then answers to IP addresses, this
    machine's name, loopback names and ``allow_hosts``, not to other names, so that
    a web page elsewhere cannot reach it through DNS rebinding.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        allow_hosts: Iterable[str] = (),
        max_connections: int = MAX_CONNECTIONS,
        connection_timeout: float = CONNECTION_TIMEOUT,
    ) -> None:
        self.runs = RunSet(logdir)
        cls = _ThreadingServer6 if ":" in host.strip("[]") else _ThreadingServer
        try:
            self._httpd = cls((host.strip("[]"), port), max_connections, connection_timeout)
        except OSError as exc:
            self.runs.close()
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
        self.host = host
        self.port = int(self._httpd.server_address[1])
        loopback = is_loopback(host)
        if token is None and not loopback:
            token = secrets.token_urlsafe(24)
        self.token = token or None
        names = set(LOOPBACK_NAMES) | {h.lower() for h in allow_hosts}
        if not loopback:
            names.add(socket.gethostname().lower())
            if not _is_ip(host) and host not in ("", "0.0.0.0", "::", "[::]"):
                names.add(host.lower())
        app = App(
            self.runs,
            frozenset(names),
            token=self.token,
            any_ip=not loopback,
            # One cookie per port, so that two servers on one machine keep their own.
            cookie_name=f"nanscope_token_{self.port}",
        )
        self._httpd.set_app(app)
        self._thread: threading.Thread | None = None

    @property
    def max_connections(self) -> int:
        """Connections served at once (after :func:`connection_cap`)."""
        return self._httpd.max_connections

    @property
    def url(self) -> str:
        """The page's URL, with the token when one is required."""
        name = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        if name in ("0.0.0.0", "[::]", ""):
            name = socket.gethostname()
        query = f"?token={quote(self.token, safe='')}" if self.token else ""
        return f"http://{name}:{self.port}/{query}"

    def serve_forever(self) -> None:
        # Readers open in the background so the page can load at once.
        threading.Thread(target=self.runs.preload, daemon=True, name="nanscope-preload").start()
        self.runs.watch()
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
    logdir: str | os.PathLike[str], host: str = DEFAULT_HOST, port: int = 0, **options: Any
) -> Server:
    """Start serving ``logdir`` in the background; ``port=0`` picks a free port.

    ``options`` are :class:`Server`'s (``token``, ``allow_hosts``, ...).
    """
    return Server(logdir, host, port, **options).start()
