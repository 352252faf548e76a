"""``nanscope report`` on a sentinel's logdir, and ``nanscope run --sentinel``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from nanscope.sentinel import Header, HistoryWriter, StepRecord, Trip

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "tests" / "cases" / "torch_log_zero.py"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # A wide terminal whatever the runner's COLUMNS: the assertions read whole lines.
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "nanscope", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def marked_line(path: Path, mark: str) -> int:
    """The line of ``path`` whose comment holds ``mark``: where the case says it is born."""
    lines = path.read_text().splitlines()
    return next(i for i, text in enumerate(lines, start=1) if mark in text)


@pytest.fixture(scope="module")
def replay_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dump of a program whose log takes a zero (what a replay leaves)."""
    root = tmp_path_factory.mktemp("replay")
    shutil.copy(CASE, root / CASE.name)
    out = cli("run", "--logdir", "dump", CASE.name, cwd=root)
    assert out.returncode == 0, out.stderr
    return root / "dump"


def sentinel_logdir(root: Path, replay_dump: Path, bad: int = 41) -> Path:
    """A history of ``bad + 1`` steps, the last one tripped and replayed into ``replay_dump``."""
    logdir = root / "run"
    w = HistoryWriter(
        logdir,
        Header("r1", "torch 2.13.0+cpu", time.time(), ("fc (Linear)",), {"on_nan": "stop"}),
    )
    for i in range(bad + 1):
        w.step(
            StepRecord(
                i, time.time(), loss=float("nan") if i == bad else 1.0 / (i + 1),
                grad_norm=1.0, grad_amax=0.5, param_amax=2.0, module_amax=(3.0,),
                bad=("loss",) if i == bad else (),
            )
        )  # fmt: skip
    w.trip(Trip(bad, ("loss",), "stop", f"replay-step-{bad}", True, None, None))
    shutil.copytree(replay_dump, logdir / f"replay-step-{bad}")
    w.close()
    return logdir


def test_report_of_a_tripped_run_names_the_replays_cause(tmp_path: Path, replay_dump: Path) -> None:
    logdir = sentinel_logdir(tmp_path, replay_dump)
    text = cli("report", str(logdir), cwd=tmp_path)
    assert text.returncode == 1, text.stderr
    lines = text.stdout.splitlines()
    answer = next(ln for ln in lines if ln[:1] in "✓✗?")
    assert answer.startswith("✗ the sentinel tripped at step 41 (loss non-finite); replayed:")
    # The case's own mark of the birth: the op and the line, the oracle of the cause.
    line = marked_line(CASE, "<- origin")
    flat = " ".join(text.stdout.split())  # the answer as one line, however it was wrapped
    said = flat[flat.index("✗ the sentinel") :]
    assert said.startswith(
        "✗ the sentinel tripped at step 41 (loss non-finite); replayed: aten.log.default "
        "produced -inf at step 0: log of zero"
    )
    assert f"{CASE.name}:{line})" in said.split(" ✗ step 41")[0]
    # The lead-up, then the replayed step's report in full, as its own command prints it.
    assert "The steps up to step 41:" in text.stdout
    own = cli("report", str(logdir / "replay-step-41"), cwd=tmp_path)
    assert own.returncode == 1
    tail = own.stdout.splitlines()[1:]  # its first line names the logdir it was given
    assert "\n".join(tail) in text.stdout

    doc = json.loads(cli("report", str(logdir), "--json", cwd=tmp_path).stdout)
    assert (doc["schema"], doc["verdict"], doc["exit_status"]) == (
        "nanscope.sentinel/1",
        "tripped",
        1,
    )
    trip = doc["sentinel"]["trips"][0]
    cause = trip["report"]["cause"]
    assert cause["op_type"] == "aten.log.default" and cause["source"]["line"] == line
    assert len(doc["sentinel"]["steps"]) == 42 and doc["sentinel"]["steps"][-1]["loss"] == "nan"
    alone = json.loads(cli("report", str(logdir / "replay-step-41"), "--json", cwd=tmp_path).stdout)
    assert trip["report"] == alone


def test_a_missing_replay_dump_is_told_not_hidden(tmp_path: Path, replay_dump: Path) -> None:
    logdir = sentinel_logdir(tmp_path, replay_dump, bad=5)
    shutil.rmtree(logdir / "replay-step-5")
    out = cli("report", str(logdir), cwd=tmp_path)
    assert out.returncode == 1
    flat = " ".join(out.stdout.split())
    assert "its replay dump replay-step-5 cannot be read" in flat
    assert "(replay-step-5 is not there)" in flat


def test_a_clean_whole_history_exits_0_and_a_cut_one_2(tmp_path: Path) -> None:
    logdir = tmp_path / "clean"
    w = HistoryWriter(logdir, Header("r2", "torch", time.time()))
    for i in range(12):
        w.step(StepRecord(i, time.time(), loss=1.0, grad_norm=1.0))
    w.close()
    out = cli("report", str(logdir), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "✓ 12 steps checked (steps 0–11), no Inf/NaN" in out.stdout
    # Killed before its end was written: the same steps are no all-clear.
    path = logdir / "sentinel.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    cut = cli("report", str(logdir), cwd=tmp_path)
    assert cut.returncode == 2 and "✓" not in cut.stdout
    assert (
        json.loads(cli("report", str(logdir), "--json", cwd=tmp_path).stdout)["verdict"]
        == "incomplete"
    )


def test_bad_input_is_one_line(tmp_path: Path, replay_dump: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sentinel.jsonl").write_text("not json\n")
    out = cli("report", str(broken), cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "not a sentinel header" in out.stderr
    both = cli("report", str(broken), str(replay_dump), cwd=tmp_path)
    assert both.returncode == 2 and "report it alone" in both.stderr
    assert len(both.stderr.strip().splitlines()) == 1


def test_run_sentinel_options_are_checked_before_the_program_runs(tmp_path: Path) -> None:
    script = tmp_path / "p.py"
    script.write_text("print('ran')\n")
    out = cli("run", "--sentinel", "--check-numerics", "p.py", cwd=tmp_path)
    assert out.returncode == 2 and "choose one" in out.stderr and "ran" not in out.stdout
    out = cli("run", "--on-nan", "skip", "p.py", cwd=tmp_path)
    assert out.returncode == 2 and "go with --sentinel" in out.stderr
    held = tmp_path / "held"
    held.mkdir()
    (held / "sentinel.jsonl").write_text("{}\n")
    out = cli("run", "--sentinel", "--logdir", "held", "p.py", cwd=tmp_path)
    assert out.returncode == 2 and "--force" in out.stderr and "ran" not in out.stdout


# A hand-written loop whose step runs through nanscope.sentinel.step; at step BAD one batch
# is scaled so large that a softmax probability is exactly 0 and the log of it -inf.
LOOP = """
import sys
import torch
import nanscope.sentinel

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
BAD = int(sys.argv[1])


def train_step(x, y):
    opt.zero_grad()
    probs = torch.softmax(model(x), dim=1)
    loss = -(y * torch.log(probs)).sum(1).mean()  # <- cause
    loss.backward()
    opt.step()
    return loss


for step in range(60):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g) * (1e4 if step == BAD else 1.0)
    y = torch.nn.functional.one_hot(torch.randint(0, 4, (16,), generator=g), 4).float()
    nanscope.sentinel.step(train_step, x, y)
print("done")
"""


def test_run_sentinel_clean_loop(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(textwrap.dedent(LOOP))
    out = cli("run", "--sentinel", "--logdir", "s", "loop.py", "-1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "done" in out.stdout
    assert "sentinel: ✓ 60 steps checked" in out.stderr
    assert "nanscope report s" in out.stderr
    assert cli("report", "s", cwd=tmp_path).returncode == 0
    # No per-op recording: the logdir holds the history and nothing else.
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["sentinel.jsonl"]


def test_run_sentinel_replays_the_bad_step_as_a_full_recording_sees_it(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(LOOP))
    out = cli("run", "--sentinel", "--logdir", "s", "loop.py", "37", cwd=tmp_path)
    assert out.returncode != 0  # stopped at the trip, as the program's own error
    assert "done" not in out.stdout
    assert "sentinel: ✗ the sentinel tripped at step 37" in out.stderr
    doc = json.loads(cli("report", "s", "--json", cwd=tmp_path).stdout)
    assert doc["exit_status"] == 1
    trip = doc["sentinel"]["trips"][0]
    assert trip["step"] == 37 and trip["reproduced"] is True
    replayed = trip["report"]["cause"]
    # The oracle: a full recording of the same run.
    full = cli("run", "--logdir", "full", "loop.py", "37", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    recorded = json.loads(cli("report", "full", "--json", cwd=tmp_path).stdout)["cause"]
    assert replayed["op_type"] == recorded["op_type"] == "aten.log.default"
    assert (
        replayed["source"]["line"] == recorded["source"]["line"] == marked_line(script, "<- cause")
    )
    assert replayed["explanation"] == recorded["explanation"]


def test_run_sentinel_skip_goes_on_and_the_report_still_says_it_tripped(tmp_path: Path) -> None:
    (tmp_path / "loop.py").write_text(textwrap.dedent(LOOP))
    out = cli(
        "run", "--sentinel", "--on-nan", "skip", "--snapshot-state", "--logdir", "s", "loop.py",
        "37", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr  # the program's own status: it went on to the end
    assert "done" in out.stdout
    report = cli("report", "s", "--json", cwd=tmp_path)
    assert report.returncode == 1
    doc = json.loads(report.stdout)
    s = doc["sentinel"]
    assert s["settings"]["on_nan"] == "skip" and s["settings"]["snapshot_state"] is True
    assert [(t["step"], t["action"]) for t in s["trips"]] == [(37, "skip")]
    assert s["steps_checked"] == 60 and s["ended"] is True
