"""The sentinel's history file (``sentinel.jsonl``): written, read back, and read when damaged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nanscope.sentinel import (
    HISTORY_FILE,
    Cause,
    Header,
    HistoryWriter,
    SentinelHistoryError,
    StepRecord,
    Trip,
    is_sentinel_logdir,
    read_history,
)
from nanscope.sentinel._history import steps_before


def _write(logdir: Path, steps: int = 3, *, close: bool = True, flush_every: int = 50) -> None:
    writer = HistoryWriter(
        logdir,
        Header(
            run_id="r1",
            framework="torch",
            started=1.0,
            modules=("fc1", "fc2"),
            settings={"on_nan": "stop"},
        ),
        flush_every=flush_every,
    )
    for i in range(steps):
        writer.step(
            StepRecord(
                step=i,
                time=10.0 + i,
                loss=1.0 / (i + 1),
                grad_norm=0.5,
                module_amax=(1.0, None),
                param_norm=3.0,
            )
        )
    writer.step(
        StepRecord(
            step=steps,
            time=20.0,
            loss=math.nan,
            grad_norm=math.inf,
            grad_amax=-math.inf,
            bad=("loss", "gradients"),
        )
    )
    writer.trip(
        Trip(
            step=steps,
            where=("loss", "gradients"),
            action="stop",
            replay=f"replay-step-{steps}",
            reproduced=True,
            cause=Cause(
                headline="log of zero", op_type="aten.log.default", file="t.py", line=7, step=steps
            ),
        )
    )
    if close:
        writer.close()
        writer.close()  # a second close does nothing


def test_round_trip(tmp_path: Path) -> None:
    _write(tmp_path)
    assert is_sentinel_logdir(tmp_path) and not is_sentinel_logdir(tmp_path / "nowhere")
    history = read_history(tmp_path)
    assert history.complete and history.ended and history.problems == ()
    assert history.header.run_id == "r1" and history.header.modules == ("fc1", "fc2")
    assert history.header.settings == {"on_nan": "stop"}
    assert [s.step for s in history.steps] == [0, 1, 2, 3]
    first, last = history.steps[0], history.steps[-1]
    assert first.loss == 1.0 and first.module_amax == (1.0, None) and first.param_norm == 3.0
    assert first.grad_amax is None and first.bad == ()
    assert math.isnan(last.loss or 0.0) and last.grad_norm == math.inf
    assert last.grad_amax == -math.inf and last.bad == ("loss", "gradients")
    (trip,) = history.trips
    assert trip.cause is not None and trip.cause.line == 7 and trip.reproduced is True
    assert history.replay_dir(trip) == tmp_path / "replay-step-3"
    assert history.last_step == 3
    assert [s.step for s in steps_before(history, 2, 2)] == [1, 2]


def test_step_lines_are_what_json_dumps_writes(tmp_path: Path) -> None:
    figures = (None, 0.0, -0.0, 1.0, 1e-300, 1e300, 2**60, True, math.nan, math.inf, -math.inf)
    writer = HistoryWriter(tmp_path, Header(run_id="r", framework="torch", started=0.0))
    records = [
        StepRecord(
            step=i,
            time=1.5e9 + i / 7,
            loss=figures[i % len(figures)],
            grad_norm=figures[(i + 1) % len(figures)],
            grad_amax=figures[(i + 2) % len(figures)],
            param_amax=figures[(i + 3) % len(figures)],
            state_amax=figures[(i + 5) % len(figures)],
            module_amax=tuple(figures[(i + j) % len(figures)] for j in range(i % 3)),
            bad=("loss", "gradients")[: i % 3],
            param_norm=figures[(i + 7) % len(figures)],
        )
        for i in range(3 * len(figures))
    ]
    for record in records:
        writer.step(record)
    writer.close()

    def expected(r: StepRecord) -> str:  # the record as a dict, through json.dumps
        def number(x: float | None) -> float | str | None:
            if x is None or math.isfinite(x):
                return None if x is None else float(x)
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")

        fields = ("loss", "grad_norm", "grad_amax", "param_amax", "state_amax")
        return json.dumps(
            {"kind": "step", "step": r.step, "time": r.time}
            | {f: number(getattr(r, f)) for f in fields}
            | {"module_amax": [number(x) for x in r.module_amax], "bad": list(r.bad)}
            | {"param_norm": number(r.param_norm)},
            allow_nan=False,
        )

    lines = (tmp_path / HISTORY_FILE).read_text().splitlines()
    assert lines[1:-1] == [expected(r) for r in records]
    assert read_history(tmp_path).complete


def test_non_finite_figures_are_valid_json(tmp_path: Path) -> None:
    _write(tmp_path)

    def refuse(constant: str) -> None:
        pytest.fail(f"a bare {constant} in the history")

    for line in (tmp_path / HISTORY_FILE).read_text().splitlines():
        json.loads(line, parse_constant=refuse)


def test_no_end_record_is_incomplete(tmp_path: Path) -> None:
    _write(tmp_path, close=False, flush_every=1)
    history = read_history(tmp_path)
    assert not history.ended and not history.complete
    assert len(history.steps) == 4 and len(history.trips) == 1  # what was flushed is kept
    assert any("no end" in p for p in history.problems)


def test_a_cut_last_line_is_a_problem_and_the_rest_is_kept(tmp_path: Path) -> None:
    _write(tmp_path)
    path = tmp_path / HISTORY_FILE
    text = path.read_text()
    path.write_text(text[: len(text) - 15])  # the end record cut short
    history = read_history(tmp_path)
    assert not history.complete and len(history.steps) == 4 and len(history.trips) == 1
    assert any("cut short" in p for p in history.problems)


def test_a_bad_header_is_an_error(tmp_path: Path) -> None:
    (tmp_path / HISTORY_FILE).write_text('{"kind": "step", "step": 0}\n')
    with pytest.raises(SentinelHistoryError, match="not a sentinel header"):
        read_history(tmp_path)
    (tmp_path / HISTORY_FILE).write_text("")
    with pytest.raises(SentinelHistoryError, match="empty"):
        read_history(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_history(tmp_path / "nowhere")


def test_a_damaged_middle_line_is_named(tmp_path: Path) -> None:
    _write(tmp_path)
    path = tmp_path / HISTORY_FILE
    lines = path.read_text().splitlines()
    lines[2] = '{"kind": "step", "step": "x"}'
    path.write_text("\n".join(lines) + "\n")
    history = read_history(tmp_path)
    assert any("line 3" in p for p in history.problems) and history.ended
    assert len(history.steps) == 3


def test_error_words_name_what_ended_the_program() -> None:
    from nanscope.sentinel import SentinelTripped
    from nanscope.sentinel._errors import error_words
    from nanscope.sentinel._history import Trip as _Trip

    assert error_words(None) is None
    assert error_words(SystemExit(0)) is None
    assert error_words(SentinelTripped(_Trip(3, ("loss",), "stop"), "/tmp/x")) is None
    assert error_words(SystemExit(3)) == "SystemExit: 3"
    assert error_words(ValueError("bad batch")) == "ValueError: bad batch"
