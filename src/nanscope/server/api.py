"""The JSON API's handlers: pure functions from a run set and query parameters to JSON values.

Each handler takes the :class:`~nanscope.server.runs.RunSet`, the query
(:class:`Query`) and the path's arguments, and returns a JSON-able dict or
raises :class:`ApiError`. The contract is ``http_api.md`` beside this file.
Nothing here touches HTTP, so tests call the handlers directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nanscope._paths import is_user_file
from nanscope.analysis import Counts, ViewBuilder, analyze
from nanscope.analysis.rootcause import count_alerts, first_event, process_json
from nanscope.analysis.views import PHASES, counts_of, execution_counts
from nanscope.format.files import DumpNotFoundError
from nanscope.format.modes import TensorDebugMode, shape_from_summary
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
from nanscope.server.runs import Run, RunNotFound, RunSet
from nanscope.server.source import tokenize

MAX_PAGE = 1000
MAX_BUCKETS = 4000
MAX_TENSOR_VALUES = 100_000
CONSUMER_LOOKAHEAD = 2000
CONSUMER_LIMIT = 20
# Producers of an event's inputs are looked for this many events back.
LOOKBACK = 2000
KINDS = (EXECUTIONS, TRACES)


class ApiError(Exception):
    """A request the API refuses: ``status`` 400 or 404, and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Query:
    """Typed access to query parameters, with 400 errors that say what is wrong."""

    def __init__(self, params: Mapping[str, str]) -> None:
        self._params = params

    def text(self, name: str, default: str | None = None, max_len: int = 4096) -> str | None:
        value = self._params.get(name)
        if value is None:
            return default
        if len(value) > max_len:
            raise ApiError(400, f"parameter {name} is longer than {max_len} characters")
        return value

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise ApiError(400, f"parameter {name} is required")
        return value

    def integer(
        self, name: str, default: int | None = None, lo: int | None = None, hi: int | None = None
    ) -> int:
        raw = self.text(name, max_len=20)
        if raw is None or raw == "":
            if default is None:
                raise ApiError(400, f"parameter {name} is required (an integer)")
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, f"parameter {name} must be an integer, not {raw[:40]!r}") from None
        if lo is not None and value < lo:
            raise ApiError(400, f"parameter {name} must be at least {lo} (got {value})")
        if hi is not None and value > hi:
            raise ApiError(400, f"parameter {name} must be at most {hi} (got {value})")
        return value

    def optional_int(self, name: str, lo: int | None = None) -> int | None:
        if self.text(name, max_len=20) in (None, ""):
            return None
        return self.integer(name, lo=lo)

    def flag(self, name: str) -> bool:
        raw = self.text(name, "0", max_len=5)
        if raw in ("1", "true", "yes"):
            return True
        if raw in ("0", "false", "no", ""):
            return False
        raise ApiError(400, f"parameter {name} must be 1 or 0, not {raw!r}")

    def kind(self, name: str = "kind") -> str:
        value = self.text(name, EXECUTIONS, max_len=40) or EXECUTIONS
        if value not in KINDS:
            raise ApiError(400, f"parameter {name} must be 'execution' or 'graph_execution_trace'")
        return value


# -- shared pieces -------------------------------------------------------------------------------


def _run(runs: RunSet, q: Query) -> Run:
    try:
        return runs.get(q.text("run", max_len=1024))
    except RunNotFound as exc:
        raise ApiError(404, str(exc)) from None


def _open(run: Run) -> DumpReader:
    try:
        return run.reader()
    except DumpNotFoundError as exc:
        run.error = str(exc)
        raise ApiError(404, str(exc)) from None


def _process(reader: DumpReader, q: Query) -> int | None:
    p = q.optional_int("process", lo=0)
    if p is not None and p >= len(reader.processes):
        raise ApiError(404, f"no process {p} in this run ({len(reader.processes)} processes)")
    return p


def _counts_json(c: Counts | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"size": c.size, "neg_inf": c.neg_inf, "pos_inf": c.pos_inf, "nan": c.nan,
            "neg": c.neg, "zero": c.zero, "pos": c.pos, "dtype": c.dtype}  # fmt: skip


def _nonfinite(flag: int) -> bool | None:
    return None if flag < 0 else bool(flag)


def _filtered(run: Run, reader: DumpReader, kind: str, q: Query) -> np.ndarray | None:
    """Global indices passing the query's filters, or None when there is no filter."""
    process = _process(reader, q)
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

    return run.cached(("filter", kind, process, only_bad, op_type), compute)


def _page(q: Query, total: int) -> tuple[int, int]:
    begin = q.integer("begin", 0, lo=0)
    end = q.integer("end", min(total, begin + 100), lo=0)
    if end < begin:
        raise ApiError(400, f"end ({end}) is before begin ({begin})")
    if end - begin > MAX_PAGE:
        raise ApiError(400, f"a page holds at most {MAX_PAGE} events (asked {end - begin})")
    return min(begin, total), min(end, total)


def _stack_json(reader: DumpReader, frame_ids: tuple[str, ...], process: int) -> list[Any]:
    recorded = {f.index for f in reader.source_files(process) if f.num_lines}
    return [
        {"file": f.file_path, "line": f.lineno, "function": f.function,
         "file_index": f.file_index if f.file_index in recorded else -1,
         "user": is_user_file(f.file_path) and not Path(f.file_path).name.startswith("<")}
        for f in reader.stack_frames(frame_ids, process)
    ]  # fmt: skip


def _values(mode: TensorDebugMode, v: np.ndarray | None) -> tuple[Counts, list[Any] | None]:
    return counts_of(mode, v), None if v is None else [float(x) for x in np.asarray(v).ravel()]


# -- routes --------------------------------------------------------------------------------------


def runs_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    out = []
    for name in runs.names():
        run = runs.get(name)
        entry: dict[str, Any] = {"run": name, "run_id": "", "framework": "",
                                 "tensor_debug_mode": None, "num_executions": 0,
                                 "num_graph_execution_traces": 0, "generation": 0, "steps_known": False,
                                 "processes": [], "problems": [], "error": None}  # fmt: skip
        with run.lock:
            try:
                r = run.reader()
            except DumpNotFoundError as exc:
                entry["error"] = str(exc)
                out.append(entry)
                continue
            mode = r.tensor_debug_mode
            entry.update(
                run_id=r.run_id,
                framework=r.framework,
                tensor_debug_mode=mode.name if mode is not None else None,
                num_executions=r.num_executions(),
                num_graph_execution_traces=r.num_graph_execution_traces(),
                generation=r.generation,
                # TensorFlow's dumps record no training step (every event says 0).
                steps_known=any(p.nanscope_version for p in r.processes),
                processes=[process_json(p) for p in r.processes],
                problems=[{"severity": p.severity, "message": p.message} for p in r.problems],
            )
        out.append(entry)
    return {"logdir": str(runs.logdir), "runs": out}


def alerts_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    with run.lock:
        reader = _open(run)

        process = _process(reader, q)

        def compute() -> dict[str, Any]:
            a = count_alerts(reader, process)
            categories = []
            for cat in ("neg_inf", "pos_inf", "nan", "nonfinite"):
                count, at = first_event(reader, cat, process)
                where = {"kind": at[0], "index": at[1]} if at else None
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


def analysis_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    with run.lock:
        reader = _open(run)

        def compute() -> dict[str, Any]:
            a = analyze(reader)
            return {**a.to_json(), "headline": a.headline}

        return run.cached("analysis", compute)


def _execution_row(reader: DumpReader, i: int) -> dict[str, Any]:
    row = reader.index(EXECUTIONS)[i]
    out: dict[str, Any] = {
        "index": i,
        "process": int(reader.processes_of(EXECUTIONS)[i]),
        "op_type": reader.string(int(row["name"])),
        "step": int(row["step"]),
        "wall_time": float(row["wall_time"]),
        "phase": PHASES.get(int(row["phase"]), ""),
        "graph_id": reader.string(int(row["graph"])),
        "num_outputs": int(row["slot"]),
        "nonfinite": _nonfinite(int(row["nonfinite"])),
        "counts": None,
        "shape": None,
    }
    try:
        ex = reader.execution(i)
    except UNREADABLE as exc:
        out["error"] = str(exc)
        return out
    counts, out["shape"] = execution_counts(ex)
    out["counts"] = _counts_json(counts)
    return out


def _trace_row(reader: DumpReader, i: int) -> dict[str, Any]:
    row = reader.index(TRACES)[i]
    process = int(reader.processes_of(TRACES)[i])
    graph_id = reader.string(int(row["graph"]))
    op_name = reader.string(int(row["name"]))
    graph = reader.graph(graph_id, process)
    op = graph.ops.get(op_name) if graph else None
    out: dict[str, Any] = {
        "index": i,
        "process": process,
        "op_name": op_name,
        "op_type": op.op_type if op else "",
        "output_slot": int(row["slot"]),
        "graph_id": graph_id,
        "graph_name": graph.name if graph else "",
        "step": int(row["step"]),
        "wall_time": float(row["wall_time"]),
        "device": "",
        "nonfinite": _nonfinite(int(row["nonfinite"])),
        "counts": None,
        "shape": None,
    }
    try:
        tr = reader.trace(i)
    except UNREADABLE as exc:
        out["error"] = str(exc)
        return out
    mode = tr.tensor_debug_mode
    value = tr.debug_tensor_value if tr.debug_tensor_value is not None else tr.tensor_value
    out["device"] = tr.device_name
    if value is not None:
        out["counts"] = _counts_json(counts_of(mode, value))
        if mode == TensorDebugMode.SHAPE:
            out["shape"] = list(shape_from_summary(value))
    return out


def _list(kind: str, row_of: Callable[[DumpReader, int], dict[str, Any]]) -> Any:
    def route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
        run = _run(runs, q)
        with run.lock:
            reader = _open(run)
            selected = _filtered(run, reader, kind, q)
            total = reader.num(kind) if selected is None else len(selected)
            begin, end = _page(q, total)
            indices = range(begin, end) if selected is None else selected[begin:end].tolist()
            out = {"begin": begin, "end": end, "total": total,
                   "rows": [row_of(reader, i) for i in indices]}  # fmt: skip
            at = q.optional_int("position_of", lo=0)
            if at is not None:
                # Where event ``at`` sits in this (filtered) list, or the next one after it.
                pos = min(at, total) if selected is None else int(np.searchsorted(selected, at))
                exact = pos < total and (selected is None or int(selected[pos]) == at)
                out["position"] = pos if pos < total else None
                out["exact"] = bool(exact)
            return out

    return route


executions_route = _list(EXECUTIONS, _execution_row)
traces_route = _list(TRACES, _trace_row)


def _event_index(reader: DumpReader, kind: str, args: Mapping[str, Any]) -> int:
    index = int(args["index"])
    n = reader.num(kind)
    if not 0 <= index < n:
        raise ApiError(404, f"no {kind.replace('_', ' ')} #{index} (the run has {n})")
    return index


def _consumers(reader: DumpReader, index: int, outputs: tuple[int, ...], process: int) -> list[Any]:
    wanted = {tid: slot for slot, tid in enumerate(outputs) if tid}
    found: list[dict[str, Any]] = []
    procs = reader.processes_of(EXECUTIONS)
    end = min(reader.num_executions(), index + 1 + CONSUMER_LOOKAHEAD)
    for j in range(index + 1, end):
        if not wanted or len(found) >= CONSUMER_LIMIT:
            break
        if procs[j] != process:
            continue
        try:
            ex = reader.execution(j)
        except UNREADABLE:
            continue
        for in_slot, tid in enumerate(ex.input_tensor_ids):
            if tid in wanted:
                found.append({"kind": EXECUTIONS, "index": j, "op_type": ex.op_type,
                              "input_slot": in_slot, "output_slot": wanted[tid]})  # fmt: skip
                break
        # A tensor id written again by a later op is a new tensor: stop following the old one.
        for tid in ex.output_tensor_ids:
            wanted.pop(tid, None)
    return found


def execution_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    with run.lock:
        reader = _open(run)
        index = _event_index(reader, EXECUTIONS, args)
        views = ViewBuilder(reader, LOOKBACK)
        try:
            ex = reader.execution(index)
            view = views.view(EXECUTIONS, index)
        except UNREADABLE as exc:
            raise ApiError(404, f"execution #{index} cannot be decoded: {exc}") from None
        mode = ex.tensor_debug_mode
        out = view.to_json()
        out["stack"] = _stack_json(reader, ex.stack_frame_ids, ex.process)
        values = ex.debug_tensor_values if ex.debug_tensor_values is not None else None
        outputs = []
        for slot, tid in enumerate(ex.output_tensor_ids or range(ex.num_outputs)):
            summary = values[slot] if values is not None and slot < len(values) else None
            full = (
                ex.tensor_values[slot]
                if ex.tensor_values and slot < len(ex.tensor_values)
                else None
            )
            counts, raw = _values(mode, summary if summary is not None else full)
            outputs.append({
                "slot": slot,
                "tensor_id": tid if ex.output_tensor_ids else None,
                "counts": _counts_json(counts) if (summary is not None or full is not None) else None,
                "shape": list(full.shape) if full is not None
                else (list(shape_from_summary(summary))
                      if mode == TensorDebugMode.SHAPE and summary is not None else None),
                "summary": raw if summary is not None else None,
            })  # fmt: skip
        out["outputs"] = outputs
        out["input_tensor_ids"] = list(ex.input_tensor_ids)
        out["output_tensor_ids"] = list(ex.output_tensor_ids)
        fwd = views.by_sequence(ex.forward_sequence, ex.process) if ex.forward_sequence else None
        out["forward_index"] = fwd.index if fwd is not None else None
        out["consumers"] = _consumers(reader, index, ex.output_tensor_ids, ex.process)
        out["has_values"] = bool(ex.tensor_values and any(v is not None for v in ex.tensor_values))
        out["graph"] = (
            {"graph_id": ex.graph_id, "graph_name": view.graph_name} if ex.graph_id else None
        )
        return out


def trace_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    with run.lock:
        reader = _open(run)
        index = _event_index(reader, TRACES, args)
        try:
            tr = reader.trace(index)
            view = ViewBuilder(reader, LOOKBACK).view(TRACES, index)
        except UNREADABLE as exc:
            raise ApiError(
                404, f"graph execution trace #{index} cannot be decoded: {exc}"
            ) from None
        out = view.to_json()
        op = reader.graph_op(tr.graph_id, tr.op_name, tr.process)
        out["stack"] = _stack_json(reader, op.stack_frame_ids, tr.process) if op else []
        summary = tr.debug_tensor_value
        counts, raw = _values(
            tr.tensor_debug_mode, summary if summary is not None else tr.tensor_value
        )
        shape = (list(tr.tensor_value.shape) if tr.tensor_value is not None
                 else list(shape_from_summary(summary))
                 if tr.tensor_debug_mode == TensorDebugMode.SHAPE and summary is not None else None)  # fmt: skip
        known = summary is not None or tr.tensor_value is not None
        out["outputs"] = [{"slot": tr.output_slot, "tensor_id": None,
                           "counts": _counts_json(counts) if known else None, "shape": shape,
                           "summary": raw if summary is not None else None}]  # fmt: skip
        out["graph_ids"] = list(tr.graph_ids)
        out["has_values"] = tr.tensor_value is not None
        return out


def _nearest_trace(
    reader: DumpReader, process: int, graph_id: str, op_name: str, slot: int | None,
    near: int, later: bool,
) -> int | None:  # fmt: skip
    gid, nid = reader.string_id(graph_id), reader.string_id(op_name)
    if gid is None or nid is None:
        return None
    rows = reader.index(TRACES)
    procs = reader.processes_of(TRACES)
    lo, hi = (near + 1, len(rows)) if later else (0, near + 1)
    part = rows[lo:hi]
    mask = (part["graph"] == gid) & (part["name"] == nid) & (procs[lo:hi] == process)
    if slot is not None:
        mask &= part["slot"] == slot
    hits = np.flatnonzero(mask)
    if not hits.size:
        return None
    return lo + int(hits[0] if later else hits[-1])


def graph_op_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    with run.lock:
        reader = _open(run)
        process = _process(reader, q) or 0
        graph_id = q.required("graph_id")
        op_name = q.required("op_name")
        near = q.optional_int("near", lo=0)
        graph = reader.graph(graph_id, process)
        if graph is None:
            raise ApiError(404, f"no graph {graph_id!r} in process {process}")
        op = graph.ops.get(op_name)
        if op is None:
            raise ApiError(404, f"no op {op_name!r} in graph {graph.name or graph_id}")

        def trace_of(name: str, slot: int | None, later: bool) -> int | None:
            if near is None:
                return None
            return _nearest_trace(reader, process, graph_id, name, slot, near, later)

        inputs = []
        for in_slot, (src, src_slot) in enumerate(op.inputs):
            src_op = graph.ops.get(src)
            inputs.append({"op_name": src, "op_type": src_op.op_type if src_op else "",
                           "output_slot": src_slot, "input_slot": in_slot,
                           "trace_index": trace_of(src, src_slot, False)})  # fmt: skip
        consumers = []
        for out_slot, dst, in_slot in graph.consumers(op_name)[:200]:
            dst_op = graph.ops.get(dst)
            consumers.append({"op_name": dst, "op_type": dst_op.op_type if dst_op else "",
                              "output_slot": out_slot, "input_slot": in_slot,
                              "trace_index": trace_of(dst, None, True)})  # fmt: skip
        return {
            "graph_id": graph_id,
            "graph_name": graph.name,
            "graph_ids": reader.graph_chain(graph_id, process),
            "op": {"op_name": op.op_name, "op_type": op.op_type, "num_outputs": op.num_outputs,
                   "device": op.device_name, "module_path": op.module_path,
                   "stack": _stack_json(reader, op.stack_frame_ids, process)},
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


def timeline_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    kind = q.kind()
    with run.lock:
        reader = _open(run)
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
            "steps": rows["step"][idx[starts]].tolist()
            if any(p.nanscope_version for p in reader.processes)
            else None,
            "first_index": idx[starts].tolist(),
        }


def source_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    with run.lock:
        reader = _open(run)
        process = _process(reader, q) or 0
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
                    "host": info.host_name, "num_lines": len(lines),
                    "lines": tokenize(info.file_path, lines)}  # fmt: skip

        return run.cached(("source", process, info.index), compute)


def source_files_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    with run.lock:
        reader = _open(run)
        process = _process(reader, q)
        procs = range(len(reader.processes)) if process is None else [process]
        return {
            "files": [
                {"process": p, "file_index": f.index, "path": f.file_path, "host": f.host_name,
                 "num_lines": f.num_lines, "user": is_user_file(f.file_path)}
                for p in procs
                for f in reader.source_files(p)
                if f.num_lines  # only files whose text the dump holds
            ]
        }  # fmt: skip


def _json_number(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def tensor_route(runs: RunSet, q: Query, args: Mapping[str, Any]) -> dict[str, Any]:
    run = _run(runs, q)
    kind = q.kind()
    with run.lock:
        reader = _open(run)
        index = _event_index(reader, kind, {"index": q.integer("index", lo=0)})
        slot = q.integer("slot", 0, lo=0)
        limit = q.integer("limit", 1000, lo=1, hi=MAX_TENSOR_VALUES)
        try:
            if kind == EXECUTIONS:
                vals = reader.execution(index).tensor_values or ()
                value = vals[slot] if slot < len(vals) else None
            else:
                value = reader.trace(index).tensor_value
        except UNREADABLE as exc:
            raise ApiError(404, f"{kind} #{index} cannot be decoded: {exc}") from None
        if value is None:
            raise ApiError(404, "no values recorded for this tensor (record in FULL_TENSOR mode)")
        arr = np.asarray(value)
        flat = arr.ravel()
        stats: dict[str, Any] = {"finite": None, "min": None, "max": None, "mean": None}
        if arr.dtype.kind in "fc" or arr.dtype.kind in "iub":
            as_float = flat.astype(np.float64) if arr.dtype.kind != "c" else np.abs(flat)
            finite = as_float[np.isfinite(as_float)]
            stats["finite"] = int(finite.size)
            if finite.size:
                stats.update(min=float(finite.min()), max=float(finite.max()),
                             mean=float(finite.mean()))  # fmt: skip
        shown = flat[:limit]
        if arr.dtype.kind == "c":
            values: list[Any] = [
                [_json_number(float(v.real)), _json_number(float(v.imag))] for v in shown
            ]
        elif arr.dtype.kind == "b":
            values = [bool(v) for v in shown]
        elif arr.dtype.kind in "iu":
            values = [int(v) for v in shown]
        else:
            values = [_json_number(float(v)) for v in shown]
        return {"kind": kind, "index": index, "slot": slot, "dtype": str(arr.dtype),
                "shape": list(arr.shape), "size": int(arr.size), "values": values,
                "truncated": int(arr.size) > limit, "stats": stats}  # fmt: skip


Route = Callable[[RunSet, Query, Mapping[str, Any]], dict[str, Any]]

# Path (werkzeug rule syntax) -> handler; the server serves exactly these, read-only.
ROUTES: dict[str, Route] = {
    "/api/runs": runs_route,
    "/api/alerts": alerts_route,
    "/api/analysis": analysis_route,
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
