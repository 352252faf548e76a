"""The report of a sentinel's history: the answer first, never a false all-clear."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from nanscope.report import (
    SentinelReplay,
    SentinelRun,
    console_for,
    render_sentinel_text,
    sentinel_headline,
    sentinel_json,
)
from nanscope.report._sentinel import trend
from nanscope.sentinel import (
    Cause,
    Header,
    HistoryWriter,
    StepRecord,
    Trip,
    read_history,
)

MODULES = ("hidden (Linear)", "logits (Linear)")


def write_history(
    logdir: Path,
    steps: int,
    *,
    bad: dict[int, tuple[str, ...]] | None = None,
    trips: Sequence[Trip] = (),
    end: bool = True,
    settings: Mapping[str, object] | None = None,
    nan_params: Sequence[int] = (),
) -> Path:
    """A history of ``steps`` steps; ``bad``: the checks that saw Inf/NaN per step."""
    bad = bad or {}
    w = HistoryWriter(
        logdir,
        Header("run1", "torch 2.13.0+cpu", 1.0, MODULES, settings or {"on_nan": "stop"}),
        flush_every=3,
    )
    by_step = {t.step: t for t in trips}
    for i in range(steps):
        w.step(
            StepRecord(
                i,
                float(i),
                loss=math.nan if "loss" in bad.get(i, ()) else 2.0 / (i + 1),
                grad_norm=math.inf if "gradients" in bad.get(i, ()) else 0.5 + i,
                grad_amax=0.1,
                param_amax=math.nan if i in nan_params else 1.0 + i / 100,
                module_amax=(4.0 + i, 100.0 * (i + 1)),
                bad=bad.get(i, ()),
            )
        )
        if i in by_step:
            w.trip(by_step[i])
    if end:
        w.close()
    else:
        w.flush()
    return logdir


def report(run: SentinelRun) -> str:
    out = io.StringIO()
    console = console_for(out)
    console.width = 160  # whatever COLUMNS the test runner has: the assertions read whole rows
    render_sentinel_text(run, console)
    return out.getvalue()


def run_of(logdir: Path) -> SentinelRun:
    h = read_history(logdir)
    return SentinelRun(h, tuple(SentinelReplay(t) for t in h.trips))


def answer_line(text: str) -> str:
    """The first line that gives the answer (marked ✓, ✗ or ?)."""
    return next(ln for ln in text.splitlines() if ln[:1] in "✓✗?")


def test_a_whole_clean_history_is_an_all_clear(tmp_path: Path) -> None:
    run = run_of(write_history(tmp_path, 1204))
    assert (run.verdict, run.exit_status) == ("clean", 0)
    assert sentinel_headline(run) == "1,204 steps checked (steps 0–1,203), no Inf/NaN"
    text = report(run)
    assert answer_line(text).startswith("✓ 1,204 steps checked")
    # The last steps are shown, each with its loss.
    assert "The last 10 steps:" in text and "1,203" in text


def test_a_history_without_its_end_is_no_all_clear(tmp_path: Path) -> None:
    run = run_of(write_history(tmp_path, 20, end=False))
    assert (run.verdict, run.exit_status) == ("incomplete", 2)
    text = report(run)
    assert "✓" not in text
    assert answer_line(text).startswith("? no Inf/NaN in the 20 steps written")
    assert "no end" in text and "no all-clear" in text


def test_a_damaged_line_is_no_all_clear(tmp_path: Path) -> None:
    logdir = write_history(tmp_path, 6)
    path = logdir / "sentinel.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(3, '{"kind": "step", "step": \n')  # a record cut in half
    path.write_text("".join(lines))
    run = run_of(logdir)
    assert run.history.ended and run.exit_status == 2
    text = report(run)
    assert "line 4 cannot be read" in text and "✓" not in text
    assert sentinel_json(run)["verdict"] == "incomplete"


def test_a_history_that_checked_no_step_vouches_for_nothing(tmp_path: Path) -> None:
    run = run_of(write_history(tmp_path, 0))
    assert run.exit_status == 2
    assert "checked no steps" in sentinel_headline(run)


def test_a_replayed_trip_leads_with_the_step_and_what_was_non_finite(tmp_path: Path) -> None:
    cause = Cause("aten.log.default produced -inf at step 7: log of zero", "aten.log.default",
                  "/src/train.py", 12, 7)  # fmt: skip
    trip = Trip(7, ("gradients",), "stop", "replay-step-7", True, None, cause)
    run = run_of(write_history(tmp_path, 8, bad={7: ("gradients",)}, trips=[trip]))
    assert (run.verdict, run.exit_status) == ("tripped", 1)
    # No dump was read here (SentinelReplay without an analysis): the sentinel's own
    # account of the cause is given, with where the replay went.
    said = sentinel_headline(run)
    assert said == (
        "the sentinel tripped at step 7 (gradients non-finite); replayed into replay-step-7: "
        "aten.log.default produced -inf at step 7: log of zero (at /src/train.py:12)"
    )
    # A dump that was looked for and could not be read says so, with the sentinel's note.
    gone = SentinelRun(run.history, (SentinelReplay(trip, tmp_path, problem="not there"),))
    assert "its replay dump replay-step-7 cannot be read (not there); the sentinel noted: aten" in (
        sentinel_headline(gone)
    )
    text = report(run)
    assert answer_line(text).startswith("✗ the sentinel tripped at step 7")
    assert "The steps up to step 7:" in text
    # The lead-up ends at the bad step, marked, with the non-finite gradient norm shown.
    rows = [ln for ln in text.splitlines() if ln.strip().startswith(("6 ", "7 "))]
    assert "+inf" in rows[-1] and "✗ gradients" in rows[-1]


def test_a_trip_without_replay_says_why(tmp_path: Path) -> None:
    trip = Trip(3, ("loss",), "stop", None, None, "no step function: detection only", None)
    run = run_of(write_history(tmp_path, 4, bad={3: ("loss",)}, trips=[trip]))
    said = sentinel_headline(run)
    assert run.exit_status == 1
    assert "not replayed (no step function: detection only)" in said
    assert sentinel_json(run)["sentinel"]["trips"][0]["report"] is None


def test_a_trip_the_replay_did_not_reproduce_says_so(tmp_path: Path) -> None:
    trip = Trip(5, ("gradients",), "stop", "replay-step-5", False, None, None)
    run = run_of(write_history(tmp_path, 6, bad={5: ("gradients",)}, trips=[trip]))
    said = sentinel_headline(run)
    assert run.exit_status == 1
    assert "did not reproduce" in said and "transient hardware fault" in said


def test_several_trips_are_each_listed(tmp_path: Path) -> None:
    steps = (4, 9, 13)
    trips = [Trip(s, ("gradients",), "skip", None, None, "detection only", None) for s in steps]
    run = run_of(
        write_history(
            tmp_path,
            20,
            bad={s: ("gradients",) for s in steps},
            trips=trips,
            settings={"on_nan": "skip"},
        )
    )
    assert sentinel_headline(run).startswith("the sentinel tripped 3 times (steps 4, 9, 13)")
    text = report(run)
    for s in steps:
        assert f"✗ step {s}: gradients non-finite; the step was skipped" in text
    doc = sentinel_json(run)
    assert [t["step"] for t in doc["sentinel"]["trips"]] == list(steps)
    assert all(t["action"] == "skip" for t in doc["sentinel"]["trips"])


def test_inf_nan_without_a_trip_record_is_still_harmful(tmp_path: Path) -> None:
    # The process died during the replay: the step says "bad", no trip line followed.
    run = run_of(write_history(tmp_path, 5, bad={4: ("loss",)}, end=False))
    assert (run.verdict, run.exit_status) == ("tripped", 1)
    assert "recorded no trip" in sentinel_headline(run)
    # Non-finite parameters the history measured but did not flag are harm too.
    other = run_of(write_history(tmp_path / "p", 5, nan_params=[2]))
    assert other.exit_status == 1
    assert "parameters non-finite" in sentinel_headline(other)
    assert sentinel_json(other)["sentinel"]["unrecorded_trips"][0]["step"] == 2


def test_json_is_strict_and_keeps_non_finite_figures(tmp_path: Path) -> None:
    trip = Trip(2, ("loss",), "stop", None, None, "detection only", None)
    run = run_of(write_history(tmp_path, 3, bad={2: ("loss",)}, trips=[trip]))
    doc = json.loads(json.dumps(sentinel_json(run), allow_nan=False))
    assert doc["schema"] == "nanscope.sentinel/1"
    assert (doc["verdict"], doc["exit_status"], doc["complete"]) == ("tripped", 1, True)
    s = doc["sentinel"]
    assert (s["steps_checked"], s["first_step"], s["last_step"]) == (3, 0, 2)
    assert s["steps"][2]["loss"] == "nan" and s["steps"][2]["bad"] == ["loss"]
    assert s["modules"] == list(MODULES)
    assert s["trips"][0]["where"] == ["loss"] and s["trips"][0]["reason"] == "detection only"


def test_the_module_nearest_overflow_is_judged_against_its_dtype(tmp_path: Path) -> None:
    # logits' values are larger, but hidden's float16 is nearer its limit.
    settings = {"on_nan": "stop", "module_dtypes": ["float16", "float32"]}
    run = run_of(write_history(tmp_path, 3, settings=settings))
    text = report(run)
    assert "module nearest overflow" in text
    last = [ln for ln in text.splitlines() if ln.strip().startswith("2 ")][-1]
    assert "hidden (Linear) 6" in last and "of float16" in last


def test_trend_marks_non_finite_and_keeps_its_width() -> None:
    line = trend([1.0, 2.0, 4.0, math.nan], width=48)
    assert line == "▁▃█✗"  # 2 is a third of the way from 1 to 4
    long = trend([float(i) for i in range(1000)], width=40)
    assert len(long) == 40 and long[0] == "▁" and long[-1] == "█"
    assert trend([None, 1.0]) == " ▁"
    assert trend([]) == ""


@pytest.mark.parametrize("width", [1, 7])
def test_trend_of_few_values_at_any_width(width: int) -> None:
    assert len(trend([1.0, 2.0, 3.0], width=width)) == min(width, 3)


def test_a_program_ended_by_an_error_is_no_all_clear(tmp_path: Path) -> None:
    """A clean history closed because the program raised (not the sentinel) vouches only
    for the steps before the error: incomplete, exit 2, and the error is named."""
    w = HistoryWriter(tmp_path, Header("run1", "torch 2.13.0+cpu", 1.0, MODULES, {}))
    for i in range(5):
        w.step(StepRecord(i, float(i), loss=1.0, grad_norm=1.0))
    w.close("RuntimeError: DataLoader worker (pid 123) is killed by signal")
    history = read_history(tmp_path)
    assert history.ended and not history.problems
    assert not history.complete
    assert history.error == "RuntimeError: DataLoader worker (pid 123) is killed by signal"
    run = SentinelRun(history)
    assert run.verdict == "incomplete" and run.exit_status == 2
    headline = sentinel_headline(run)
    assert "ended by an error after step 4" in headline and "no all-clear" in headline
    assert sentinel_json(run)["error"] == history.error


def test_an_end_without_an_error_is_complete(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path, Header("run1", "torch 2.13.0+cpu", 1.0, MODULES, {}))
    w.step(StepRecord(0, 0.0, loss=1.0, grad_norm=1.0))
    w.close()
    history = read_history(tmp_path)
    assert history.complete and history.error is None
    assert SentinelRun(history).exit_status == 0
