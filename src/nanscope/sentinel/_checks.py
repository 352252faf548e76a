"""The sentinel's fused reductions: a few kernels over all gradients, parameters or state.

Each function returns 0-d float32 tensors on the device of the values, without a host
sync: the sentinel stacks what a step measured and reads it with one ``tolist()``.

On a CPU a 2-norm over a list of tensors (``torch._foreach_norm(ts, 2)``) reads them
at memory speed, while the exact largest ``|x|`` (``ord=inf``) is ~15x slower there;
so the per-step check is the 2-norm (NaN and ±inf make it non-finite) and the largest
``|x|`` is measured on a cadence and whenever the 2-norm is not finite (a 2-norm also
overflows on huge finite values: the largest ``|x|``, which cannot, then decides).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def floating(tensors: Iterable[Any]) -> list[torch.Tensor]:
    """The floating, non-empty tensors of ``tensors`` (sparse ones by their values)."""
    out = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.is_sparse:
            t = t._values()
        if t.is_floating_point() and t.numel() > 0:
            out.append(t)
    return out


def _groups(tensors: Sequence[torch.Tensor]) -> dict[tuple[Any, Any], list[torch.Tensor]]:
    groups: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


def _gather(parts: list[torch.Tensor], device: torch.device | None) -> torch.Tensor:
    return torch.stack([p.float().to(device, non_blocking=True) for p in parts])


def total_norm(tensors: Sequence[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """The L2 norm over every value of ``tensors`` (0-d float32; 0 when there are none)."""
    if not tensors:
        return torch.zeros((), device=device)
    first = tensors[0]
    device = device or first.device
    groups = _groups(tensors)
    if len(groups) == 1 and first.dtype == torch.float32 and first.device == device:
        # The common case, in three ops: per-tensor norms, then the norm of those. (Per
        # tensor dots are faster on a CPU for gradients in cache, but cost two ops a
        # tensor: in a training step, where the gradients are not in cache, no faster.)
        norms = torch._foreach_norm(list(tensors), 2)
        total: torch.Tensor = torch.linalg.vector_norm(torch.stack(list(norms)))
        return total
    parts: list[torch.Tensor] = []
    for (_, dtype), ts in groups.items():
        wide = torch.float32 if dtype in _LOW_PRECISION else None
        parts.extend(torch._foreach_norm(ts, 2, dtype=wide))
    result: torch.Tensor = torch.linalg.vector_norm(_gather(parts, device))
    return result


def largest_abs(
    tensors: Sequence[torch.Tensor], device: torch.device | None = None
) -> torch.Tensor:
    """The largest ``|x|`` over every value of ``tensors`` (NaN if any is NaN; 0 for none).

    ``amax`` and ``amin`` per tensor (vectorised reductions: on a CPU the two together
    take ~0.6x the time of one ``aminmax``, and ``ord=inf`` norms are ~15x slower);
    both propagate NaN.
    """
    if not tensors:
        return torch.zeros((), device=device)
    device = device or tensors[0].device
    highs = []
    lows = []
    for t in tensors:
        t = t.detach()
        highs.append(t.amax())
        lows.append(t.amin())
    return torch.maximum(_gather(highs, device).max(), _gather(lows, device).min().neg())


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's floating state tensors (moments, momentum buffers; not ``step``)."""
    out: list[torch.Tensor] = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                out.append(value)
    return out


def parameters(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """Every parameter of ``optimizers`` once, in order."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


def gradients(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """The floating gradients of the optimizers' parameters."""
    return floating(p.grad for p in parameters(optimizers) if p.grad is not None)


class ParameterLists:
    """Each optimizer's parameters, listed once and again only when its groups change."""

    def __init__(self) -> None:
        self._lists: dict[int, tuple[list[int], list[torch.Tensor]]] = {}

    def floating(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """The optimizer's floating parameters."""
        key = [len(g["params"]) for g in optimizer.param_groups]
        cached = self._lists.get(id(optimizer))
        if cached is None or cached[0] != key:
            params = floating(parameters([optimizer]))
            cached = self._lists[id(optimizer)] = (key, params)
        return cached[1]

    def gradients(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """The gradients of the optimizer's floating parameters (sparse ones by their values)."""
        grads = [p.grad for p in self.floating(optimizer)]
        if all(g is not None and g.layout is torch.strided for g in grads):
            return cast(list[torch.Tensor], grads)  # every step's case: no sparse, none missing
        return [g._values() if g.is_sparse else g for g in grads if g is not None]
