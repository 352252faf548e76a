"""A real PyTorch training run that ends badly: what the dump still holds, and the report on it.

The program (``tests/programs/crash_training.py``) trains a small MLP under
``nanscope.enable_dump_debug_info`` with a 0.2 s flush interval; its loss takes
``log`` of a probability that is exactly zero at step 3 (the origin), and it
keeps training on NaN. Each test ends it differently, after the origin was
flushed: SIGKILL, SIGTERM, an exception, running out of memory (under a
bounded address space), ``os._exit``. The promise (docs/RELIABILITY.md): the
dump opens without errors, ``nanscope report`` finds the origin on its line,
and at most the last flush interval of events is lost.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nanscope
from nanscope.reader import EXECUTIONS
from tests.helpers import marked_line

pytest.importorskip("torch")

PROGRAM = Path(__file__).parents[1] / "programs" / "crash_training.py"
FLUSH_INTERVAL = 0.2


def start(tmp_path: Path, how: str) -> tuple[subprocess.Popen[str], Path]:
    logdir = tmp_path / "dump"
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), str(logdir), how, str(FLUSH_INTERVAL)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, logdir


def steps_printed(proc: subprocess.Popen[str], until: int) -> list[int]:
    """Read the program's "step N" lines until step ``until``; returns the steps seen."""
    assert proc.stdout is not None
    seen = []
    while True:
        line = proc.stdout.readline()
        assert line, f"the program ended early: {proc.stderr.read() if proc.stderr else ''}"
        if line.startswith("step "):
            seen.append(int(line.split()[1]))
            if seen[-1] >= until:
                return seen


def check(logdir: Path, last_step_before_fault: int) -> None:
    with nanscope.open_dump(logdir) as r:
        assert not [p for p in r.problems if p.severity == "error"], r.problems
        ref = r.first_nonfinite(EXECUTIONS)
        assert ref is not None
        origin = r.execution(ref.index)
        assert origin.op_type == "aten.log.default" and origin.step == 3
        recorded = int(r.index(EXECUTIONS)["step"].max())
        # The tail bound: steps finished more than a flush interval before the fault are on disk.
        assert recorded >= last_step_before_fault - 1, (recorded, last_step_before_fault)
    report = subprocess.run(
        [sys.executable, "-m", "nanscope", "report", str(logdir), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 1, report.stderr
    data = json.loads(report.stdout)
    assert data["origin"]["op_type"] == "aten.log.default"
    assert data["origin"]["source"]["line"] == marked_line(str(PROGRAM), "# <- origin")


def fault_after_flush(proc: subprocess.Popen[str], sig: int) -> int:
    """Wait for steps past the origin, a few flush intervals, then send ``sig``."""
    seen = steps_printed(proc, 6)
    time.sleep(3 * FLUSH_INTERVAL)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return seen[-1]


def test_sigkill_mid_run(tmp_path: Path) -> None:
    proc, logdir = start(tmp_path, "loop")
    last = fault_after_flush(proc, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    check(logdir, last)


def test_sigterm_mid_run(tmp_path: Path) -> None:
    proc, logdir = start(tmp_path, "loop")
    last = fault_after_flush(proc, signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM  # flushed, then still died of SIGTERM
    check(logdir, last)


@pytest.mark.parametrize(("how", "code"), [("raise", 1), ("os_exit", 7), ("oom", 1)])
def test_program_ends_itself_badly(tmp_path: Path, how: str, code: int) -> None:
    proc, logdir = start(tmp_path, how)
    seen = steps_printed(proc, 8)
    proc.wait(timeout=120)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.returncode == code, err
    if how == "oom":
        assert "MemoryError" in err or "can't allocate memory" in err or "not enough memory" in err
    check(logdir, seen[-1])
