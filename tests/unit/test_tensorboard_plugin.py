"""The TensorBoard plugin in-process: activity, routes below the plugin's prefix, hosts.

The plugin's apps are called through werkzeug's test client with the paths TensorBoard hands
them; ``tests/integration/test_tensorboard_plugin.py`` runs a real TensorBoard and a browser.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

base_plugin = pytest.importorskip("tensorboard.plugins.base_plugin")

from werkzeug.test import Client  # noqa: E402

from nanscope.integrations.tensorboard import (  # noqa: E402
    NanscopeLoader,
    NanscopePlugin,
    allowed_hosts,
)

from ..helpers import write_small_dump  # noqa: E402

PREFIX = "/data/plugin/nanscope"


def flags(**kwargs: Any) -> argparse.Namespace:
    """TensorBoard's flags as its parser makes them, with the loader's flag."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default=None)
    parser.add_argument("--bind_all", action="store_true")
    parser.add_argument("--reload_interval", type=float, default=5.0)
    NanscopeLoader().define_flags(parser)
    ns = parser.parse_args([])
    for k, v in kwargs.items():
        setattr(ns, k, v)
    return ns


def plugin(logdir: Path | None, **flag_values: Any) -> NanscopePlugin:
    context = base_plugin.TBContext(
        logdir=None if logdir is None else str(logdir), flags=flags(**flag_values)
    )
    made: NanscopePlugin = NanscopeLoader().load(context)
    return made


def client(p: NanscopePlugin) -> Client:
    return Client(p.get_plugin_apps()["/*"])


def test_active_only_with_a_dump(tmp_path: Path) -> None:
    assert not plugin(tmp_path).is_active()
    write_small_dump(tmp_path / "run1")
    p = plugin(tmp_path)
    assert p.is_active()
    meta = p.frontend_metadata()
    assert (meta.es_module_path, meta.tab_name) == ("/entry.js", "nanscope")


def test_without_a_local_logdir_the_tab_is_inactive_and_says_why(tmp_path: Path) -> None:
    for logdir in (None, tmp_path / "missing"):
        p = plugin(logdir)
        assert not p.is_active()
        resp = client(p).get(f"{PREFIX}/api/runs")
        assert resp.status_code == 404 and "logdir" in json.loads(resp.data)["error"]


def test_routes_below_the_prefix(tmp_path: Path) -> None:
    write_small_dump(tmp_path / "run1")
    c = client(plugin(tmp_path))
    runs = json.loads(c.get(f"{PREFIX}/api/runs").data)["runs"]
    assert [r["run"] for r in runs] == ["run1"]
    page = c.get(f"{PREFIX}/index.html")
    assert page.status_code == 200 and b'src="static/app.js"' in page.data
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert c.get(f"{PREFIX}/static/api.js").status_code == 200
    assert c.get("/data/plugin/other/api/runs").status_code == 404
    entry = plugin(tmp_path).get_plugin_apps()["/entry.js"]
    resp = Client(entry).get(f"{PREFIX}/entry.js")
    assert resp.headers["Content-Type"].startswith("text/javascript")
    assert b"index.html" in resp.data


def test_hosts_follow_where_tensorboard_listens(tmp_path: Path) -> None:
    write_small_dump(tmp_path / "run1")
    c = client(plugin(tmp_path, nanscope_allow_host=["Proxy.Example"]))
    for host, status in (("localhost:6006", 200), ("proxy.example", 200), ("evil.example", 403)):
        assert c.get(f"{PREFIX}/api/runs", headers={"Host": host}).status_code == status
    assert allowed_hosts(flags()) is not None
    assert allowed_hosts(flags(host="::1")) is not None
    assert allowed_hosts(flags(bind_all=True)) is None
    assert allowed_hosts(flags(host="0.0.0.0")) is None
