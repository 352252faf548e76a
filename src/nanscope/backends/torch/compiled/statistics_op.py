"""``nanscope_stats::statistics``: one value's statistics, as an op that compiled graphs call.

With statistics asked for (FULL_HEALTH), :mod:`.rewrite` adds one call of this op per
instrumented value of a ``torch.compile`` graph (a view of a value shares its base's:
the hash does not depend on the layout), each a graph output of its own. Inductor
runs it as an extern kernel: on the CPU the native recorder's statistics kernel where
the extension is loaded, else the device ops of
:func:`nanscope.backends.torch.summaries.device_statistics` (on the value's device,
never synchronised). Its result: ``[mean, std, l2, hash]`` as float64
(:mod:`nanscope.format.statistics`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_lock = threading.Lock()
_op: Any = None


def statistics_op() -> Any:
    """The op (registered with PyTorch the first time it is asked for)."""
    global _op
    with _lock:
        if _op is None:
            _op = _register()
        return _op


def _register() -> Any:
    from nanscope.backends.torch.summaries import device_statistics, without_broadcast

    @torch.library.custom_op("nanscope_stats::statistics", mutates_args=())
    def statistics(x: torch.Tensor) -> torch.Tensor:
        if x.is_cpu:
            native = _native()
            if native is not None:
                return native(x)  # type: ignore[no-any-return]
        base, repeats = without_broadcast(x.detach())
        return device_statistics(base.reshape(-1), repeats)

    @statistics.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((4,), dtype=torch.float64)

    return torch.ops.nanscope_stats.statistics.default


def _native() -> Any:
    """``nanscope_graph::statistics`` where the native extension is loaded, else ``None``."""
    from nanscope.backends.torch import native

    if native.loaded() is None:
        return None
    try:
        return torch.ops.nanscope_graph.statistics.default
    except (AttributeError, RuntimeError):  # an extension built before the op existed
        return None
