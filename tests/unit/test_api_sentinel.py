"""``/api/sentinels`` and ``/api/sentinel``: a sentinel's history for the GUI.

The logdirs are written here with the sentinel's own :class:`HistoryWriter`, and the trip's
replay is a real dump: ``nanscope run`` of ``tests/cases/torch_log_zero.py`` written to
``replay-step-<N>/``. What the route answers is checked against what was written (and against
:func:`read_history`, the history's own reader, where the route reads incrementally), and the
replay's cause against the replay run's own ``/api/analysis``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope.sentinel import Cause, Header, HistoryWriter, StepRecord, Trip, read_history
from nanscope.server.api import ROUTES
from nanscope.server.query import ApiError
from nanscope.server.runs import RunSet
from tests.helpers import call

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "tests" / "cases" / "torch_log_zero.py"
DOC = ROOT / "src" / "nanscope" / "server" / "http_api.md"
MODULES = ("encoder (Linear)", "head (Linear)", "norm (LayerNorm)")
TRIP = 412


def record_replay(logdir: Path) -> None:
    """A real dump of a log of zero (``nanscope run``), as the sentinel's replay writes one."""
    pytest.importorskip("torch")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "--logdir", str(logdir), str(CASE)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]


def figures(step: int, trip: int | None) -> StepRecord:
    """A step of a run whose gradients grow until ``trip``, where the loss is NaN."""
    grow = math.exp(step / 40.0)
    bad = step == trip
    return StepRecord(
        step=step,
        time=1.7e9 + step,
        loss=math.nan if bad else 2.0 / (1 + step / 50) + 0.01 * math.sin(step),
        grad_norm=math.inf if bad else 0.5 * grow,
        grad_amax=math.inf if bad else 0.1 * grow,
        param_amax=3.0 + step / 1000,
        state_amax=None,  # not measured
        # Not measured every step: a sentinel measures the modules every few steps.
        module_amax=()
        if step % 50 == 25
        else (4.0 + math.sin(step), 10.0 * grow if not bad else math.inf, 1.5),
        bad=("loss", "gradients") if bad else (),
        param_norm=12.0 + step / 100,
    )


def write_history(
    logdir: Path,
    steps: int,
    trip: int | None = TRIP,
    *,
    reproduced: bool | None = True,
    cause: Cause | None = None,
    close: bool = True,
    replay: str | None = None,
) -> HistoryWriter:
    """``steps`` steps (0, 1, ...) and, at ``trip``, the trip and its replay's directory."""
    w = HistoryWriter(logdir, Header("run-1", "torch 2.13.0+cpu", 1.7e9, MODULES, {"every": 1}))
    for s in range(steps):
        w.step(figures(s, trip))
        if s == trip:
            where = ("loss", "gradients")
            if replay is None:
                replay = f"replay-step-{trip}"
            w.trip(Trip(s, where, "stop", replay, reproduced, None, cause))
            break
    if close:
        w.close()
    else:
        w.flush()
    return w


def sentinel_logdir(root: Path, steps: int = 500, **kwargs: Any) -> Path:
    """A sentinel logdir whose trip at step 412 was replayed: the history and the replay's dump,
    with the replay's cause as its report names it."""
    record_replay(root / f"replay-step-{TRIP}")
    an = call(RunSet(root / f"replay-step-{TRIP}"), "/api/analysis")
    c = an["cause"]
    cause = Cause(an["headline"], c["op_type"], c["source"]["file"], c["source"]["line"], 0)
    write_history(root, steps, cause=cause, **kwargs)
    return root


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sentinel_logdir(tmp_path_factory.mktemp("sentinel"))


def test_the_replay_is_a_run_and_the_history_names_it(logdir: Path) -> None:
    runs = RunSet(logdir)
    assert runs.names() == [f"replay-step-{TRIP}"]
    listed = call(runs, "/api/sentinels")
    assert listed["sentinels"] == [
        {"history": ".", "path": str(logdir.resolve()), "runs": [f"replay-step-{TRIP}"]}
    ]
    # Asked for by the replay's run, by name, or as the only one: the same history.
    by_run = call(runs, "/api/sentinel", run=f"replay-step-{TRIP}")
    assert by_run == call(runs, "/api/sentinel", history=".") == call(runs, "/api/sentinel")
    h = by_run
    assert h["history"] == "." and h["error"] is None
    assert h["complete"] and h["ended"] and h["problems"] == []
    assert h["num_steps"] == TRIP + 1 and h["first_step"] == 0 and h["last_step"] == TRIP
    assert h["modules"] == list(MODULES) and h["framework"].startswith("torch")
    (trip,) = h["trips"]
    assert trip["step"] == TRIP and trip["where"] == ["loss", "gradients"]
    assert trip["run"] == f"replay-step-{TRIP}" and trip["reproduced"] is True
    # The cause is the replay run's own: its analysis names the same headline and op.
    replay = call(runs, "/api/analysis", run=trip["run"])
    assert trip["cause"]["headline"] == replay["headline"]
    assert trip["cause"]["op_type"] == replay["cause"]["op_type"] == "aten.log.default"


def test_a_short_history_is_sent_exact(logdir: Path) -> None:
    h = call(RunSet(logdir), "/api/sentinel", points=1000)
    b = h["buckets"]
    assert b["first_step"] == b["last_step"] == list(range(TRIP + 1))
    oracle = read_history(logdir).steps
    for s in oracle[:TRIP]:
        assert b["loss"]["min"][s.step] == b["loss"]["max"][s.step] == s.loss
        assert b["grad_norm"]["max"][s.step] == s.grad_norm
        amax = max((x for x in s.module_amax if x is not None), default=None)
        assert b["amax"]["max"][s.step] == amax
        assert b["param_norm"]["max"][s.step] == s.param_norm
    assert b["amax"]["max"][25] is None and b["amax"]["nonfinite"][25] == 0
    # The bad step: no finite value, one not finite, flagged bad; state_amax never measured.
    assert b["loss"]["min"][TRIP] is None and b["loss"]["nonfinite"][TRIP] == 1
    assert b["grad_norm"]["nonfinite"][TRIP] == 1 and b["bad"][TRIP] == 1
    assert sum(b["bad"]) == 1
    assert set(b["state_amax"]["max"]) == {None} and sum(b["state_amax"]["nonfinite"]) == 0


def test_the_lead_up_to_a_trip_is_exact(logdir: Path) -> None:
    h = call(RunSet(logdir), "/api/sentinel", lead=30)
    lead = h["trips"][0]["lead_up"]
    assert lead["steps"] == list(range(TRIP - 29, TRIP + 1))
    oracle = {s.step: s for s in read_history(logdir).steps}
    for i, step in enumerate(lead["steps"][:-1]):
        assert lead["loss"][i] == oracle[step].loss
        assert lead["grad_norm"][i] == oracle[step].grad_norm
        assert lead["amax_module"][i] == (None if step % 50 == 25 else "head (Linear)")
        assert lead["state_amax"][i] is None
    assert lead["loss"][-1] == "nan" and lead["grad_norm"][-1] == "inf"
    assert lead["bad"][-1] == ["loss", "gradients"] and lead["bad"][0] == []
    # The module that overflowed first, each with its values at those steps.
    mods = lead["modules"]
    assert mods[0]["module"] == "head (Linear)" and mods[0]["nonfinite"]
    assert {m["module"] for m in mods} == set(MODULES)
    enc = next(m for m in mods if m["module"] == "encoder (Linear)")
    assert enc["values"] == [(oracle[s].module_amax or [None])[0] for s in lead["steps"]]


def test_a_long_history_is_folded_into_buckets(tmp_path: Path) -> None:
    steps, trip = 20_000, 19_990
    write_history(tmp_path, steps, trip, reproduced=None, replay="replay-step-19990")
    h = call(RunSet(tmp_path), "/api/sentinel", points=100, lead=50)
    b = h["buckets"]
    assert len(b["first_step"]) == 100 and h["bucket_size"] == (trip + 1) / 100
    assert len(json.dumps(h)) < 60_000  # never the whole history
    oracle = read_history(tmp_path).steps
    loss = np.array([s.loss for s in oracle])
    for i, (lo, hi) in enumerate(zip(b["first_step"], b["last_step"], strict=True)):
        chunk = loss[lo : hi + 1]
        finite = chunk[np.isfinite(chunk)]
        assert b["loss"]["min"][i] == finite.min() and b["loss"]["max"][i] == finite.max()
        assert b["loss"]["nonfinite"][i] == int((~np.isfinite(chunk)).sum())
    assert b["first_step"][0] == 0 and b["last_step"][-1] == trip
    assert b["bad"][-1] == 1 and sum(b["bad"]) == 1
    # Its replay's dump is not there: no run to open, and the route says so by null.
    (t,) = h["trips"]
    assert t["run"] is None and t["replay"] == "replay-step-19990" and t["reproduced"] is None
    assert t["lead_up"]["steps"] == list(range(trip - 49, trip + 1))
    # A window of steps, in buckets again.
    w = call(RunSet(tmp_path), "/api/sentinel", from_step=1000, to_step=1099, points=10)
    assert w["window"] == {"from_step": 1000, "to_step": 1099, "begin": 1000, "end": 1100}
    assert w["buckets"]["first_step"] == list(range(1000, 1100, 10))
    assert w["buckets"]["loss"]["max"][0] == max(loss[1000:1010])


def test_a_history_without_an_end_or_damaged_is_no_clean_run(tmp_path: Path) -> None:
    w = write_history(tmp_path, 50, trip=None, close=False)
    h = call(RunSet(tmp_path), "/api/sentinel")
    assert not h["complete"] and not h["ended"] and h["trips"] == []
    assert any("has no end" in p for p in h["problems"])
    # The history grows: read on from where it was (the same figures as a full read).
    for s in range(50, 80):
        w.step(figures(s, None))
    w.close()
    h = call(RunSet(tmp_path), "/api/sentinel")
    assert h["complete"] and h["num_steps"] == 80 and h["last_step"] == 79
    assert h["buckets"]["loss"]["max"] == [s.loss for s in read_history(tmp_path).steps]
    # A line that cannot be read, and a last line cut short by a kill.
    path = tmp_path / "sentinel.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[10] = '{"kind": "step", "step": 9, "loss": [1]}\n'
    path.write_text("".join(lines[:-1]) + '{"kind": "step", "st')
    h = call(RunSet(tmp_path), "/api/sentinel")
    assert not h["complete"] and not h["ended"]
    assert any("line 11 cannot be read" in p for p in h["problems"])
    assert any("cut short" in p for p in h["problems"])
    assert any("has no end" in p for p in h["problems"])
    assert h["num_steps"] == 79
    assert h["problems"] == list(read_history(tmp_path).problems)


def test_a_replay_that_did_not_reproduce(tmp_path: Path) -> None:
    write_history(tmp_path, 300, 250, reproduced=False)
    (trip,) = call(RunSet(tmp_path), "/api/sentinel")["trips"]
    assert trip["reproduced"] is False and trip["cause"] is None and trip["run"] is None


def test_a_damaged_header_is_an_error_in_the_answer(tmp_path: Path) -> None:
    (tmp_path / "sentinel.jsonl").write_text('{"kind": "step", "step": 0}\n')
    h = call(RunSet(tmp_path), "/api/sentinel")
    assert "line 1 is not a sentinel header" in h["error"]
    assert not h["complete"] and h["num_steps"] == 0 and h["trips"] == []


def refused(runs: RunSet, **params: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(runs, "/api/sentinel", **params)
    return info.value


def test_what_is_not_there_and_what_is_malformed(tmp_path: Path, logdir: Path) -> None:
    empty = RunSet(tmp_path)
    assert call(empty, "/api/sentinels")["sentinels"] == []
    e = refused(empty)
    assert e.status == 404 and "no sentinel history" in e.message
    write_history(tmp_path / "a", 5, None)
    write_history(tmp_path / "b", 5, None)
    runs = RunSet(tmp_path)
    assert [s["history"] for s in call(runs, "/api/sentinels")["sentinels"]] == ["a", "b"]
    e = refused(runs)
    assert e.status == 400 and "name one with history=" in e.message
    assert call(runs, "/api/sentinel", history="b")["num_steps"] == 5
    assert refused(runs, history="c").status == 404
    assert refused(RunSet(logdir), run="nope").status == 404
    assert refused(RunSet(logdir), from_step=5, to_step=4).status == 400
    assert refused(RunSet(logdir), points=0).status == 400
    assert refused(RunSet(logdir), lead=5000).status == 400


def test_a_run_outside_any_sentinel_logdir_is_404(tmp_path: Path) -> None:
    from tests.helpers import write_small_dump

    write_small_dump(tmp_path / "plain")
    e = refused(RunSet(tmp_path), run="plain")
    assert e.status == 404 and "not in a sentinel's logdir" in e.message


def _documented(route: str) -> Sequence[str]:
    text = DOC.read_text()
    m = re.search(rf"^### `GET {re.escape(route)}[?`].*?```json\n(.*?)```", text, re.M | re.S)
    assert m, route
    return re.findall(r'"(\w+)":', m.group(1))


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value[:3]))
    return set()


def test_the_documented_answers_name_what_the_routes_return(logdir: Path) -> None:
    assert {"/api/sentinel", "/api/sentinels"} <= set(ROUTES)
    runs = RunSet(logdir)
    for route in ("/api/sentinel", "/api/sentinels"):
        assert set(_documented(route)) <= _keys(call(runs, route)), route
