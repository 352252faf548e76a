"""Headroom warnings in words: overflow or underflow coming, one sentence per warning.

The analysis (``analysis/_headroom.py``) finds each :class:`HeadroomWarning` as facts (the
module, its format, the value it reached, since which step); the sentence is written here,
for the JSON report's and ``/api/headroom``'s ``message``, the terminal report and the
framework integrations alike.
"""

from __future__ import annotations

import math
from typing import Any

from nanscope.analysis import Analysis, Headroom, HeadroomWarning
from nanscope.format.headroom import FORMATS


def _number(v: float) -> str:
    """``1,000``, ``0.5``, ``6.10e-05``: a value as the warnings print it."""
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}" if v >= 0.01 else f"{v:.2e}"


def _label(w: HeadroomWarning) -> str:
    """```net.fc` (backward)``: the module the warning is about, and its phase if not forward."""
    name = f"`{w.module}`" if w.module else "ops outside modules"
    return f"{name} ({w.phase})" if w.phase and w.phase != "forward" else name


def warning_text(w: HeadroomWarning) -> str:
    """``near overflow: `net.fc` reached 3.2e+04 of float16's 65,504 at step 40...``."""
    label = _label(w)
    growth = ""
    if w.growth_per_100 is not None and abs(math.log(w.growth_per_100)) > 0.01:
        verb = "growing" if w.growth_per_100 > 1 else "shrinking"
        factor = max(w.growth_per_100, 1 / w.growth_per_100)
        growth = f", {verb} {factor:.2g}x per 100 steps"
    if w.kind == "underflow":
        return (
            f"underflow: {label}'s largest |x| was {_number(w.value)} at step "
            f"{w.step}, below {w.format}'s smallest normal {_number(w.limit)} since "
            f"step {w.since_step}{growth}: its values lose precision, and round to zero "
            f"below {_number(FORMATS[w.format].smallest / 2)}"
        )
    if w.value > w.limit:
        head = (
            f"beyond {w.format}: {label} reached {_number(w.value)}, "
            f"{w.value / w.limit:.2g}x {w.format}'s largest {_number(w.limit)}, "
            f"at step {w.step}"
        )
    else:
        head = (
            f"near overflow: {label} reached {_number(w.value)} of {w.format}'s "
            f"{_number(w.limit)} at step {w.step}{growth}"
        )
    near = "near or beyond it" if w.value > w.limit else "within reach"
    tail = f" ({near} since step {w.since_step}"
    if w.steps_left:
        tail += f"; at this rate it overflows in about {w.steps_left} steps"
    if w.first_inf_step is not None:
        tail += f"; the first Inf came at step {w.first_inf_step}"
    return head + tail + ")"


def headroom_warnings(a: Analysis) -> list[str]:
    """The warnings beside the verdict, one sentence each: overflow or underflow coming."""
    return [warning_text(w) for w in a.headroom.warnings] if a.headroom is not None else []


def warning_json(w: HeadroomWarning) -> dict[str, Any]:
    """One warning as the JSON report and ``/api/headroom`` give it: its facts and its
    ``message``."""
    return {**w.to_json(), "message": warning_text(w)}


def headroom_json(h: Headroom) -> dict[str, Any]:
    """The JSON report's ``headroom``: its facts, each warning with its ``message``."""
    return {**h.to_json(), "warnings": [warning_json(w) for w in h.warnings]}
