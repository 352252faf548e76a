"""What the integrations call harmful: one check, shared by every trainer's callback."""

from __future__ import annotations

import math
from typing import Any


def all_finite(tensors: list[Any]) -> bool:
    """Whether every value of ``tensors`` is finite, without a host sync per tensor.

    Per device and dtype, one fused 2-norm of every tensor (``torch._foreach_norm``, which
    NaN and ±inf make non-finite; low-precision tensors are summed in float32), then one
    host sync. A 2-norm also overflows for huge finite values: only then the exact check,
    a max-abs (ord=inf, which cannot overflow but is ~15x slower on a CPU), decides.

    Not recorded: these ops are nanscope's, not the training program's.
    """
    import torch

    from nanscope.backends.torch.suspension import not_recorded

    groups: dict[tuple[Any, Any], list[Any]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    with not_recorded(), torch.no_grad():
        for (_, dtype), ts in groups.items():
            wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None
            if bool(torch.isfinite(torch.stack(torch._foreach_norm(ts, 2, dtype=wide)).max())):
                continue
            peak = torch.stack(torch._foreach_norm(ts, math.inf)).max()
            if not bool(torch.isfinite(peak)):
                return False
    return True
