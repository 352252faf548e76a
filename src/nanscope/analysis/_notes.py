"""What the analysis notes beside its verdict, as facts: one small frozen class per kind.

Each note holds what it is about (an event kind, counts, the events it names) and no
words: the sentences are written by the reporters (``nanscope/report/_sentences.py``),
so that a surface may word, filter or translate a note without parsing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from nanscope.analysis._views import EventView
from nanscope.vocabulary import LineageVerdict

# TensorFlow's enable_dump_debug_info keeps this many events of each kind by default.
TF_DEFAULT_BUFFER = 1000


@dataclass(frozen=True)
class NoHealth:
    """The dump was written in a mode that records no health (``NO_TENSOR``, ``SHAPE``):
    no Inf/NaN can be found in it."""

    mode: str


@dataclass(frozen=True)
class CurtHealth:
    """``CURT_HEALTH`` records only whether each tensor had any Inf/NaN."""


@dataclass(frozen=True)
class Evicted:
    """The circular buffer dropped ``dropped`` events of ``kind`` (``kept`` remain), in
    ``gaps`` gaps."""

    kind: str
    dropped: int
    kept: int
    gaps: int


@dataclass(frozen=True)
class TensorflowBufferUnknown:
    """TensorFlow wrote the dump, with no Inf/NaN, and its files do not say whether it kept
    every event."""


@dataclass(frozen=True)
class TensorflowBufferFull:
    """TensorFlow wrote the dump, and it holds exactly :data:`TF_DEFAULT_BUFFER` events of
    each of ``kinds``: its first events, and the first Inf/NaN, may have been dropped."""

    kinds: tuple[str, ...]


@dataclass(frozen=True)
class UndecodableOrigin:
    """The first event with Inf/NaN could not be decoded (``error``: why)."""

    error: str


@dataclass(frozen=True)
class Undecodable:
    """An event the analysis needed could not be decoded (``error``: why)."""

    kind: str
    index: int
    error: str


@dataclass(frozen=True)
class OriginInputsUnknown:
    """Some inputs of the origin were made before the recorded window or outside the
    recorded ops."""


@dataclass(frozen=True)
class LineagesCutShort:
    """The lineages were followed through the first events after the first Inf/NaN only."""


@dataclass(frozen=True)
class BirthsDropped:
    """``count`` lineages were first seen after events the circular buffer dropped."""

    count: int


@dataclass(frozen=True)
class MadeElsewhere:
    """The values that ``load`` #``index`` brought into process ``here`` were made in
    process ``there`` (labels of ``Analysis.processes``): the cause is where they were made."""

    load: str
    index: int
    here: str
    there: str


@dataclass(frozen=True)
class CauseEvicted:
    """The cause's birth was dropped: it was among ``lost`` (``Analysis.cause_evicted``);
    ``cause`` is the earliest event kept that holds its values."""

    lost: dict[str, Any]
    cause: EventView | None


@dataclass(frozen=True)
class FirstIsNotTheCause:
    """The first Inf/NaN (``origin``) is not the cause's birth. ``verdict`` is the first
    one's lineage verdict (so that no note contradicts the lineage list);
    ``made_first_nan`` the index of the cause lineage's event that made the first NaN, if
    it did; ``cause_birth`` the index of the cause lineage's birth."""

    origin: EventView
    verdict: LineageVerdict | None
    cause: EventView | None
    made_first_nan: int | None
    cause_birth: int


@dataclass(frozen=True)
class LineagesNotFollowed:
    """No lineage could be followed (their events could not be decoded): harmful, to be safe."""


@dataclass(frozen=True)
class NothingHarmful:
    """Every Inf/NaN was absorbed or handled; ``incomplete``: of the events that could be
    read only, since the dump is incomplete (no all-clear)."""

    incomplete: bool = False


# What the ranks' analysis notes of how the Inf/NaN spread between processes
# (``RankVerdict.notes``); a harmful dump's notes carry them too.


@dataclass(frozen=True)
class NoRankBorn:
    """Every rank with Inf/NaN received it from another (a cycle only damaged or partial
    records make): the origin is chosen by clock."""


@dataclass(frozen=True)
class CollectiveMadeIt:
    """Every rank's values were finite going into the collective ``label`` (its
    ``Collective.label``) and Inf/NaN coming out: the collective itself made it."""

    label: str


@dataclass(frozen=True)
class BornByClock:
    """The processes ``names`` (their labels, earliest by clock first) made Inf/NaN on
    their own between the same collectives: no collective orders them, so the earliest by
    clock, ``names[0]``, is named; ``aligned``: their clocks were aligned on the collective
    that followed."""

    names: tuple[str, ...]
    aligned: bool


RankNote: TypeAlias = NoRankBorn | CollectiveMadeIt | BornByClock


Note: TypeAlias = (
    NoHealth
    | CurtHealth
    | Evicted
    | TensorflowBufferUnknown
    | TensorflowBufferFull
    | UndecodableOrigin
    | Undecodable
    | OriginInputsUnknown
    | LineagesCutShort
    | BirthsDropped
    | MadeElsewhere
    | CauseEvicted
    | FirstIsNotTheCause
    | LineagesNotFollowed
    | NothingHarmful
    | NoRankBorn
    | CollectiveMadeIt
    | BornByClock
)
