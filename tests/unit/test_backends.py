"""The table of backends: how a framework is chosen, and the entry points the API calls."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import nanscope
from nanscope import backends
from nanscope.backends import BACKENDS, FRAMEWORKS, RECORDED, Backend, DumpSettings, detect

FRAMEWORK_MODULES = ("torch", "tensorflow", "jax", "jaxlib", "keras")


def test_every_framework_is_in_the_one_table() -> None:
    assert list(BACKENDS) == ["torch", "tensorflow", "jax"]
    assert FRAMEWORKS == {"torch": True, "tensorflow": True, "jax": True}
    assert RECORDED == ("torch", "tensorflow", "jax")


def test_an_unknown_framework_is_refused_naming_the_known_ones() -> None:
    message = "unknown framework 'mxnet'; use one of: auto, torch, tensorflow, jax"
    with pytest.raises(ValueError, match=message):
        detect("mxnet")
    with pytest.raises(ValueError, match=message):
        nanscope.enable_check_numerics(framework="mxnet")
    with pytest.raises(ValueError, match=message):
        nanscope.enable_dump_debug_info("unused", framework="mxnet")


def test_auto_takes_the_framework_the_program_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in BACKENDS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    assert detect() == "jax"
    assert backends.backend().name == "jax"


def test_each_entry_module_defines_the_entry_points_and_imports_no_framework() -> None:
    entries = [b.entry for b in BACKENDS.values()]
    code = (
        "import importlib, sys\n"
        f"for name in {entries!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert callable(module.start_dump) and callable(module.start_checking), name\n"
        f"print([m for m in {FRAMEWORK_MODULES!r} if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


class _FakeSession:
    framework = "jax"

    def __init__(self, calls: list[Any], what: Any) -> None:
        self.calls = calls
        calls.append(("start", what))

    def flush(self) -> None:
        self.calls.append(("flush", None))

    def close(self) -> None:
        self.calls.append(("close", None))


def test_the_api_calls_the_backends_entry_points(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[Any] = []
    entry = types.ModuleType("nanscope_test_entry")
    entry.start_dump = lambda settings, options: _FakeSession(calls, (settings, options))  # type: ignore[attr-defined]
    entry.start_checking = lambda sync_every: _FakeSession(calls, sync_every)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, entry.__name__, entry)
    monkeypatch.setitem(BACKENDS, "jax", Backend("jax", entry.__name__))

    session = nanscope.enable_dump_debug_info(
        tmp_path, "CURT_HEALTH", 7, framework="jax", flush_interval=2
    )
    settings = DumpSettings(
        str(tmp_path), nanscope.TensorDebugMode.CURT_HEALTH, 7, None, None, "jax"
    )
    assert calls == [("start", (settings, {"flush_interval": 2}))]
    session.flush()
    nanscope.disable_dump_debug_info()
    assert calls[1:] == [("flush", None), ("close", None)]

    calls.clear()
    nanscope.enable_check_numerics(framework="jax", sync_every=5)
    nanscope.enable_check_numerics(framework="jax", sync_every=5)  # idempotent
    nanscope.disable_check_numerics()
    assert calls == [("start", 5), ("close", None)]


def test_a_framework_without_a_backend_is_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "jax", Backend("jax", None))
    with pytest.raises(NotImplementedError, match="check_numerics for jax is not supported yet"):
        nanscope.enable_check_numerics(framework="jax")
    with pytest.raises(NotImplementedError, match="dumping jax programs is not supported yet"):
        nanscope.enable_dump_debug_info("unused", framework="jax")
