"""The analysis holds facts and the reporters word them: every note has its sentence.

``nanscope.analysis`` notes what it finds as small typed facts (``analysis/_notes.py``);
``nanscope.report`` writes the sentences. These tests check that each kind of note is
worded, that the words depend on the facts a note holds, and that the dependency points
one way (report -> analysis).
"""

from __future__ import annotations

import typing

import pytest

from nanscope.analysis import Alerts, Analysis, EventView, Note
from nanscope.analysis import _notes as notes
from nanscope.format.health import Health
from nanscope.report import headline, note_texts, report_json
from nanscope.report._sentences import note_text
from nanscope.vocabulary import EventKind, LineageVerdict, OriginKind
from tests.unit.test_import_graph import PACKAGE_ROOT, import_graph

NOTE_KINDS = typing.get_args(Note)


def view(op: str = "aten.log.default", index: int = 7) -> EventView:
    return EventView(
        kind=EventKind.EXECUTION,
        index=index,
        process=0,
        rank=None,
        op_type=op,
        op_name=op,
        graph_id="",
        graph_name="",
        step=3,
        wall_time=0.0,
        phase="forward",
        module_path="",
        device="cpu",
        counts=Health(size=4, neg_inf=2, pos_inf=0, nan=0, any_nonfinite=True, dtype="float32"),
        shape=[4],
        inputs=[],
        source=None,
        stack=[],
        explanation="log of zero",
    )


# One of each kind of note, with the facts it would hold.
SAMPLES: dict[type, Note] = {
    notes.NoHealth: notes.NoHealth("NO_TENSOR"),
    notes.CurtHealth: notes.CurtHealth(),
    notes.Evicted: notes.Evicted(EventKind.EXECUTION, 1200, 800, 1),
    notes.TensorflowBufferUnknown: notes.TensorflowBufferUnknown(),
    notes.TensorflowBufferFull: notes.TensorflowBufferFull((EventKind.EXECUTION,)),
    notes.UndecodableOrigin: notes.UndecodableOrigin("bad record"),
    notes.Undecodable: notes.Undecodable(EventKind.GRAPH_EXECUTION_TRACE, 12, "bad record"),
    notes.OriginInputsUnknown: notes.OriginInputsUnknown(),
    notes.LineagesCutShort: notes.LineagesCutShort(),
    notes.BirthsDropped: notes.BirthsDropped(2),
    notes.MadeElsewhere: notes.MadeElsewhere("set_", 61, "pid 1", "pid 2"),
    notes.CauseEvicted: notes.CauseEvicted(
        {"kind": EventKind.EXECUTION, "process": 0, "steps": [5, 48], "events": 727}, view()
    ),
    notes.FirstIsNotTheCause: notes.FirstIsNotTheCause(
        view("aten.exp.default", 3), LineageVerdict.BENIGN, view(), None, 7
    ),
    notes.LineagesNotFollowed: notes.LineagesNotFollowed(),
    notes.NothingHarmful: notes.NothingHarmful(),
    notes.NoRankBorn: notes.NoRankBorn(),
    notes.CollectiveMadeIt: notes.CollectiveMadeIt("all_reduce #3 of group 0"),
    notes.BornByClock: notes.BornByClock(("rank 1", "rank 0"), aligned=True),
}


def test_every_kind_of_note_has_a_sample() -> None:
    assert set(SAMPLES) == set(NOTE_KINDS)


@pytest.mark.parametrize("kind", NOTE_KINDS, ids=lambda k: k.__name__)
def test_every_kind_of_note_is_worded_as_a_sentence(kind: type) -> None:
    text = note_text(SAMPLES[kind])
    # Words, not a fact's repr, and every placeholder filled.
    assert len(text) > 20 and kind.__name__ not in text and "{" not in text, text


def test_the_words_follow_the_facts() -> None:
    evicted = note_text(notes.Evicted(EventKind.EXECUTION, 1200, 800, 1))
    assert "dropped 1,200 executions of 2,000 (1 gap;" in evicted
    assert "(3 gaps;" in note_text(notes.Evicted(EventKind.EXECUTION, 1, 2, 3))
    assert note_text(notes.BirthsDropped(1)).startswith("1 Inf/NaN value came from")
    assert note_text(notes.BirthsDropped(2)).startswith("2 Inf/NaN values came from")
    lost = note_text(SAMPLES[notes.CauseEvicted])
    assert "the 727 executions the circular buffer dropped (steps 5–48)" in lost
    assert "(aten.log.default #7)" in lost
    whole, read = notes.NothingHarmful(), notes.NothingHarmful(incomplete=True)
    assert "nothing harmful" in note_text(whole)
    assert "no all-clear" in note_text(read) and "no all-clear" not in note_text(whole)
    undecodable = note_text(SAMPLES[notes.Undecodable])
    assert undecodable == "graph execution trace #12 could not be decoded: bad record"
    origin = view("aten.exp.default", 3)
    benign = notes.FirstIsNotTheCause(origin, LineageVerdict.BENIGN, view(), None, 7)
    assert "was benign (absorbed by a later op)" in note_text(benign)
    assert "which made the first NaN" in note_text(
        notes.FirstIsNotTheCause(origin, LineageVerdict.BENIGN, view(), 7, 7)
    )
    harmful = notes.FirstIsNotTheCause(origin, LineageVerdict.HARMFUL, view(), 9, 7)
    assert "is harmful too" in note_text(harmful)
    assert "whose values (#9) made the first NaN" in note_text(harmful)
    clock = note_text(notes.BornByClock(("rank 1", "rank 0"), aligned=False))
    assert clock.startswith("rank 1, rank 0 made Inf/NaN on their own")
    assert clock.endswith("named (rank 1; clocks not aligned).")
    assert note_text(SAMPLES[notes.BornByClock]).endswith(
        "named (rank 1, clocks aligned on the collective that followed)."
    )
    made = note_text(SAMPLES[notes.CollectiveMadeIt])
    assert "finite going into all_reduce #3 of group 0 and Inf/NaN coming out" in made


def test_a_value_that_is_no_note_is_refused() -> None:
    with pytest.raises(TypeError):
        note_text("a sentence")  # type: ignore[arg-type]


def analysis(**kw: object) -> Analysis:
    base: dict[str, object] = dict(
        logdir="/d", run_id="r", framework="torch", tensor_debug_mode="FULL_HEALTH",
        processes=[{"index": 0}], num_executions=10, num_graph_execution_traces=0,
        steps=[0, 5], alerts=Alerts(total=1, executions=1),
    )  # fmt: skip
    base.update(kw)
    return Analysis(**base)  # type: ignore[arg-type]


def test_the_headline_and_notes_are_the_reporters_words() -> None:
    cause = view()
    a = analysis(
        origin=cause,
        origin_kind=OriginKind.BORN,
        cause=cause,
        cause_kind=OriginKind.BORN,
        found_harmful=True,
        notes=[notes.CurtHealth(), notes.BirthsDropped(3)],
    )
    assert headline(a) == "aten.log.default produced -inf at step 3: log of zero"
    entered = analysis(cause=cause, cause_kind=OriginKind.ENTERED, found_harmful=True)
    assert headline(entered) == "aten.log.default passed on -inf at step 3: log of zero"
    assert note_texts(a) == [note_text(n) for n in a.notes]
    data = report_json(a)
    assert data["headline"] == headline(a) and data["notes"] == note_texts(a)
    assert headline(analysis(alerts=Alerts())) is None


def test_the_analysis_imports_no_reporter() -> None:
    graph = import_graph(PACKAGE_ROOT)
    analysis_modules = [m for m in graph if m.startswith("nanscope.analysis")]
    assert "nanscope.analysis._notes" in analysis_modules
    for m in analysis_modules:
        assert not any(d.startswith("nanscope.report") for d in graph[m]), (m, graph[m])
    assert "nanscope.analysis" in graph["nanscope.report._sentences"]
