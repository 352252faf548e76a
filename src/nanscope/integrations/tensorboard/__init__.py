"""nanscope as a TensorBoard dynamic plugin: ``tensorboard --logdir LOGDIR`` gets a "nanscope"
tab showing nanscope's page for the tfdbg2 dumps under ``LOGDIR``.

Registered through the ``tensorboard_plugins`` entry point (``pyproject.toml``), so installing
nanscope is all it takes. TensorBoard imports this module; nothing else does (importing
``nanscope`` does not import TensorBoard), and it never imports TensorFlow: TensorBoard without
TensorFlow (its reduced mode) serves the tab.

Routes, under ``/data/plugin/nanscope``:

- ``/entry.js``: the ES module TensorBoard runs in the tab's iframe; it navigates the iframe to
  ``index.html``.
- ``/*``: nanscope's WSGI app (:class:`nanscope.server.app.App`) over a
  :class:`~nanscope.server.runs.RunSet` of TensorBoard's logdir: the page
  (``/index.html``, ``/static/...``) and its JSON API (``/api/...``), the same as
  ``nanscope serve`` answers at its root.

nanscope's rules hold here as in ``nanscope serve``: only ``GET``, only source files the dump
recorded, nothing from a dump executed, the page under its own Content-Security-Policy. While
TensorBoard listens on loopback only (its default), requests must name a loopback host
(``--nanscope_allow_host NAME`` adds one, e.g. a proxy's), so that a web page elsewhere cannot
read the dumps through DNS rebinding; bound beyond loopback (``--bind_all``, ``--host``),
the tab is open to whoever can reach TensorBoard, like TensorBoard's other data.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tensorboard.plugins import base_plugin

from nanscope.format import files
from nanscope.server.app import LOOPBACK_NAMES, App
from nanscope.server.runs import RunSet

__all__ = ["PLUGIN_NAME", "NanscopeLoader", "NanscopePlugin"]

PLUGIN_NAME = "nanscope"
# Where TensorBoard mounts this plugin's routes (below its own --path_prefix, if any).
ROUTE_PREFIX = f"/data/plugin/{PLUGIN_NAME}"
ENTRY_JS = Path(__file__).with_name("entry.js")
# How long is_active() and the first request wait for the first walk of the logdir; a larger
# logdir is reported active once its walk is done (TensorBoard asks again on each reload).
FIRST_SCAN_WAIT_S = 5.0
# TensorBoard's default --reload_interval, used when it is unset or 0 ("load once").
DEFAULT_RELOAD_S = 5.0


class _Logdir:
    """TensorBoard's logdir as a :class:`RunSet`, opened on a background thread (a large logdir
    takes a while to walk, and TensorBoard must start at once), then kept fresh by the run
    set's watcher thread."""

    def __init__(self, logdir: str | None, refresh_interval: float) -> None:
        self.logdir = logdir
        self.refresh_interval = refresh_interval
        self.runs: RunSet | None = None
        self.error: str | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._open, daemon=True, name="nanscope-tb-logdir")
        self._thread.start()

    def _open(self) -> None:
        try:
            if not self.logdir:
                raise files.DumpNotFoundError(
                    "TensorBoard was started without --logdir: nanscope shows the dumps under it"
                )
            runs = RunSet(self.logdir, self.refresh_interval)
            runs.watch()
            self.runs = runs
        except (files.DumpNotFoundError, OSError) as exc:  # e.g. gs://...: not a local directory
            self.error = str(exc)
        finally:
            self._ready.set()
        if self.runs is not None:
            self.runs.preload()  # the first page shows without waiting for the readers

    def get(self, timeout: float | None = FIRST_SCAN_WAIT_S) -> RunSet | None:
        """The run set, once the first walk is done (``None`` before, or when there is none)."""
        self._ready.wait(timeout)
        return self.runs


def _refresh_interval(flags: Any) -> float:
    """Seconds between looks for new runs and new events: TensorBoard's ``--reload_interval``
    (at least 1 s, so that the watcher never spins)."""
    value = getattr(flags, "reload_interval", None)
    if not value or value <= 0:
        return DEFAULT_RELOAD_S
    return max(1.0, float(value))


def _is_loopback_host(host: str | None) -> bool:
    if host in (None, "", "localhost"):  # TensorBoard's default binds localhost
        return True
    try:
        return ipaddress.ip_address(str(host).strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(flags: Any) -> frozenset[str] | None:
    """The ``Host`` names the plugin answers to: loopback names (and ``--nanscope_allow_host``)
    while TensorBoard listens on loopback only, any (``None``) when it listens beyond it."""
    if getattr(flags, "bind_all", False) or not _is_loopback_host(getattr(flags, "host", None)):
        return None
    extra = getattr(flags, "nanscope_allow_host", None) or ()
    return LOOPBACK_NAMES | {str(h).lower() for h in extra}


def _json_error(message: str, status: str, start_response: Any) -> Iterable[bytes]:
    body = json.dumps({"error": message}).encode()
    start_response(
        status,
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
        ],
    )
    return [body]


class _MountedApp:
    """nanscope's WSGI app, answering below :data:`ROUTE_PREFIX`.

    TensorBoard hands a plugin's app the whole path; the prefix moves to ``SCRIPT_NAME`` so
    that nanscope's routes (``/``, ``/static/...``, ``/api/...``) match as in ``nanscope serve``.
    """

    def __init__(self, logdir: _Logdir, hosts: frozenset[str] | None) -> None:
        self._logdir = logdir
        self._hosts = hosts
        self._app: App | None = None
        self._lock = threading.Lock()

    def _nanscope_app(self) -> App | None:
        runs = self._logdir.get()
        if runs is None:
            return None
        with self._lock:
            if self._app is None:
                self._app = App(runs, self._hosts)
            return self._app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        if not path.startswith(ROUTE_PREFIX + "/"):
            return _json_error(f"no such route: {path}", "404 Not Found", start_response)
        rest = path[len(ROUTE_PREFIX) :]
        # TensorBoard routes no path ending in "/" here, so the page is index.html.
        if rest == "/index.html":
            rest = "/"
        app = self._nanscope_app()
        if app is None:
            why = self._logdir.error or "still looking for dumps under the logdir; try again"
            return _json_error(why, "404 Not Found", start_response)
        environ = {
            **environ,
            "SCRIPT_NAME": str(environ.get("SCRIPT_NAME", "")) + ROUTE_PREFIX,
            "PATH_INFO": rest,
        }
        return app(environ, start_response)


def _serve_entry(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    body = ENTRY_JS.read_bytes()
    start_response(
        "200 OK",
        [
            ("Content-Type", "text/javascript; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
        ],
    )
    return [body]


class NanscopePlugin(base_plugin.TBPlugin):  # type: ignore[misc]  # TensorBoard is untyped
    """The "nanscope" tab: nanscope's page and API for the tfdbg2 dumps under the logdir.

    Active when a dump is found under ``context.logdir`` (walked on a background thread,
    then watched: a dump written later activates the tab at TensorBoard's next reload).
    """

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        flags = getattr(context, "flags", None)
        self._logdir = _Logdir(getattr(context, "logdir", None), _refresh_interval(flags))
        self._app = _MountedApp(self._logdir, allowed_hosts(flags))

    def is_active(self) -> bool:
        """Whether a tfdbg2 dump (nanscope's or TensorFlow's) is under the logdir; cheap once
        the first walk is done (the run set's watcher keeps the answer fresh)."""
        runs = self._logdir.get()
        return runs is not None and bool(runs.names())

    def get_plugin_apps(self) -> dict[str, Any]:
        """The ES module of the tab, and nanscope's app for everything else below the route."""
        return {"/entry.js": _serve_entry, "/*": self._app}

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        """An iframe tab named "nanscope", loaded by ``entry.js``; the page polls for new data
        itself, so TensorBoard's reload button is not offered."""
        return base_plugin.FrontendMetadata(
            es_module_path="/entry.js", tab_name=PLUGIN_NAME, disable_reload=True
        )


class NanscopeLoader(base_plugin.TBLoader):  # type: ignore[misc]  # TensorBoard is untyped
    """What the ``tensorboard_plugins`` entry point names: adds the plugin's flag and makes
    the plugin."""

    def define_flags(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--nanscope_allow_host",
            action="append",
            default=[],
            metavar="NAME",
            help="a Host name (e.g. a proxy's) the nanscope tab answers to while TensorBoard "
            "listens on loopback only (where it answers to loopback names alone); repeatable",
        )

    def load(self, context: base_plugin.TBContext) -> NanscopePlugin:
        return NanscopePlugin(context)
