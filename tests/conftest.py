"""Shared fixtures, and the session's JAX compilation cache."""

from __future__ import annotations

import atexit
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
