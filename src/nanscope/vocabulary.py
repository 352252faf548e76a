"""The words nanscope's analysis, reports and API share, each defined once.

Event kinds, verdicts, phases, the kinds of non-finite values and how an origin came to
hold them. Each is an enum whose members *are* their values (a ``str`` or an ``int``): a
member compares equal to, hashes like, formats and serialises to JSON as its value, so the
documented JSON (``docs/REPORT_JSON.md``) and the dump's own strings stay what they were.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class Name(str, Enum):
    """A string enum whose members print as their values (``enum.StrEnum`` before 3.11)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class EventKind(Name):
    """The two kinds of events a dump holds (the names of their files and JSON ``kind``)."""

    EXECUTION = "execution"  # an eager op, or a call of a graph
    GRAPH_EXECUTION_TRACE = "graph_execution_trace"  # an op inside a graph

    @property
    def label(self) -> str:
        """``execution``, ``graph execution trace``: the kind as prose."""
        return self.value.replace("_", " ")


class Verdict(Name):
    """A whole dump's verdict (``verdict`` in the JSON report)."""

    HARMFUL = "harmful"  # a harmful Inf/NaN was found
    INCOMPLETE = "incomplete"  # none found, but events are missing: no all-clear
    ABSORBED = "absorbed"  # Inf/NaN recorded, every lineage absorbed or handled
    CLEAN = "clean"  # no Inf/NaN recorded in a whole dump

    @property
    def exit_status(self) -> int:
        """``nanscope report``'s exit status: 1 harmful, 2 incomplete, 0 otherwise."""
        return {Verdict.HARMFUL: 1, Verdict.INCOMPLETE: 2}.get(self, 0)


class LineageVerdict(Name):
    """What became of one birth's values (a lineage's ``kind`` in the JSON report)."""

    HARMFUL = "harmful"  # reached the loss, the gradients, the weights or the end
    BENIGN = "benign"  # every value was absorbed by a later op (an intended mask)
    HANDLED = "handled"  # a loss scaler's inf check saw it and skipped the step
    UNKNOWN = "unknown"  # its values went into events the circular buffer dropped


class OriginKind(Name):
    """How the first Inf/NaN came to be in its event (``origin_kind``)."""

    BORN = "born"  # the op made it from finite inputs
    ENTERED = "entered"  # it came in from outside the recorded ops
    UNKNOWN = "unknown"  # an input's values were not recorded: either may be true


class NonFinite(Name):
    """The kinds of non-finite values a lineage carries."""

    INF = "inf"  # -inf or +inf
    NAN = "nan"


class RankRole(Name):
    """What one rank (one process) of a run had to do with the Inf/NaN (``ranks.states``)."""

    ORIGIN = "origin"  # where it was born first
    BORN = "born"  # born there too, on its own
    RECEIVED = "received"  # it came from another rank through a collective or a receive
    CLEAN = "clean"  # it had none


class RankDecision(Name):
    """How the rank of the birth was told (``ranks.decided_by``)."""

    COLLECTIVE = "collective"  # by the collectives that carried it
    CLOCK = "clock"  # by clock: no collective orders the births
    SINGLE = "single"  # the only rank with Inf/NaN


class Phase(IntEnum):
    """The phase of training an event ran in, as a dump records it (0: none known)."""

    NONE = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3

    @property
    def label(self) -> str:
        """``forward``, ``backward``, ``optimizer``; ``""`` for none (the JSON ``phase``)."""
        return "" if self is Phase.NONE else self.name.lower()


__all__ = [
    "EventKind",
    "LineageVerdict",
    "Name",
    "NonFinite",
    "OriginKind",
    "Phase",
    "RankDecision",
    "RankRole",
    "Verdict",
]
