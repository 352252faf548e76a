"""The event lists: which events a filter selects, and a page of them as list rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nanscope.reader import EXECUTIONS, UNREADABLE, DumpReader
from nanscope.server.runs import Run


@dataclass(frozen=True)
class Filter:
    """What a list (or the timeline) keeps: one process, events holding Inf/NaN, one op type.

    The defaults keep every event; an empty ``op_type`` is no filter either.
    """

    process: int | None = None
    nonfinite: bool = False
    op_type: str | None = None

    @property
    def keeps_all(self) -> bool:
        return self.process is None and not self.nonfinite and not self.op_type


def row(reader: DumpReader, kind: str, i: int) -> dict[str, Any]:
    """Event ``i`` as a list row; the index's facts alone when its record cannot be decoded."""
    try:
        return reader.execution(i).to_json() if kind == EXECUTIONS else reader.trace(i).to_json()
    except UNREADABLE as exc:
        return {**reader.index_json(kind, i), "error": str(exc)}


@dataclass(frozen=True)
class Selection:
    """The events of one kind that a filter keeps, in the index's order.

    Positions (``begin``, ``end``) count the kept events; ``indices`` maps them to the
    events' global indices (``None``: every event is kept, a position is its index).
    """

    reader: DumpReader
    kind: str
    indices: np.ndarray | None

    @property
    def total(self) -> int:
        return self.reader.num(self.kind) if self.indices is None else len(self.indices)

    def events(self, begin: int, end: int) -> np.ndarray:
        """Global indices of the kept events at positions ``begin`` to ``end``."""
        if self.indices is None:
            return np.arange(begin, end)
        result: np.ndarray = self.indices[begin:end]
        return result

    def page(self, begin: int, end: int, position_of: int | None = None) -> dict[str, Any]:
        """``/api/executions`` and ``/api/traces``: the rows at positions ``begin`` to ``end``
        (clamped to :attr:`total`), and with ``position_of``, where that event sits."""
        total = self.total
        rows = [row(self.reader, self.kind, i) for i in self.events(begin, end).tolist()]
        out: dict[str, Any] = {"begin": begin, "end": end, "total": total, "rows": rows}
        if position_of is not None:
            # Where the event sits in this (filtered) list, or the next one after it.
            at, kept = position_of, self.indices
            pos = min(at, total) if kept is None else int(np.searchsorted(kept, at))
            exact = pos < total and (kept is None or int(kept[pos]) == at)
            out["position"] = pos if pos < total else None
            out["exact"] = bool(exact)
        return out


def select(run: Run, reader: DumpReader, kind: str, keep: Filter) -> Selection:
    """The events of ``kind`` that ``keep`` lets through (remembered per filter)."""
    if keep.keeps_all:
        return Selection(reader, kind, None)

    def compute() -> np.ndarray:
        rows = reader.index(kind)
        mask = np.ones(len(rows), dtype=bool)
        if keep.process is not None:
            mask &= reader.processes_of(kind) == keep.process
        if keep.nonfinite:
            mask &= rows["nonfinite"] == 1
        if keep.op_type:
            sid = reader.string_id(keep.op_type)
            if sid is None:
                return np.zeros(0, dtype=np.int64)
            names = rows["name"] if kind == EXECUTIONS else reader.trace_op_types()
            mask &= names == sid
        return np.flatnonzero(mask)

    # The op type is the client's choice: bounded, so that ever new ones cannot grow memory.
    key = ("filter", kind, keep.process, keep.nonfinite, keep.op_type)
    return Selection(reader, kind, run.cached(key, compute, bounded=True))
