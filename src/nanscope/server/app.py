"""The WSGI application: routes ``/api/*`` to the handlers, serves the page's static files.

Read-only by construction: only ``GET``/``HEAD`` are routed. Every error is a
JSON ``{"error": ...}`` with a 4xx status; an unexpected failure in a handler is
a 500 with a one-line message, never a traceback to the page.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import mimetypes
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from nanscope.server.api import ROUTES
from nanscope.server.query import ApiError, Query
from nanscope.server.runs import RunSet

STATIC_DIR = Path(__file__).parent / "static"
# What a file of the page may be called: a plain name, no folder, not hidden, not long.
# Anything else is no file of the page, so 404 without asking the file system (which
# answers a 300-character name with an error, not with "no such file").
_STATIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
# The page's scripts and styles come from this server only; nothing is loaded from elsewhere.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'"
)

log = logging.getLogger("nanscope.server")


def _json_response(body: Any, status: int = 200) -> Response:
    text = json.dumps(body, allow_nan=False, separators=(",", ":"))
    resp = Response(text, status=status, mimetype="application/json")
    resp.headers["Cache-Control"] = "no-store"
    # Also what TensorBoard's security validator asks of every response it serves.
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


class App:
    """The WSGI callable for one logdir.

    ``allowed_hosts``: the ``Host`` header values (without port) accepted; ``None``
    accepts any; with ``any_ip``, any IP address is accepted too (a page whose origin
    is an IP address is this server's own page), and a loopback address always is. A
    server bound to loopback accepts only loopback names and addresses, so a web page
    elsewhere cannot reach it through DNS rebinding.

    ``token``: when set, every request must carry it, as the ``token`` query parameter,
    the ``cookie_name`` cookie or an ``Authorization: token <token>`` header. The page
    opened with ``?token=`` sets the cookie and redirects to itself without it, so that
    the token leaves the address bar and the page's own requests carry the cookie.
    """

    def __init__(
        self,
        runs: RunSet,
        allowed_hosts: frozenset[str] | None = LOOPBACK_NAMES,
        *,
        token: str | None = None,
        any_ip: bool = False,
        cookie_name: str = "nanscope_token",
    ) -> None:
        self.runs = runs
        self.allowed_hosts = allowed_hosts
        self.any_ip = any_ip
        self.token = token
        self.cookie_name = cookie_name
        rules = [Rule(path, endpoint=path, methods=["GET"]) for path in ROUTES]
        rules += [
            Rule("/", endpoint="index", methods=["GET"]),
            Rule("/static/<path:name>", endpoint="static", methods=["GET"]),
        ]
        self.url_map = Map(rules, strict_slashes=False, merge_slashes=False)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        request = Request(environ)
        response = self.dispatch(request)
        return response(environ, start_response)

    def _host_ok(self, request: Request) -> bool:
        if self.allowed_hosts is None:
            return True
        host = request.host.lower()
        if host.startswith("["):  # [::1]:port
            name = host.split("]")[0] + "]"
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if name in self.allowed_hosts:
            return True
        try:
            ip = ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return False  # a name not allowed: a page elsewhere may have rebound it to us
        # An address is no DNS name, so no rebinding: a loopback one is this machine, which
        # is how a server bound to 127.0.0.2 (any of 127.0.0.0/8) is opened.
        return self.any_ip or ip.is_loopback

    def _token_ok(self, request: Request) -> bool:
        if self.token is None:
            return True
        auth = request.headers.get("Authorization", "")
        scheme, _, value = auth.partition(" ")
        for given in (
            request.args.get("token"),
            request.cookies.get(self.cookie_name),
            value.strip() if scheme.lower() in ("token", "bearer") else None,
        ):
            # Compared in constant time: the answer's timing says nothing of the token.
            if given and hmac.compare_digest(given.encode(), self.token.encode()):
                return True
        return False

    def dispatch(self, request: Request) -> Response:
        if not self._host_ok(request):
            if self.any_ip:
                how = "by this machine's address or name, or start the server with --allow-host"
            else:
                how = "via 127.0.0.1 or the loopback address that nanscope serve printed"
            return _json_response(
                {"error": f"host {request.host!r} is not served here; open the page {how}"}, 403
            )
        if not self._token_ok(request):
            return _json_response(
                {
                    "error": "this server needs its token: open the URL that nanscope serve "
                    "printed (it ends in ?token=...)"
                },
                401,
            )
        if self.token is not None and "token" in request.args and request.path == "/":
            # Keep the token in a cookie and take it out of the address bar and history.
            resp = Response(status=303, headers={"Location": "/", "Cache-Control": "no-store"})
            resp.set_cookie(self.cookie_name, self.token, httponly=True, samesite="Lax")
            return resp
        adapter = self.url_map.bind_to_environ(request.environ)
        try:
            endpoint, args = adapter.match()
        except MethodNotAllowed:
            return _json_response({"error": "the API is read-only: use GET"}, 405)
        except NotFound:
            return _json_response({"error": f"no such route: {_clip(request.path)}"}, 404)
        except HTTPException as exc:  # e.g. a redirect for a trailing slash
            return exc.get_response(request.environ)
        if endpoint == "index":
            return self._static("index.html")
        if endpoint == "static":
            return self._static(str(args["name"]))
        try:
            body = ROUTES[endpoint](self.runs, Query(request.args), args)
        except ApiError as exc:
            return _json_response({"error": exc.message}, exc.status)
        except Exception as exc:  # a bug or a damaged dump: report, keep serving
            log.exception("%s failed", request.full_path)
            return _json_response(
                {"error": f"internal error in {request.path}: {type(exc).__name__}: {exc}"}, 500
            )
        return _json_response(body)

    def _static(self, name: str) -> Response:
        """A file of the page: only a plain name of a file in :data:`STATIC_DIR` (404 else)."""
        if not _static_exists(name):
            return _json_response({"error": f"no such file: /static/{_clip(name)}"}, 404)
        path = STATIC_DIR / name
        mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if name.endswith((".js", ".mjs")):
            mime = "text/javascript"
        resp = Response(path.read_bytes(), mimetype=mime)
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Cache-Control"] = "no-cache"
        return resp


def _static_exists(name: str) -> bool:
    """Whether ``name`` is a plain name of a regular file directly in :data:`STATIC_DIR`."""
    if not _STATIC_NAME.fullmatch(name):
        return False
    try:
        # The listing, not the name, is what is looked up: no name reaches open() unless it
        # is one of the page's files.
        with os.scandir(STATIC_DIR) as entries:
            return any(e.name == name and e.is_file() for e in entries)
    except OSError:
        return False


def _clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters for an error message (a path may be 64 KB)."""
    return text if len(text) <= limit else text[:limit] + "..."
