"""The JSON API's handlers: pure functions from a run set and query parameters to JSON values.

Each handler takes the :class:`~nanscope.server.runs.RunSet`, the query
(:class:`Query`) and the path's arguments, and returns a JSON-able dict or
raises :class:`ApiError`. The contract is ``http_api.md`` beside this file.
Nothing here touches HTTP, so tests call the handlers directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from nanscope.analysis import (
    Analysis,
    EventView,
    ViewBuilder,
    analyze,
    analyze_headroom,
    consumers,
    count_alerts,
    graph_op_edges,
    headroom_series,
    values_json,
)
from nanscope.format.files import DumpNotFoundError
from nanscope.format.headroom import TARGET_FORMATS
from nanscope.format.modes import TensorDebugMode
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
from nanscope.server.query import ApiError, Query
from nanscope.server.runs import Run, RunNotFound, RunSet
from nanscope.server.source import HIGHLIGHTER

MAX_BUCKETS = 4000
MAX_TENSOR_VALUES = 100_000
# Producers of an event's inputs are looked for this many events back.
LOOKBACK = 2000
# Rows shown on either side of each rank's copy of the collective that spread Inf/NaN.
MAX_RANKS_WINDOW = 50
# Modules charted at once by /api/headroom.
MAX_HEADROOM_SERIES = 32

Route = Callable[[RunSet, Query, Mapping[str, Any]], dict[str, Any]]

# -- shared pieces -------------------------------------------------------------------------------


def _run(runs: RunSet, q: Query) -> Run:
    try:
        return runs.get(q.text("run", max_len=1024))
    except RunNotFound as exc:
        raise ApiError(404, str(exc)) from None


def _reading(
    handler: Callable[[Run, DumpReader, Query, Mapping[str, Any]], dict[str, Any]],
) -> Route:
    """A route over one run's reader: finds the run (404), opens it, and reads it (while
    other requests read it too)."""

    def route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
        run = _run(runs, q)
        try:
            with run.reading() as reader:
                return handler(run, reader, q, args)
        except DumpNotFoundError as exc:
            raise ApiError(404, str(exc)) from None

    route.__name__ = handler.__name__
    route.__doc__ = handler.__doc__
    return route


def _filtered(run: Run, reader: DumpReader, kind: str, q: Query) -> np.ndarray | None:
    """Global indices passing the query's filters, or None when there is no filter."""
    process = q.process(reader)
    only_bad = q.flag("nonfinite")
    op_type = q.text("op_type", max_len=512)
    if process is None and not only_bad and not op_type:
        return None

    def compute() -> np.ndarray:
        rows = reader.index(kind)
        mask = np.ones(len(rows), dtype=bool)
        if process is not None:
            mask &= reader.processes_of(kind) == process
        if only_bad:
            mask &= rows["nonfinite"] == 1
        if op_type:
            sid = reader.string_id(op_type)
            if sid is None:
                return np.zeros(0, dtype=np.int64)
            names = rows["name"] if kind == EXECUTIONS else reader.trace_op_types()
            mask &= names == sid
        return np.flatnonzero(mask)

    # The op type is the client's choice: bounded, so that ever new ones cannot grow memory.
    return run.cached(("filter", kind, process, only_bad, op_type), compute, bounded=True)


def _stack_json(
    run: Run, reader: DumpReader, frame_ids: tuple[str, ...], process: int
) -> list[Any]:
    # Which files' text the dump holds: asked by every event detail, so computed once.
    recorded = run.cached(
        ("recorded", process),
        lambda: frozenset(f.index for f in reader.source_files(process) if f.num_lines),
    )
    return [f.to_json(f.file_index in recorded) for f in reader.stack_frames(frame_ids, process)]


# -- routes --------------------------------------------------------------------------------------


def runs_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"logdir": str(runs.logdir), "runs": [_run_entry(runs.get(n)) for n in runs.names()]}


def _run_entry(run: Run) -> dict[str, Any]:
    entry: dict[str, Any] = {"run": run.name, "run_id": "", "framework": "",
                             "tensor_debug_mode": None, "num_executions": 0,
                             "num_graph_execution_traces": 0, "generation": 0, "steps_known": False,
                             "processes": [], "problems": [], "incomplete": True,
                             "num_incomplete": 0, "error": None}  # fmt: skip
    try:
        with run.reading() as r:
            mode = r.tensor_debug_mode
            entry.update(
                run_id=r.run_id,
                framework=r.framework,
                tensor_debug_mode=mode.name if mode is not None else None,
                num_executions=r.num_executions(),
                num_graph_execution_traces=r.num_graph_execution_traces(),
                generation=r.generation,
                # TensorFlow's dumps record no training step: the reader counts them where
                # it finds the training function (docs/TENSORFLOW.md), else every event says 0.
                steps_known=r.steps_known,
                processes=[p.to_json() for p in r.processes],
                problems=[p.to_json() for p in r.problems],
            )
            # Whether events may be missing (the run list marks it; no all-clear is given).
            missing = r.incomplete
            entry.update(incomplete=bool(missing), num_incomplete=len(missing))
    except DumpNotFoundError as exc:
        # Nothing read: no verdict either (the error is its one problem).
        entry.update(error=str(exc), num_incomplete=1)
    return entry


@_reading
def alerts_route(run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:

    process = q.process(reader)

    def compute() -> dict[str, Any]:
        a = count_alerts(reader, process)
        categories = []
        for cat in ("neg_inf", "pos_inf", "nan", "nonfinite"):
            count, at = reader.first_where(cat, process=process)
            where = {"kind": at.kind, "index": at.index} if at else None
            categories.append({"category": cat, "count": count, "first": where})
        first = categories.pop()["first"]
        return {
            "total": a.total,
            "executions": a.executions,
            "graph_execution_traces": a.graph_execution_traces,
            "first": first,
            "by_category": categories,
            "by_op_type": a.by_op_type,
            "by_step": a.by_step,
        }

    return run.cached(("alerts", process), compute)


def _analysis_of(run: Run, reader: DumpReader) -> Analysis:
    """The run's analysis, computed once (shared by every route that needs it)."""
    return run.cached("analysis object", lambda: analyze(reader))


def _analysis(run: Run, reader: DumpReader) -> dict[str, Any]:
    """The run's analysis as JSON (/api/analysis, /api/ranks, /api/headroom)."""

    def compute() -> dict[str, Any]:
        # Its "verdict" and "incomplete" decide what the page leads with.
        return _analysis_of(run, reader).to_json()

    return run.cached("analysis", compute)


@_reading
def analysis_route(
    run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]
) -> dict[str, Any]:
    return _analysis(run, reader)


@_reading
def ranks_route(run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    window = q.integer("window", 8, lo=0, hi=MAX_RANKS_WINDOW)
    ranks = _analysis(run, reader).get("ranks")
    if ranks is None:
        return {"ranks": None}

    def compute() -> dict[str, Any]:
        procs = reader.processes_of(EXECUTIONS)

        def first_event(ref: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if ref is None else _row(reader, ref["kind"], int(ref["index"]))

        def around(copy: dict[str, Any]) -> dict[str, Any]:
            # Its neighbours in its own process's order (the index holds every process's
            # events: global neighbours would be another rank's), as /api/executions?process=.
            p, index = int(copy["process"]), int(copy["index"])
            mine = run.cached(("executions of", p), lambda: np.flatnonzero(procs == p))
            pos = int(np.searchsorted(mine, index))
            lo, hi = max(0, pos - window), min(len(mine), pos + window + 1)
            rows = [_row(reader, EXECUTIONS, i) for i in mine[lo:hi].tolist()]
            return {"process": p, "index": index, "at": pos - lo, "rows": rows}

        spread = ranks.get("spread") or {}
        return {
            # Each process with the list row of its first Inf/NaN (op type, step, counts).
            "ranks": {**ranks, "processes": [{**p, "first_event": first_event(p["first"])}
                                             for p in ranks["processes"]]},
            "around": [around(c) for c in spread.get("copies", [])],
        }  # fmt: skip

    return run.cached(("ranks", window), compute, bounded=True)


def _row(reader: DumpReader, kind: str, i: int) -> dict[str, Any]:
    """An event as a list row; the index's facts alone when its record cannot be decoded."""
    try:
        return reader.execution(i).to_json() if kind == EXECUTIONS else reader.trace(i).to_json()
    except UNREADABLE as exc:
        return {**reader.index_json(kind, i), "error": str(exc)}


def _list(kind: str) -> Route:
    @_reading
    def route(run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
        selected = _filtered(run, reader, kind, q)
        total = reader.num(kind) if selected is None else len(selected)
        begin, end = q.page(total)
        indices = range(begin, end) if selected is None else selected[begin:end].tolist()
        out = {"begin": begin, "end": end, "total": total,
               "rows": [_row(reader, kind, i) for i in indices]}  # fmt: skip
        at = q.optional_int("position_of", lo=0)
        if at is not None:
            # Where event ``at`` sits in this (filtered) list, or the next one after it.
            pos = min(at, total) if selected is None else int(np.searchsorted(selected, at))
            exact = pos < total and (selected is None or int(selected[pos]) == at)
            out["position"] = pos if pos < total else None
            out["exact"] = bool(exact)
        return out

    return route


executions_route = _list(EXECUTIONS)
traces_route = _list(TRACES)


def _event_index(reader: DumpReader, kind: str, args: Mapping[str, Any]) -> int:
    index = int(args["index"])
    n = reader.num(kind)
    if not 0 <= index < n:
        raise ApiError(404, f"no {kind.replace('_', ' ')} #{index} (the run has {n})")
    return index


def _detail(
    reader: DumpReader, args: Mapping[str, Any], kind: str
) -> tuple[ViewBuilder, EventView]:
    """One event's view (404 when it is absent or cannot be decoded)."""
    index = _event_index(reader, kind, args)
    views = ViewBuilder(reader, LOOKBACK)
    try:
        return views, views.view(kind, index)
    except UNREADABLE as exc:
        name = kind.replace("_", " ")
        raise ApiError(404, f"{name} #{index} cannot be decoded: {exc}") from None


@_reading
def execution_route(
    run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]
) -> dict[str, Any]:
    views, view = _detail(reader, args, EXECUTIONS)
    ex = reader.execution(view.index)
    out = view.to_json()
    out["stack"] = _stack_json(run, reader, ex.stack_frame_ids, ex.process)
    out["outputs"] = ex.outputs_json()
    out["input_tensor_ids"] = list(ex.input_tensor_ids)
    out["output_tensor_ids"] = list(ex.output_tensor_ids)
    fwd = views.by_sequence(ex.forward_sequence, ex.process) if ex.forward_sequence else None
    out["forward_index"] = fwd.index if fwd is not None else None
    out["consumers"] = consumers(reader, ex.index, ex.output_tensor_ids, ex.process)
    out["has_values"] = bool(ex.tensor_values and any(v is not None for v in ex.tensor_values))
    out["graph"] = {"graph_id": ex.graph_id, "graph_name": view.graph_name} if ex.graph_id else None
    out["collective"] = ex.collective.to_json() if ex.collective is not None else None
    return out


@_reading
def trace_route(run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    _, view = _detail(reader, args, TRACES)
    tr = reader.trace(view.index)
    out = view.to_json()
    op = reader.graph_op(tr.graph_id, tr.op_name, tr.process)
    out["stack"] = _stack_json(run, reader, op.stack_frame_ids, tr.process) if op else []
    out["outputs"] = tr.outputs_json()
    out["graph_ids"] = list(tr.graph_ids)
    out["has_values"] = tr.tensor_value is not None
    return out


@_reading
def graph_op_route(
    run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]
) -> dict[str, Any]:
    process = q.process(reader) or 0
    graph_id = q.required("graph_id")
    op_name = q.required("op_name")
    near = q.optional_int("near", lo=0)
    graph = reader.graph(graph_id, process)
    if graph is None:
        raise ApiError(404, f"no graph {graph_id!r} in process {process}")
    op = graph.ops.get(op_name)
    if op is None:
        raise ApiError(404, f"no op {op_name!r} in graph {graph.name or graph_id}")
    inputs, consumers = graph_op_edges(reader, graph, op_name, near)
    return {
        "graph_id": graph_id,
        "graph_name": graph.name,
        "graph_ids": reader.graph_chain(graph_id, process),
        "op": {"op_name": op.op_name, "op_type": op.op_type, "num_outputs": op.num_outputs,
               "device": op.device_name, "module_path": op.module_path,
               "stack": _stack_json(run, reader, op.stack_frame_ids, process)},
        "inputs": inputs,
        "consumers": consumers,
    }  # fmt: skip


def _status(run: Run, reader: DumpReader, kind: str) -> np.ndarray:
    """Per event: 0 the mode does not tell, 1 finite, 2 Inf but no NaN, 3 NaN (cached)."""

    def compute() -> np.ndarray:
        rows = reader.index(kind)
        flag = rows["nonfinite"]
        only_inf = (rows["nan"] == 0) & ((rows["neg_inf"] > 0) | (rows["pos_inf"] > 0))
        status = np.where(flag == 1, np.where(only_inf, 2, 3), np.where(flag == 0, 1, 0))
        return status.astype(np.int8)

    return run.cached(("status", kind), compute)


@_reading
def timeline_route(
    run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]
) -> dict[str, Any]:
    kind = q.kind()
    selected = _filtered(run, reader, kind, q)
    rows = reader.index(kind)
    total = len(rows) if selected is None else len(selected)
    begin = min(q.integer("begin", 0, lo=0), total)
    end = min(q.integer("end", total, lo=0), total)
    if end < begin:
        raise ApiError(400, f"end ({end}) is before begin ({begin})")
    wanted = q.integer("buckets", 1000, lo=1, hi=MAX_BUCKETS)
    n = end - begin
    buckets = min(wanted, n)
    if buckets == 0:
        return {"begin": begin, "end": end, "total": total, "bucket_size": 0.0,
                "status": [], "nonfinite": [], "steps": [], "first_index": []}  # fmt: skip
    idx = np.arange(begin, end) if selected is None else selected[begin:end]
    status = _status(run, reader, kind)[idx]
    width = n / buckets
    starts = np.floor(np.arange(buckets) * width).astype(np.int64)
    return {
        "begin": begin,
        "end": end,
        "total": total,
        "bucket_size": width,
        "status": np.maximum.reduceat(status, starts).tolist(),
        "nonfinite": np.add.reduceat((status >= 2).astype(np.int64), starts).tolist(),
        # None for dumps that record no steps (TensorFlow's), not a row of zeros.
        "steps": rows["step"][idx[starts]].tolist() if reader.steps_known else None,
        "first_index": idx[starts].tolist(),
    }


def source_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded source file, highlighted. The text is read under the run's lock, and
    highlighted after it is released: a file slow to highlight (they come from the dump,
    so may be crafted) then delays only its own request, never a refresh of the run that
    every other request would queue behind."""
    run = _run(runs, q)
    try:
        with run.reading() as reader:
            found = _source_text(run, reader, q)
    except DumpNotFoundError as exc:
        raise ApiError(404, str(exc)) from None
    text = HIGHLIGHTER(found["path"], found["lines"])
    return {**found, "lines": text.lines, "highlighted": text.highlighted}


def _source_text(run: Run, reader: DumpReader, q: Query) -> dict[str, Any]:
    """/api/source's answer with the file's raw lines (under the run's lock)."""
    process = q.process(reader) or 0
    recorded = reader.source_files(process)
    file_index = q.optional_int("file", lo=0)
    path = q.text("path", max_len=4096)
    if file_index is None and path is None:
        raise ApiError(400, "give file=<file_index> or path=<recorded path>")
    # Only what the dump recorded is served: an exact match, never a disk read.
    if file_index is None:
        matches = [f for f in recorded if f.file_path == path]
        if not matches:
            raise ApiError(404, "that file was not recorded in this dump")
        info = matches[0]
    elif file_index < len(recorded):
        info = recorded[file_index]
    else:
        raise ApiError(404, f"no source file #{file_index} in this dump")

    def compute() -> dict[str, Any]:
        try:
            lines = reader.source_lines(info.index, process)
        except (OSError, *UNREADABLE) as exc:
            raise ApiError(
                404, f"the recorded copy of {info.file_path} cannot be read: {exc}"
            ) from None
        if not lines:
            raise ApiError(404, f"the dump did not record the text of {info.file_path}")
        return {"process": process, "file_index": info.index, "path": info.file_path,
                "host": info.host_name, "num_lines": len(lines), "lines": list(lines)}  # fmt: skip

    return run.cached(("source", process, info.index), compute)


@_reading
def source_files_route(
    run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]
) -> dict[str, Any]:
    process = q.process(reader)
    procs = range(len(reader.processes)) if process is None else [process]
    return {
        "files": [
            f.to_json()
            for p in procs
            for f in reader.source_files(p)
            if f.num_lines  # only files whose text the dump holds
        ]
    }


@_reading
def tensor_route(run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    kind = q.kind()
    index = _event_index(reader, kind, {"index": q.integer("index", lo=0)})
    slot = q.integer("slot", 0, lo=0)
    limit = q.integer("limit", 1000, lo=1, hi=MAX_TENSOR_VALUES)
    try:
        if kind == EXECUTIONS:
            ex = reader.execution(index)
            vals, problems, mode = ex.tensor_values or (), ex.problems, ex.tensor_debug_mode
            value = vals[slot] if slot < len(vals) else None
        else:
            tr = reader.trace(index)
            value, problems, mode = tr.tensor_value, tr.problems, tr.tensor_debug_mode
    except UNREADABLE as exc:
        raise ApiError(404, f"{kind} #{index} cannot be decoded: {exc}") from None
    if value is None:
        # A value the reader refused (a shape claiming more than the record holds): say why.
        refused = [
            m for m in problems if f": output {slot}: " in m and mode == TensorDebugMode.FULL_TENSOR
        ]
        if refused:
            raise ApiError(404, f"the values of this tensor cannot be read: {refused[0]}")
        raise ApiError(404, "no values recorded for this tensor (record in FULL_TENSOR mode)")
    return {"kind": kind, "index": index, "slot": slot, **values_json(value, limit)}


@_reading
def headroom_route(
    run: Run, reader: DumpReader, q: Query, args: Mapping[str, Any]
) -> dict[str, Any]:
    """Per module, each step's largest |x| as a fraction of its format's largest value."""
    target = q.text("format", max_len=40) or None
    if target is not None and target not in TARGET_FORMATS:
        raise ApiError(400, f"parameter format must be one of {', '.join(TARGET_FORMATS)}")
    process = q.optional_int("process", lo=0)
    top = q.integer("top", 8, lo=1, hi=MAX_HEADROOM_SERIES)
    headroom = _analysis(run, reader).get("headroom")

    def compute() -> dict[str, Any]:
        series = headroom_series(reader, target, process=process, top=top)
        if target is None:
            warnings = headroom["warnings"] if headroom else []
            before = headroom["before_step"] if headroom else None
        else:
            h = analyze_headroom(reader, target, _analysis_of(run, reader).first_harm)
            warnings = [w.to_json() for w in h.warnings] if h else []
            before = h.before_step if h else None
        return {**series, "recorded": headroom is not None, "warnings": warnings,
                "before_step": before}  # fmt: skip

    return run.cached(("headroom", target, process, top), compute, bounded=True)


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
}
