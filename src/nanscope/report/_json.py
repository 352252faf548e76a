"""The JSON report: the documented, stable form of an analysis (``docs/REPORT_JSON.md``).

What ``nanscope report --json`` prints and the GUI's ``/api/analysis`` serves: the
analysis's facts as they are, with its headline and notes as sentences
(``_sentences.py``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from nanscope.analysis import SCHEMA, Analysis, EventView, RankVerdict
from nanscope.report._headroom_words import headroom_json
from nanscope.report._sentences import headline, note_texts, rank_note_texts


def report_json(a: Analysis) -> dict[str, Any]:
    """``a`` as the JSON report (schema ``nanscope.report/2``): plain dicts, lists, strings
    and numbers, ready for ``json.dumps``."""

    def ev(v: EventView | None) -> dict[str, Any] | None:
        if v is None:
            return None
        d = v.to_json()
        lib = a.library_sources.get((v.kind, v.index))
        d["library_source"] = asdict(lib) if lib is not None else None
        return d

    return {
        "schema": SCHEMA,
        "verdict": a.verdict,
        "exit_status": a.exit_status,
        "headline": headline(a),
        "incomplete": a.incomplete,
        "logdir": a.logdir,
        "logdirs": a.logdirs or [a.logdir],
        "run_id": a.run_id,
        "framework": a.framework,
        "tensor_debug_mode": a.tensor_debug_mode,
        "processes": a.processes,
        "num_executions": a.num_executions,
        "num_graph_execution_traces": a.num_graph_execution_traces,
        "steps": a.steps,
        "found_nonfinite": a.found,
        "alerts": {
            "total": a.alerts.total,
            "executions": a.alerts.executions,
            "graph_execution_traces": a.alerts.graph_execution_traces,
            "by_op_type": a.alerts.by_op_type,
            "by_step": a.alerts.by_step,
        },
        "found_harmful": a.found_harmful,
        "origin": ev(a.origin),
        "origin_kind": a.origin_kind,
        "cause": ev(a.cause),
        "cause_evicted": a.cause_evicted,
        "first_inf": ev(a.first_inf),
        "first_nan": ev(a.first_nan),
        "state_nonfinite": ev(a.state_nonfinite),
        "lineages": [g.to_json() for g in a.lineages],
        "evicted": a.evicted,
        "chain": [c.to_json() for c in a.chain],
        "ranks": ranks_json(a.ranks) if a.ranks is not None else None,
        "headroom": headroom_json(a.headroom) if a.headroom is not None else None,
        "notes": note_texts(a),
        "problems": a.problems,
    }


def ranks_json(v: RankVerdict) -> dict[str, Any]:
    """The JSON report's ``ranks``: the cross-rank verdict's facts and its ``notes``, worded."""
    return {**v.to_json(), "notes": rank_note_texts(v)}
