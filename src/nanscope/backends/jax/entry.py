"""The JAX backend's entry points (:class:`nanscope.backends.Entry`).

Imported only when a JAX program turns dumping or checking on; each imports its
session, and so jax, when called.
"""

from __future__ import annotations

from typing import Any

from nanscope.backends import Checking, DumpSettings, Session


def start_dump(settings: DumpSettings, options: dict[str, Any]) -> Session:
    """Record every run of a compiled program (a jitted function, an eager op) into a dump."""
    from nanscope.backends.jax.session import JaxDumpSession

    return JaxDumpSession(**settings.recording(), **options)


def start_checking(sync_every: int) -> Checking:
    """Count Inf/NaN inside each run of a compiled program and raise after it
    (``sync_every`` is PyTorch's: each run is looked at)."""
    from nanscope.backends.jax.check_numerics import JaxCheckNumerics

    return JaxCheckNumerics()
