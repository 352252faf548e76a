"""The JSON API's routes: each parses its query, asks the data provider, and returns its answer.

Each route takes the :class:`~nanscope.server.runs.RunSet`, the query (:class:`Query`) and
the path's arguments, and returns a JSON-able dict or raises :class:`ApiError`. What the
answers hold is shaped in :mod:`nanscope.server.provider`; here are the parameters, their
limits and the order in which they are checked. The contract is ``http_api.md`` beside this
file. Nothing here touches HTTP, so tests call the routes directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nanscope.format.files import DumpNotFoundError
from nanscope.format.headroom import TARGET_FORMATS
from nanscope.reader import EXECUTIONS, TRACES, DumpReader
from nanscope.server.provider import (
    NotFound,
    diff,
    events,
    rows,
    sentinel,
    sources,
    summary,
    timeline,
)
from nanscope.server.query import ApiError, Query
from nanscope.server.runs import Run, RunNotFound, RunSet

MAX_BUCKETS = 4000
MAX_TENSOR_VALUES = 100_000
# Rows shown on either side of each rank's copy of the collective that spread Inf/NaN.
MAX_RANKS_WINDOW = 50
# Modules charted at once by /api/headroom.
MAX_HEADROOM_SERIES = 32
# /api/sentinel: buckets of the charted steps, and exact steps before each trip.
MAX_SENTINEL_POINTS = 4000
MAX_SENTINEL_LEAD = 1000
# /api/diff: ops shown on either side of the parted op.
MAX_DIFF_WINDOW = 50

Route = Callable[[RunSet, Query, Mapping[str, Any]], dict[str, Any]]
Args = Mapping[str, Any]

# -- shared pieces -------------------------------------------------------------------------------


def _run(runs: RunSet, q: Query) -> Run:
    try:
        return runs.get(q.text("run", max_len=1024))
    except RunNotFound as exc:
        raise ApiError(404, str(exc)) from None


@contextlib.contextmanager
def _opened(run: Run) -> Iterator[DumpReader]:
    """The run's reader (while other requests read it too); what is not there is a 404."""
    try:
        with run.reading() as reader:
            yield reader
    except (DumpNotFoundError, NotFound) as exc:
        raise ApiError(404, str(exc)) from None


def _reading(handler: Callable[[Run, DumpReader, Query, Args], dict[str, Any]]) -> Route:
    """A route over one run's reader: finds the run (404), opens it, and reads it."""

    def route(runs: RunSet, q: Query, args: Args) -> dict[str, Any]:
        run = _run(runs, q)
        with _opened(run) as reader:
            return handler(run, reader, q, args)

    route.__name__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route


def _filter(q: Query, reader: DumpReader) -> rows.Filter:
    """The list filters: ``process``, ``nonfinite`` and ``op_type``, checked in that order."""
    process = q.process(reader)
    nonfinite = q.flag("nonfinite")
    return rows.Filter(process, nonfinite, q.text("op_type", max_len=512))


# -- routes --------------------------------------------------------------------------------------


def runs_route(runs: RunSet, q: Query, args: Args) -> dict[str, Any]:
    return summary.run_list(runs)


@_reading
def alerts_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    return summary.alerts(run, reader, q.process(reader))


@_reading
def analysis_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    return summary.analysis(run, reader)


@_reading
def ranks_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    window = q.integer("window", 8, lo=0, hi=MAX_RANKS_WINDOW)
    return summary.ranks(run, reader, window)


@_reading
def headroom_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    """Per module, each step's largest |x| as a fraction of its format's largest value."""
    target = q.text("format", max_len=40) or None
    if target is not None and target not in TARGET_FORMATS:
        raise ApiError(400, f"parameter format must be one of {', '.join(TARGET_FORMATS)}")
    process = q.optional_int("process", lo=0)
    top = q.integer("top", 8, lo=1, hi=MAX_HEADROOM_SERIES)
    return summary.headroom(run, reader, target, process, top)


def _list(kind: str) -> Route:
    @_reading
    def route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
        chosen = rows.select(run, reader, kind, _filter(q, reader))
        begin, end = q.page(chosen.total)
        return chosen.page(begin, end, q.optional_int("position_of", lo=0))

    return route


executions_route = _list(EXECUTIONS)
traces_route = _list(TRACES)


@_reading
def execution_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    return events.execution(run, reader, int(args["index"]))


@_reading
def trace_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    return events.trace(run, reader, int(args["index"]))


@_reading
def graph_op_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    process = q.process(reader) or 0
    graph_id = q.required("graph_id")
    op_name = q.required("op_name")
    near = q.optional_int("near", lo=0)
    return events.graph_op(run, reader, process, graph_id, op_name, near)


@_reading
def timeline_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    kind = q.kind()
    chosen = rows.select(run, reader, kind, _filter(q, reader))
    total = chosen.total
    begin = min(q.integer("begin", 0, lo=0), total)
    end = min(q.integer("end", total, lo=0), total)
    if end < begin:
        raise ApiError(400, f"end ({end}) is before begin ({begin})")
    wanted = q.integer("buckets", 1000, lo=1, hi=MAX_BUCKETS)
    return timeline.buckets(run, reader, chosen, begin, end, wanted)


def source_route(runs: RunSet, q: Query, args: Args) -> dict[str, Any]:
    """A recorded source file, highlighted. The text is read under the run's lock, and
    highlighted after it is released (see :func:`sources.highlighted`)."""
    run = _run(runs, q)
    with _opened(run) as reader:
        process = q.process(reader) or 0
        file_index = q.optional_int("file", lo=0)
        path = q.text("path", max_len=4096)
        if file_index is None and path is None:
            raise ApiError(400, "give file=<file_index> or path=<recorded path>")
        found = sources.source_text(run, reader, process, file_index, path)
    return sources.highlighted(found)


@_reading
def source_files_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    return sources.recorded_files(reader, q.process(reader))


@_reading
def tensor_route(run: Run, reader: DumpReader, q: Query, args: Args) -> dict[str, Any]:
    kind = q.kind()
    # An absent event is told before a malformed slot or limit.
    index = events.check_index(reader, kind, q.integer("index", lo=0))
    slot = q.integer("slot", 0, lo=0)
    limit = q.integer("limit", 1000, lo=1, hi=MAX_TENSOR_VALUES)
    return events.tensor(reader, kind, index, slot, limit)


def sentinels_route(runs: RunSet, q: Query, args: Args) -> dict[str, Any]:
    """The sentinel histories under the logdir, each with the runs (replays) below it."""
    return sentinel.histories(runs)


def sentinel_route(runs: RunSet, q: Query, args: Args) -> dict[str, Any]:
    """A sentinel's per-step history: buckets over a window of steps, each trip's lead-up."""
    name = q.text("history", max_len=1024)
    run = q.text("run", max_len=1024)
    points = q.integer("points", 600, lo=1, hi=MAX_SENTINEL_POINTS)
    lead = q.integer("lead", 100, lo=0, hi=MAX_SENTINEL_LEAD)
    lo = q.optional_int("from_step")
    hi = q.optional_int("to_step")
    if lo is not None and hi is not None and hi < lo:
        raise ApiError(400, f"to_step ({hi}) is before from_step ({lo})")
    try:
        found, root = sentinel.locate(runs, name, run or None)
        return sentinel.history(runs, found, root, points, lead, lo, hi)
    except (RunNotFound, NotFound) as exc:
        raise ApiError(404, str(exc)) from None
    except sentinel.AmbiguousHistory as exc:
        raise ApiError(400, str(exc)) from None


def diff_route(runs: RunSet, q: Query, args: Args) -> dict[str, Any]:
    """Two runs compared op by op: the first op where they part, side by side."""
    a = q.required("run")
    b = q.required("against")
    rank_a = q.optional_int("rank", lo=0)
    rank_b = q.optional_int("against_rank", lo=0)
    raw = q.text("rtol", max_len=40)
    rtol = None
    if raw not in (None, ""):
        try:
            rtol = float(raw)
        except ValueError:
            raise ApiError(400, f"parameter rtol must be a number, not {raw[:40]!r}") from None
        if not (rtol >= 0 and rtol != float("inf")):
            raise ApiError(400, f"parameter rtol must be a finite number >= 0 (got {raw})")
    window = q.integer("window", 8, lo=0, hi=MAX_DIFF_WINDOW)
    try:
        return diff.compare(runs, a, b, rank_a, rank_b, rtol, window)
    except (RunNotFound, DumpNotFoundError, NotFound) as exc:
        raise ApiError(404, str(exc)) from None
    except diff.DiffRefused as exc:
        raise ApiError(400, str(exc)) from None


# Path (werkzeug rule syntax) -> handler; the server serves exactly these, read-only.
ROUTES: dict[str, Route] = {
    "/api/runs": runs_route,
    "/api/alerts": alerts_route,
    "/api/analysis": analysis_route,
    "/api/ranks": ranks_route,
    "/api/headroom": headroom_route,
    "/api/executions": executions_route,
    "/api/executions/<int:index>": execution_route,
    "/api/traces": traces_route,
    "/api/traces/<int:index>": trace_route,
    "/api/graph_op": graph_op_route,
    "/api/timeline": timeline_route,
    "/api/source": source_route,
    "/api/source_files": source_files_route,
    "/api/tensor": tensor_route,
    "/api/sentinels": sentinels_route,
    "/api/sentinel": sentinel_route,
    "/api/diff": diff_route,
}
