"""What the GUI shows of a whole run: its entry in the run list, alerts, analysis, ranks and
headroom."""

from __future__ import annotations

from typing import Any

import numpy as np

from nanscope.analysis import Analysis, analyze, analyze_headroom, count_alerts, headroom_series
from nanscope.format.files import DumpNotFoundError
from nanscope.reader import EXECUTIONS, DumpReader
from nanscope.report import report_json, warning_json
from nanscope.server.provider.rows import row
from nanscope.server.runs import Run, RunSet


def run_list(runs: RunSet) -> dict[str, Any]:
    """``/api/runs``: the logdir and every run under it."""
    return {"logdir": str(runs.logdir), "runs": [run_entry(runs.get(n)) for n in runs.names()]}


def run_entry(run: Run) -> dict[str, Any]:
    """One run's entry in the run list; a run that cannot be opened gets its ``error``."""
    entry: dict[str, Any] = {
        "run": run.name,
        "run_id": "",
        "framework": "",
        "tensor_debug_mode": None,
        "num_executions": 0,
        "num_graph_execution_traces": 0,
        "generation": 0,
        "steps_known": False,
        "processes": [],
        "problems": [],
        "incomplete": True,
        "num_incomplete": 0,
        "error": None,
    }
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


def alerts(run: Run, reader: DumpReader, process: int | None) -> dict[str, Any]:
    """``/api/alerts``: events holding Inf/NaN, counted by category, op type and step, with
    the first of each category (of one process, or of all)."""

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


def analysis_of(run: Run, reader: DumpReader) -> Analysis:
    """The run's analysis, computed once (shared by every route that needs it)."""
    return run.cached("analysis object", lambda: analyze(reader))


def analysis(run: Run, reader: DumpReader) -> dict[str, Any]:
    """``/api/analysis``: the run's analysis as JSON (also read by ranks and headroom)."""
    # Its "verdict" and "incomplete" decide what the page leads with.
    return run.cached("analysis", lambda: report_json(analysis_of(run, reader)))


def ranks(run: Run, reader: DumpReader, window: int) -> dict[str, Any]:
    """``/api/ranks``: the cross-rank verdict, each process with the row of its first
    Inf/NaN, and ``window`` rows either side of each rank's copy of the collective that
    spread it."""
    verdict = analysis(run, reader).get("ranks")
    if verdict is None:
        return {"ranks": None}

    def compute() -> dict[str, Any]:
        procs = reader.processes_of(EXECUTIONS)

        def first_event(ref: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if ref is None else row(reader, ref["kind"], int(ref["index"]))

        def around(copy: dict[str, Any]) -> dict[str, Any]:
            # Its neighbours in its own process's order (the index holds every process's
            # events: global neighbours would be another rank's), as /api/executions?process=.
            p, index = int(copy["process"]), int(copy["index"])
            mine = run.cached(("executions of", p), lambda: np.flatnonzero(procs == p))
            pos = int(np.searchsorted(mine, index))
            lo, hi = max(0, pos - window), min(len(mine), pos + window + 1)
            rows = [row(reader, EXECUTIONS, i) for i in mine[lo:hi].tolist()]
            return {"process": p, "index": index, "at": pos - lo, "rows": rows}

        spread = verdict.get("spread") or {}
        processes = [{**p, "first_event": first_event(p["first"])} for p in verdict["processes"]]
        return {
            # Each process with the list row of its first Inf/NaN (op type, step, counts).
            "ranks": {**verdict, "processes": processes},
            "around": [around(c) for c in spread.get("copies", [])],
        }

    return run.cached(("ranks", window), compute, bounded=True)


def headroom(
    run: Run, reader: DumpReader, target: str | None, process: int | None, top: int
) -> dict[str, Any]:
    """``/api/headroom``: per module, each step's largest |x| as a fraction of its format's
    largest value (the ``top`` modules of one process, or of all), measured against
    ``target`` (``None``: each value's own format), and the run's warnings for it."""
    recorded = analysis(run, reader).get("headroom")

    def compute() -> dict[str, Any]:
        series = headroom_series(reader, target, process=process, top=top)
        if target is None:
            warnings = recorded["warnings"] if recorded else []
            before = recorded["before_step"] if recorded else None
        else:
            h = analyze_headroom(reader, target, analysis_of(run, reader).first_harm)
            warnings = [warning_json(w) for w in h.warnings] if h else []
            before = h.before_step if h else None
        return {
            **series,
            "recorded": recorded is not None,
            "warnings": warnings,
            "before_step": before,
        }

    return run.cached(("headroom", target, process, top), compute, bounded=True)
