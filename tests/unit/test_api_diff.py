"""``/api/diff``: two runs compared for the GUI, on real recordings.

A small MLP trained three steps is recorded twice with ``nanscope run --statistics``: once as
it is, once with its ``fc2`` output scaled by 1.05 on the line marked ``# <- injected``. The
route must answer what :func:`nanscope.analysis.diff` answers (computed once per pair), with
the parted op of both runs and their ops around it paired: the injected op stands alone on
run B's side, on the line the program marks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nanscope.server.query import ApiError
from nanscope.server.runs import RunSet
from tests.helpers import call

ROOT = Path(__file__).resolve().parents[2]
CLEAN, BUGGY = "clean", "buggy"

PROGRAM = '''\
"""A small MLP, three steps; --bug scales fc2's output (an injected bug)."""
import sys

import torch
import torch.nn as nn

torch.manual_seed(0)
BUG = "--bug" in sys.argv


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = self.fc2(h)
        if BUG:
            h = h * 1.05  # <- injected
        return self.head(torch.tanh(h))


net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(3):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 8, generator=g)
    y = torch.randn(4, 1, generator=g)
    loss = ((net(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def injected_line(program: Path) -> int:
    lines = program.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "# <- injected" in line)


def record_pair(root: Path) -> Path:
    """The clean and the buggy run under ``root`` (runs ``clean`` and ``buggy``); returns
    the program's path."""
    pytest.importorskip("torch")
    program = root / "mlp_pair.py"
    program.write_text(PROGRAM)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    for name, extra in ((CLEAN, []), (BUGGY, ["--bug"])):
        out = subprocess.run(
            [sys.executable, "-m", "nanscope", "run", "--statistics", "--logdir",
             str(root / "logs" / name), str(program), *extra],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    return program


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSet, Path]:
    root = tmp_path_factory.mktemp("diff_pair")
    program = record_pair(root)
    return RunSet(root / "logs"), program


def test_the_route_answers_what_the_diff_finds(pair: tuple[RunSet, Path]) -> None:
    from nanscope.analysis import diff

    runs, program = pair
    answer = call(runs, "/api/diff", run=CLEAN, against=BUGGY)
    assert answer["run"] == CLEAN and answer["against"] == BUGGY
    logs = runs.logdir
    oracle = diff(logs / CLEAN, logs / BUGGY).to_json()
    assert answer["diff"] == oracle
    d = answer["diff"]
    assert d["status"] == "parted" and d["exit_status"] == 1
    p = d["parted"]
    # The op the injection fed, in both runs; the injected op itself only in run B.
    assert p["a"]["op_type"] == p["b"]["op_type"]
    only = p["only_in_one_run"]
    assert only["run"] == "b" and only["op_type"] == "aten.mul.Tensor"
    assert only["source"]["line"] == injected_line(program)


def test_the_ops_around_the_parted_op_are_paired(pair: tuple[RunSet, Path]) -> None:
    runs, _ = pair
    answer = call(runs, "/api/diff", run=CLEAN, against=BUGGY, window=6)
    p = answer["diff"]["parted"]
    around = answer["around"]
    at = around["lines"][around["at"]]
    assert at["a"]["index"] == p["a"]["index"] and at["b"]["index"] == p["b"]["index"]
    # Paired lines name the same op and module; the injected mul is alone on B's side.
    alone = [ln for ln in around["lines"] if ln["a"] is None]
    assert [ln["b"]["index"] for ln in alone] == [p["only_in_one_run"]["index"]]
    # The clean run has no op the buggy one lacks, not even at the window's edges.
    for w in (6, 8, 20):
        lines = call(runs, "/api/diff", run=CLEAN, against=BUGGY, window=w)["around"]["lines"]
        assert all(ln["b"] is not None for ln in lines), w
    for line in around["lines"]:
        if line["a"] is not None and line["b"] is not None:
            assert line["a"]["op_type"] == line["b"]["op_type"]
            assert line["a"]["module_path"] == line["b"]["module_path"]
    # Each side in its own run's order, without gaps.
    for side in ("a", "b"):
        idx = [ln[side]["index"] for ln in around["lines"] if ln[side] is not None]
        assert idx == list(range(idx[0], idx[0] + len(idx)))
        assert len([i for i in idx if i < at[side]["index"]]) <= 6


def test_a_run_against_itself_agrees(pair: tuple[RunSet, Path]) -> None:
    runs, _ = pair
    answer = call(runs, "/api/diff", run=CLEAN, against=CLEAN)
    assert answer["diff"]["status"] == "agree" and answer["around"] is None


def test_a_pair_is_computed_once(pair: tuple[RunSet, Path], monkeypatch: Any) -> None:
    import nanscope.analysis

    runs, _ = pair
    call(runs, "/api/diff", run=BUGGY, against=CLEAN)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("diffed again")

    monkeypatch.setattr(nanscope.analysis, "diff", refuse)
    again = call(runs, "/api/diff", run=BUGGY, against=CLEAN, window=3)
    assert again["diff"]["status"] == "parted"


def test_a_copy_of_the_runs_elsewhere_is_diffed_anew(
    pair: tuple[RunSet, Path], tmp_path: Path
) -> None:
    runs, _ = pair
    first = call(runs, "/api/diff", run=CLEAN, against=BUGGY)
    shutil.copytree(runs.logdir, tmp_path / "logs")
    copy = call(RunSet(tmp_path / "logs"), "/api/diff", run=CLEAN, against=BUGGY)
    assert copy["diff"]["a"]["label"] == str((tmp_path / "logs" / CLEAN).resolve())
    assert first["diff"]["a"]["label"] == str(runs.logdir / CLEAN)


def test_the_documented_answer_names_what_the_route_returns(pair: tuple[RunSet, Path]) -> None:
    from tests.unit.test_api_sentinel import _documented, _keys

    runs, _ = pair
    answer = call(runs, "/api/diff", run=CLEAN, against=BUGGY)
    assert set(_documented("/api/diff")) <= _keys(answer)


def refused(runs: RunSet, **params: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(runs, "/api/diff", **params)
    return info.value


def test_bad_requests(pair: tuple[RunSet, Path]) -> None:
    runs, _ = pair
    assert refused(runs, run=CLEAN).status == 400  # no against
    assert refused(runs, run=CLEAN, against="nope").status == 404
    assert refused(runs, run=CLEAN, against=BUGGY, rtol="x").status == 400
    assert refused(runs, run=CLEAN, against=BUGGY, rtol="-1").status == 400
    assert refused(runs, run=CLEAN, against=BUGGY, window=500).status == 400
    e = refused(runs, run=CLEAN, against=BUGGY, rank=3)
    assert e.status == 400 and "rank 3" in e.message
