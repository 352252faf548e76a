"""Two runs side by side at the first op where they part (``/api/diff``).

:func:`nanscope.analysis.diff` compares the runs (imported when first asked: it is the
heaviest analysis); its answer is kept per pair of runs until either dump changes. Around
the parted op, each run's own ops (of the process compared, in its order) are laid side by
side: the parted pair on one line, the ops before and after it paired by their op type and
module path where both runs have them, alone where one run has an op the other lacks (a
fused kernel, an extra cast).
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
from nanscope.server.provider.rows import row
from nanscope.server.runs import Run, RunSet


class DiffRefused(ValueError):
    """Runs that cannot be compared as asked (the message says why): a 400."""


@contextlib.contextmanager
def _both(a: Run, b: Run) -> Iterator[tuple[DumpReader, DumpReader]]:
    """Both runs' readers, taken in the order of their names (two requests taking a pair
    in opposite orders must not wait on each other), or one reader when they are one run."""
    if a is b:
        with a.reading() as r:
            yield r, r
        return
    first, second = (a, b) if a.name <= b.name else (b, a)
    with first.reading() as r1, second.reading() as r2:
        yield (r1, r2) if first is a else (r2, r1)


def _state(r: DumpReader) -> tuple[int, int, int]:
    return (r.generation, r.num_executions(), r.num_graph_execution_traces())


def compare(
    runs: RunSet,
    run_a: str,
    run_b: str,
    rank_a: int | None,
    rank_b: int | None,
    rtol: float | None,
    window: int,
) -> dict[str, Any]:
    """``/api/diff``: the diff of ``run_a`` against ``run_b`` (``nanscope.diff/1``) and, when
    they part, ``window`` ops either side of the parted op in each run, paired."""
    from nanscope.analysis import DiffInputError, diff

    a, b = runs.get(run_a), runs.get(run_b)
    with _both(a, b) as (ra, rb):
        # Remembered by run A (dropped when its dump changes) for run B's directories and
        # state, the ranks and the tolerance; the ops around the parted one are read again
        # for each window (a few rows).
        key = ("diff", b.paths, _state(rb), rank_a, rank_b, rtol)

        def compute() -> dict[str, Any]:
            try:
                found = diff(ra, rb, rank_a=rank_a, rank_b=rank_b, rtol=rtol)
            except DiffInputError as exc:
                raise DiffRefused(str(exc)) from None
            return found.to_json()

        result = a.cached(key, compute, bounded=True)
        return {
            "run": a.name,
            "against": b.name,
            "diff": result,
            "around": _around(ra, rb, result.get("parted"), window),
        }


def _neighbours(r: DumpReader, side: dict[str, Any], window: int) -> tuple[list[int], int]:
    """Event indices of the ``window`` ops either side of ``side``'s op in its process's own
    order, and where the op itself is among them."""
    kind = side["kind"]
    procs = r.processes_of(kind)
    mine = np.flatnonzero(procs == int(side["process"]))
    pos = int(np.searchsorted(mine, int(side["index"])))
    lo, hi = max(0, pos - window), min(len(mine), pos + window + 1)
    return mine[lo:hi].tolist(), pos - lo


def _row(r: DumpReader, kind: str, i: int) -> dict[str, Any]:
    """A list row with what pairing and the view need besides: the module path."""
    out = row(r, kind, i)
    try:
        ev = r.execution(i) if kind == EXECUTIONS else r.trace(i)
        out["module_path"] = getattr(ev, "module_path", "") or ""
        if kind == TRACES:
            out.setdefault("op_type", getattr(ev, "op_type", ""))
    except UNREADABLE:
        out["module_path"] = ""
    return out


def _pair(xs: Sequence[dict[str, Any]], ys: Sequence[dict[str, Any]]) -> list[list[int | None]]:
    """Positions of ``xs`` and ``ys`` paired where their op type and module path match, in
    order; the others alone (``None`` on the other side)."""
    key = [(x.get("op_type"), x.get("module_path")) for x in xs]
    other = [(y.get("op_type"), y.get("module_path")) for y in ys]
    out: list[list[int | None]] = []
    matcher = difflib.SequenceMatcher(a=key, b=other, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend([i, j] for i, j in zip(range(i1, i2), range(j1, j2), strict=True))
        else:
            out.extend([i, None] for i in range(i1, i2))
            out.extend([None, j] for j in range(j1, j2))
    return out


def _around(
    ra: DumpReader, rb: DumpReader, parted: dict[str, Any] | None, window: int
) -> dict[str, Any] | None:
    """Each run's ops around the parted op, as lines of ``[a row or null, b row or null]``;
    ``at`` is the parted pair's line."""
    if not parted or window < 0:
        return None
    # Twice the window is paired, then the lines cut to the window: at the edge of a run's
    # window an op may have its partner just outside the other's, and must not show alone.
    ia, at_a = _neighbours(ra, parted["a"], 2 * window)
    ib, at_b = _neighbours(rb, parted["b"], 2 * window)
    kind_a, kind_b = parted["a"]["kind"], parted["b"]["kind"]
    rows_a = [_row(ra, kind_a, i) for i in ia]
    rows_b = [_row(rb, kind_b, i) for i in ib]
    before = _pair(rows_a[:at_a], rows_b[:at_b])
    after = _pair(rows_a[at_a + 1 :], rows_b[at_b + 1 :])
    lines: list[dict[str, Any]] = []
    for pa, pb in before:
        lines.append(
            {"a": None if pa is None else rows_a[pa], "b": None if pb is None else rows_b[pb]}
        )
    at = len(lines)
    lines.append({"a": rows_a[at_a], "b": rows_b[at_b]})
    for pa, pb in after:
        lines.append(
            {
                "a": None if pa is None else rows_a[at_a + 1 + pa],
                "b": None if pb is None else rows_b[at_b + 1 + pb],
            }
        )
    lo = max(0, at - window)
    return {"at": at - lo, "lines": lines[lo : at + window + 1]}
