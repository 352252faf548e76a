"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import nanscope


@pytest.fixture(autouse=True)
def _nothing_left_enabled() -> Iterator[None]:
    """A failing test must not leave recording or checking on for the next one."""
    yield
    nanscope.disable_dump_debug_info()
    nanscope.disable_check_numerics()
