"""Shared fixtures, and the session's JAX compilation cache."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

import nanscope

# JAX programs compiled once per test session, in this process and in the ones the tests
# start (``nanscope run``): switching recording on clears JAX's in-memory caches, so every
# test would compile the same programs (plain and instrumented) again. Compiling takes most
# of the JAX tests' time; what a program computes and records does not change.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _jax_cache = tempfile.mkdtemp(prefix="nanscope-tests-jax-cache-")
    atexit.register(shutil.rmtree, _jax_cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _jax_cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.fixture(autouse=True)
def _nothing_left_enabled() -> Iterator[None]:
    """A failing test must not leave recording or checking on for the next one."""
    yield
    nanscope.disable_dump_debug_info()
    nanscope.disable_check_numerics()


@pytest.fixture(params=["python", "native"])
def recorder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each PyTorch recorder in turn (the native one where it builds): a test that takes
    it runs under both."""
    from nanscope.backends.torch.native import native_library

    if request.param == "native" and native_library() is None:
        pytest.skip("the native recorder cannot be built here")
    monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", request.param)
    return str(request.param)


def pytest_configure(config: pytest.Config) -> None:
    """Where the browser tests must run (``make test``, CI: ``NANSCOPE_REQUIRE_BROWSER``),
    stop before any test when what they need is missing, saying what and how to get it,
    instead of skipping them. ``scripts/browser`` installs it where it can."""
    if not os.environ.get("NANSCOPE_REQUIRE_BROWSER"):
        return
    from .helpers import CHROMIUM

    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("Playwright's Python package (pip install -e '.[dev]')")
    if not os.path.exists(CHROMIUM):
        missing.append(f"Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    if missing:
        raise pytest.UsageError(
            "NANSCOPE_REQUIRE_BROWSER is set but the GUI's browser tests cannot run: missing "
            + " and ".join(missing)
            + "; scripts/browser installs them where it can, or `make test SKIP_BROWSER=1` "
            "skips these tests knowingly"
        )
