"""What the integrations call harmful, and what they say about it: shared by every
trainer's callback."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanscope.sentinel import Trip

ON_NAN = ("stop", "skip")


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


def check_sentinel_options(
    sentinel: bool, on_nan: str, snapshot_state: bool, stop_on_harmful: bool
) -> None:
    """Refuse, in one line, settings of a callback that contradict each other."""
    if on_nan not in ON_NAN:
        raise ValueError(f"on_nan={on_nan!r}: use 'stop' or 'skip'")
    if not sentinel and (on_nan != "stop" or snapshot_state):
        raise ValueError(
            "on_nan and snapshot_state are the sentinel's: pass sentinel=True with them"
        )
    if sentinel and stop_on_harmful:
        raise ValueError(
            "stop_on_harmful is for the full recording; with sentinel=True use on_nan='stop'"
        )


def trip_lines(trip: Trip, logdir: str | os.PathLike[str] | None) -> list[str]:
    """What a callback says when the sentinel trips: where, what the replay found, what next."""
    where = " and ".join(trip.where).replace("_", " ") or "a check"
    then = "training stops" if trip.action == "stop" else "the step is skipped, training goes on"
    lines = [f"nanscope: Inf/NaN in the {where} at step {trip.step}: {then}"]
    if trip.cause is not None:
        lines.append(f"nanscope: the replay of step {trip.step}: {trip.cause.headline}")
    elif trip.reproduced is False:
        lines.append(
            f"nanscope: the replay of step {trip.step} did not reproduce the Inf/NaN "
            "(non-determinism, or a hardware fault)"
        )
    elif trip.reason:
        lines.append(f"nanscope: step {trip.step} was not replayed: {trip.reason}")
    if logdir is not None:
        lines.append(f"nanscope: the whole story: `nanscope report {os.fspath(logdir)}`")
    return lines
