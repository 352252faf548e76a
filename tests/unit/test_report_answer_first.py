"""The text report leads with the answer.

Each report here is rendered from an :class:`Analysis` built by hand, so that what is
asserted is the renderer's order and wording alone: the verdict line before the evidence,
no green check above a red cross, the cause's op type in the op-type table's first row,
one short line per lineage with no line repeated step after step, TensorFlow's reads of
variables already non-finite folded into one line, a step header that counts steps as the
program's loop did, and the Headroom section only where a value came near its format's
limit.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from typing import Any

from nanscope.analysis import Alerts, Analysis, EventView, Headroom, HeadroomWarning, LineageGroup
from nanscope.analysis._views import Source
from nanscope.format.health import Health
from nanscope.report import _text, console_for, render_text, report_json
from nanscope.vocabulary import EventKind, LineageVerdict, OriginKind, Verdict

WIDTH = 100


def event(
    index: int,
    op_type: str,
    *,
    step: int = 3,
    line: int = 98,
    nan: int = 0,
    kind: str = EventKind.EXECUTION,
    op_name: str | None = None,
) -> EventView:
    return EventView(
        kind=kind,
        index=index,
        process=0,
        rank=None,
        op_type=op_type,
        op_name=op_name or op_type,
        graph_id="",
        graph_name="",
        step=step,
        wall_time=0.0,
        phase="forward",
        module_path="",
        device="cpu",
        counts=Health(
            size=10,
            neg_inf=0 if nan else 2,
            pos_inf=0,
            nan=nan,
            any_nonfinite=True,
            dtype="float32",
        ),
        shape=[10],
        inputs=[],
        source=Source("/work/model.py", line, "forward"),
        stack=[],
        explanation="log of zero",
    )


def group(
    v: EventView, kind: LineageVerdict = LineageVerdict.HARMFUL, count: int = 1
) -> LineageGroup:
    return LineageGroup(
        kind=kind,
        birth=v,
        count=count,
        reaches=["the loss (backward() was called on it)"],
        absorbed_at={"kind": v.kind, "index": v.index + 1, "op_type": "aten._softmax.default"}
        if kind == LineageVerdict.BENIGN
        else None,
        handled_at=None,
    )


def alerts(*rows: tuple[str, int, int], kind: str = EventKind.EXECUTION) -> Alerts:
    by_op = [
        {"op_type": op, "kind": kind, "count": n, "first_index": first} for op, n, first in rows
    ]
    total = sum(n for _, n, _ in rows)
    return Alerts(
        total=total,
        executions=total,
        by_op_type=by_op,
        by_step=[{"step": 3, "count": total, "first": {"kind": kind, "index": 1}}],
    )


def analysis(**kw: Any) -> Analysis:
    base: dict[str, Any] = dict(
        logdir="/tmp/dump",
        run_id="r1",
        framework="torch 2.5",
        tensor_debug_mode="FULL_HEALTH",
        processes=[{}],
        num_executions=700,
        num_graph_execution_traces=0,
        steps=[0, 5],
        alerts=Alerts(),
    )
    base.update(kw)
    return Analysis(**base)


def harmful() -> Analysis:
    cause = event(407, "aten.log.default")
    return analysis(
        alerts=alerts(
            *[(f"aten.op{k}.default", 40 - k, 410 + k) for k in range(12)],
            ("aten.log.default", 3, 407),
        ),
        origin=cause,
        origin_kind=OriginKind.BORN,
        cause=cause,
        first_inf=cause,
        found_harmful=True,
        lineages=[group(cause)],
        chain=[cause],
    )


def text(a: Analysis) -> str:
    out = io.StringIO()
    console = console_for(out)
    console.width = WIDTH
    render_text(a, console)
    return out.getvalue()


def test_the_verdict_comes_before_the_evidence() -> None:
    out = text(harmful())
    assert out.index("✗ aten.log.default produced -inf at step 3") < out.index(
        "Inf/NaN in 417 events"
    )
    assert out.index("✗") < out.index("op type") < out.index("Cause:")
    # The counts are evidence, not a second verdict: one cross, the answer's.
    assert out.count("✗") == 1, out


def test_no_green_check_above_a_red_cross() -> None:
    mask = event(12, "aten.log.default", step=0)
    a = analysis(
        alerts=alerts(("aten.log.default", 1, 12)),
        origin=mask,
        origin_kind=OriginKind.BORN,
        first_inf=mask,
        lineages=[group(mask, LineageVerdict.BENIGN)],
    )
    assert a.verdict == Verdict.ABSORBED
    out = text(a)
    assert out.lstrip().splitlines()[3].startswith("✓ no harmful Inf/NaN"), out
    assert "✗" not in out, out


def test_the_cause_op_leads_the_op_type_table() -> None:
    out = text(harmful())
    table = out[out.index("op type") :].splitlines()
    assert table[1].startswith("aten.log.default"), out
    assert "the cause" in table[1]
    # The JSON keeps its documented order: most events first.
    assert report_json(harmful())["alerts"]["by_op_type"][0]["op_type"] == "aten.op0.default"


def test_lineages_one_short_line_each_without_repeats() -> None:
    a = harmful()
    steps = [event(500 + s, "aten.div.Tensor", step=s, line=83) for s in (3, 4, 5)]
    a = replace(a, lineages=a.lineages + [group(v) for v in steps])
    out = text(a)
    section = out[out.index("lineages (") :].splitlines()[1:]
    lines = [ln for ln in section if ln.strip()]
    assert len(lines) == 2, out
    assert "aten.div.Tensor #503 ×3 at model.py:83, steps 3–5" in lines[1], out
    assert all(len(ln) <= WIDTH for ln in lines)
    assert "(backward() was called on it)" not in out, out


def test_tensorflow_variable_reads_are_one_line_not_harmful_births() -> None:
    kind = EventKind.GRAPH_EXECUTION_TRACE
    log = event(59, "Log", kind=kind, step=2, line=58)
    reads = [
        event(
            62 + 5 * k,
            "ReadVariableOp",
            kind=kind,
            step=2 + k % 2,
            line=50,
            op_name=f"MatMul_{k}/ReadVariableOp",
        )
        for k in range(6)
    ]
    a = analysis(
        framework="tensorflow 2.16",
        alerts=alerts(("Log", 4, 59), ("ReadVariableOp", 28, 62), kind=kind),
        origin=log,
        cause=log,
        found_harmful=True,
        lineages=[group(log, count=4)] + [group(v, count=4) for v in reads],
    )
    out = text(a)
    section = out[out.index("lineages (") :]
    assert "ReadVariableOp #" not in section, section
    assert "and 24 reads of variables that already held Inf/NaN, steps 2–3" in section, section
    assert "harmful  Log #59 ×4" in section


def test_the_step_header_counts_the_loop_s_steps() -> None:
    # A loop of 6 steps printed "step 0".."step 5"; its evaluation after the last update
    # is recorded as step 6.
    a = analysis(steps=[0, 6], after_last_step=True)
    assert _text.steps_header(a) == "steps 0–5 (step 6: after the last)"
    assert "steps 0–5 (step 6: after the last)" in text(a)
    assert _text.steps_header(analysis(steps=[0, 5])) == "steps 0–5"
    assert _text.steps_header(analysis(steps=None)) == "no steps"


def test_headroom_only_where_a_value_came_near_its_limit() -> None:
    far = [
        {
            "module": "fc",
            "phase": "forward",
            "step": s,
            "dtype": "float32",
            "max_abs": 12.0,
            "min_nonzero_abs": 1e-3,
            "level": 3.5e-38,
        }
        for s in (0, 1, 2)
    ]
    a = harmful()
    a = replace(a, headroom=Headroom(target=None, before_step=3, before_inf=far))
    assert "Headroom" not in text(a)
    near = [dict(r, max_abs=6e4, dtype="float16", level=0.9) for r in far]
    a = replace(a, headroom=Headroom(target=None, before_step=3, before_inf=near))
    assert "Headroom" in text(a)
    warned = HeadroomWarning(
        kind="overflow",
        process=0,
        rank=None,
        module="fc",
        phase="forward",
        format="float16",
        value=6e4,
        limit=65504.0,
        step=2,
        since_step=1,
        growth_per_100=None,
        steps_left=None,
        index=5,
    )
    a = replace(a, headroom=Headroom(target=None, warnings=[warned]))
    out = text(a)
    assert "Headroom" in out and "near overflow: `fc`" in out, out


def test_vocabulary_serialises_as_the_documented_strings() -> None:
    a = harmful()
    data = json.loads(json.dumps(report_json(a)))
    assert data["verdict"] == "harmful" and data["exit_status"] == 1
    assert data["origin_kind"] == "born"
    assert data["lineages"][0]["kind"] == "harmful"
    assert f"{LineageVerdict.BENIGN:<8}|" == "benign  |"
    assert str(Verdict.INCOMPLETE) == "incomplete" and Verdict.INCOMPLETE.exit_status == 2
