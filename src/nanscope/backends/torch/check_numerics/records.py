"""What check_numerics remembers about Inf/NaN: the ops that wrote them, their lineages,
the storages that hold them, and what was running at each op."""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from nanscope.backends.torch.ops import OpInfo
from nanscope.errors import Frame
from nanscope.events import Phase

# Lineages named on one tensor at most (the preferred ones: see preference).
MAX_LINEAGES = 4


class Where(NamedTuple):
    """Where an op ran: its module, phase, step and user frame."""

    module_path: str
    phase: Phase
    step: int
    source: Frame | None
    forward: tuple[str, Frame | None] | None  # a backward op's forward op and its line


@dataclass(eq=False)
class OpContext:
    """What was running when an op ran (taken at the op: it may be looked at later)."""

    where: Where
    backward: bool  # run by the autograd engine
    deferring: bool  # in a GradScaler-scaled backward, or inside GradScaler.scale()
    stepping: tuple[Any, ...]  # the optimizers whose step() is running


class LineageState(enum.Enum):
    """Whether a lineage's values may still do harm."""

    ACTIVE = "active"  # its values may still do harm
    DEFERRED = "deferred"  # made in a scaled backward: up to GradScaler's inf check
    HANDLED = "handled"  # GradScaler found them and skipped the step


@dataclass(eq=False)
class Wrote:
    """An op that wrote Inf/NaN: what an error needs to name it later."""

    op: str
    index: int  # the output (or written argument) that holds them
    ctx: OpContext
    inputs: list[tuple[weakref.ref[torch.Tensor], int]]  # weakly, with their versions
    more_inputs: int = 0
    counts: tuple[int, int, int, int] | None = None  # (-inf, +inf, nan, size); births only
    dtype: str = ""


@dataclass(eq=False)
class Lineage:
    """Inf/NaN followed from their birth, the op that wrote them while reading none."""

    seq: int  # births in order
    birth: Wrote
    deliberate: bool  # an Inf/NaN constant among the birth's arguments: a mask
    entered: bool  # the birth's inputs already held Inf/NaN that no checked op made
    state: LineageState


@dataclass(eq=False)
class Held:
    """What a storage holding Inf/NaN holds."""

    storage: weakref.ref[Any]
    lineages: tuple[Lineage, ...]
    by: Wrote  # the op that last wrote Inf/NaN into it


@dataclass(eq=False)
class OpCall:
    """One op's call: checked at once (CPU) or queued for the device's answers."""

    func: Any
    info: OpInfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any] | None
    outs: list[torch.Tensor]
    # (output, all finite): a device tensor, or the answer already known for a CPU output
    flags: list[tuple[int, torch.Tensor | bool]] = field(default_factory=list)
    ctx: OpContext | None = None


def preference(lineage: Lineage) -> tuple[bool, bool, int]:
    """The order in which an error names the lineages that reached it.

    Lineages that may still do harm first, then those that are not an Inf/NaN constant
    (a mask) by intent, then the earliest born.
    """
    return (lineage.state is not LineageState.ACTIVE, lineage.deliberate, lineage.seq)


def any_active(lineages: tuple[Lineage, ...]) -> bool:
    """Whether any of these lineages may still do harm."""
    return any(lineage.state is LineageState.ACTIVE for lineage in lineages)


def merge(a: tuple[Lineage, ...], b: tuple[Lineage, ...]) -> tuple[Lineage, ...]:
    """Both sets of lineages, the preferred first, at most :data:`MAX_LINEAGES`."""
    seen = {lineage.seq: lineage for lineage in (*a, *b)}
    return tuple(sorted(seen.values(), key=preference)[:MAX_LINEAGES])
