"""The PyTorch backend's entry points (:class:`nanscope.backends.Entry`).

Imported only when a PyTorch program turns dumping or checking on; each imports its
session, and so torch, when called.
"""

from __future__ import annotations

from typing import Any

from nanscope.backends import Checking, DumpSettings, Session


def start_dump(settings: DumpSettings, options: dict[str, Any]) -> Session:
    """Record every ATen op (eager and ``torch.compile``'d) into a dump."""
    from nanscope.backends.torch.session import TorchDumpSession

    return TorchDumpSession(**settings.recording(), **options)


def start_checking(sync_every: int) -> Checking:
    """Raise at the first NaN or harmful Inf; on accelerators look every ``sync_every`` ops."""
    from nanscope.backends.torch.check_numerics import TorchCheckNumerics

    return TorchCheckNumerics(sync_every)
