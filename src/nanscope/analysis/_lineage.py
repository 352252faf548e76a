"""One lineage: a birth of Inf/NaN, what became of its values, and the rules of its verdict.

The record and the rules that every way of following lineages shares: eager ops and
graph traces (``analysis/_lineages.py``), a JAX program's eager ops and jitted calls as
one data flow (``analysis/_boundaries.py``), and what came into a compiled graph through
its inputs (``analysis/_graph_inputs.py``). They all depend on this module, and it on
none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.analysis._explain import short_name
from nanscope.format.health import Health
from nanscope.format.modes import HEALTH_MODES
from nanscope.reader import Execution
from nanscope.vocabulary import LineageVerdict, NonFinite, Phase

# Events decoded per process after its first Inf/NaN; beyond this, lineages are not followed.
DECODE_LIMIT = 200_000

# Where a lineage's values went (its ``reaches``, shown in the report and its JSON).
GRAPH_OUTPUT = "a graph output, still non-finite"
VARIABLE = "a variable (a parameter, an optimizer state or a metric)"
LATER_STEP = "a later step (kept in a parameter or an optimizer state)"
GRADIENTS = "the loss and the gradients"
LOSS = "the loss (backward() was called on it)"
OPTIMIZER_UPDATE = "an in-place update in the optimizer step (a parameter or its state)"
END = "the end of the recording, still non-finite"


@dataclass
class Lineage:
    """One birth and what became of its values."""

    kind: str  # an EventKind: the kind of its events
    process: int
    birth: int  # index of the birth event
    birth_step: int
    birth_phase: int  # a Phase
    wall_time: float
    # What groups births "of the same kind" in a report: op and where it was created.
    signature: tuple[object, ...] = ()
    entered: bool = False  # the values came in from outside the recorded ops
    after_gap: bool = False  # ... after events the circular buffer dropped
    members: list[int] = field(default_factory=list)  # events holding its values, birth first
    carries: set[NonFinite] = field(default_factory=set)
    first_nan: int | None = None
    absorbed_at: int | None = None
    handled_at: int | None = None
    reaches: list[str] = field(default_factory=list)
    verdict: LineageVerdict = LineageVerdict.BENIGN
    # Events that repeated its birth in activation checkpointing's rerun (analysis/_recompute.py).
    recomputed: list[int] = field(default_factory=list)
    # Members whose values went on into events the circular buffer dropped, where nothing
    # else in the dump tells what became of them: its verdict is then unknown.
    lost: list[int] = field(default_factory=list)

    def add(self, index: int, out: set[NonFinite]) -> None:
        """Event ``index`` holds this lineage's values, of the kinds in ``out``."""
        self.members.append(index)
        self.carries |= out
        if NonFinite.NAN in out and self.first_nan is None:
            self.first_nan = index

    def reach(self, what: str) -> None:
        """Its values reached ``what`` (one of this module's ``reaches`` sentences)."""
        if what not in self.reaches:
            self.reaches.append(what)


def nonfinite_kinds(h: Health | None) -> set[NonFinite]:
    """What non-finite values a health says are there (both when not counted)."""
    if h is None or not h.any_nonfinite:
        return set()
    if not h.known:
        return {NonFinite.INF, NonFinite.NAN}
    out = set()
    if (h.neg_inf or 0) + (h.pos_inf or 0):
        out.add(NonFinite.INF)
    if h.nan:
        out.add(NonFinite.NAN)
    return out


def absorbs(ex: Execution) -> bool:
    """Whether an op with finite outputs ends the lineages it read: a float output made from
    their values (``softmax``, ``where``, ``1/inf = 0``), or an integer or bool one (a cast
    to an integer, a comparison, ``isnan``, an argmax, a sort's indices), which holds no
    Inf/NaN at all. A Python number (``.item()``, no output tensor) keeps them: it may be a
    NaN loss that the program prints. In the health modes every float output is summarized,
    so an output with no summary is an integer or bool tensor."""
    if not any(ex.output_tensor_ids):
        return False
    if not ex.recorded:
        return ex.tensor_debug_mode in HEALTH_MODES
    dtype = ex.health.dtype
    return not dtype or dtype.startswith(("float", "bfloat", "complex"))


def in_place(op_type: str) -> bool:
    """``aten.addcdiv_.default``, ``aten._foreach_add_.List``: ops that write an input."""
    name = short_name(op_type)
    return name.endswith("_") and not name.startswith("_amp_")


def passed_on(contributors: set[int], out: set[NonFinite], lineages: list[Lineage]) -> set[int]:
    """The lineages among ``contributors`` that explain an output holding ``out``: NaN is
    passed on by the lineages that already carried NaN (when none did, the op made it from
    infinities: all are passed on), and infinities by those that carried infinities."""
    passed: set[int] = set()
    if NonFinite.NAN in out:
        carriers = {i for i in contributors if NonFinite.NAN in lineages[i].carries}
        passed |= carriers or contributors
    if NonFinite.INF in out:
        passed |= {i for i in contributors if NonFinite.INF in lineages[i].carries}
    return passed or contributors


def verdict_of(lin: Lineage) -> LineageVerdict:
    """Harmful when it reached anything harmful; unknown when, short of that, some of its
    values went into dropped events that no rule can follow them through; handled when a
    loss scaler saw it and it reached nothing harmful; harmful when it reached anything
    (the end of the recording included); benign otherwise."""
    harmful = [r for r in lin.reaches if r != END]
    if harmful:
        return LineageVerdict.HARMFUL
    if lin.lost:
        return LineageVerdict.UNKNOWN
    if lin.handled_at is not None:
        return LineageVerdict.HANDLED
    if lin.reaches:
        return LineageVerdict.HARMFUL
    return LineageVerdict.BENIGN


def reaches_backward(lin: Lineage) -> bool:
    """Whether values of ``lin`` seen in the backward pass reached the loss and the
    gradients: only when it was born before the backward pass."""
    return lin.birth_phase not in (Phase.BACKWARD, Phase.OPTIMIZER)
