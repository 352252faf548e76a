"""A real PyTorch training program whose disk fails part-way finishes normally.

The dump's file system is a real tmpfs: filled up, remounted read-only, or the
logdir deleted; a hung disk is a write that never returns. In every case the
program exits 0, stderr says once what went wrong and what it cost, and the
reader reports the drops where the disk let the report through.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.reader import EXECUTIONS
from tests.helpers import tmpfs

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "writer_faults.py"
STEPS, FAULT_STEP = 400, 100


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "fs", "16m") as mount:
        yield mount


def train(
    logdir: Path, fault: str, buffer: int, recover_step: int = -1, **options: object
) -> tuple[dict[str, Any], str]:
    """Run the training program; returns its JSON line and its stderr (it must exit 0)."""
    args = [str(logdir), fault, str(STEPS), str(FAULT_STEP), str(buffer)]
    if recover_step >= 0:
        args.append(str(recover_step))
    # Small bounds, so that a 100-step outage overflows them.
    options = {"hold_limit": 1000, "io_timeout": 1.0, **options}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "WRITER_OPTIONS": json.dumps(options)}  # fmt: skip
    # The timeout only catches a hang (a hung disk must not hang the program).
    out = subprocess.run(
        [sys.executable, str(PROGRAM), *args], capture_output=True, text=True, timeout=300,
        env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def told(stderr: str, reason: str) -> None:
    """The fault is said once, when it happens, and its cost once, at the end."""
    lines = [line for line in stderr.splitlines() if line.startswith("nanscope: ")]
    assert sum("cannot write the dump in" in line for line in lines) == 1, lines
    assert any(f": {reason} at " in line for line in lines), lines


@pytest.mark.parametrize("buffer", [1000, -1])
def test_a_full_disk_that_frees_up_keeps_the_origin_born_while_it_was_full(
    fs: Path, buffer: int
) -> None:
    logdir = fs / "dump"
    result, stderr = train(logdir, "full", buffer, recover_step=FAULT_STEP + 100)
    told(stderr, "disk full")
    assert result["io_errors"] >= 1
    with nanscope.open_dump(logdir) as r:
        (drops,) = r.writer_drops().values()
        assert drops.faults[0]["reason"] == "disk full" and drops.faults[0]["until"] is not None
        assert drops.dropped == result["dropped"]
        assert any("disk full at" in p.message for p in r.problems)
        rows = r.index(EXECUTIONS)
        # The NaN born three steps into the outage is in the dump, with its step.
        assert int(rows["step"][rows["nan"] > 0].min()) == FAULT_STEP + 3
        # Events after the disk freed up were written again: to the last step, unless the
        # writer, catching up with the outage on a loaded machine, shed the newest events
        # to bound its memory (which it counts as dropped).
        last = int(rows["step"].max())
        assert last > FAULT_STEP + 100
        assert last == STEPS - 1 or result["dropped"] > 0, (last, result)
    if buffer < 0:
        # Keeping everything is impossible while full: the gap is counted exactly.
        assert result["dropped"] > 0
        with nanscope.open_dump(logdir) as r:
            assert r.evicted(EXECUTIONS) == result["dropped"]


def test_a_disk_that_stays_full_is_reported_in_the_dump(fs: Path) -> None:
    logdir = fs / "dump"
    result, stderr = train(logdir, "full", -1)
    told(stderr, "disk full")
    assert f"{result['dropped']} events dropped: disk full at" in stderr
    assert result["dropped"] > 0
    # The report's blocks were reserved at start: it reached the full disk.
    with nanscope.open_dump(logdir) as r:
        (drops,) = r.writer_drops().values()
        assert drops.dropped == result["dropped"] and drops.faults[0]["until"] is None
        assert any(f"{result['dropped']} events dropped: disk full at" in p.message
                   for p in r.problems)  # fmt: skip
        steps = r.index(EXECUTIONS)["step"]
        assert len(steps) and int(steps.max()) < FAULT_STEP + 5


def test_a_deleted_logdir(tmp_path: Path) -> None:
    logdir = tmp_path / "dump"
    result, stderr = train(logdir, "deleted", -1)
    told(stderr, "dump directory deleted")
    assert result["dropped"] > 0 and f"{result['dropped']} events dropped" in stderr
    assert not logdir.exists()  # not recreated behind the user's back


def test_a_logdir_that_turns_read_only(tmp_path: Path) -> None:
    logdir = tmp_path / "dump"
    try:
        result, stderr = train(logdir, "readonly", 1000)
    finally:
        # The program mounted a read-only tmpfs over the logdir (see its docstring).
        unmounted = subprocess.run(["umount", str(logdir)], capture_output=True).returncode == 0
    assert unmounted, "the program did not make the logdir read-only"
    told(stderr, "file system read-only")
    assert result["io_errors"] >= 1
    with nanscope.open_dump(logdir) as r:
        # What was written before stays readable, and the drop report (written
        # through a descriptor opened at start) reached the file underneath.
        steps = r.index(EXECUTIONS)["step"]
        assert len(steps) and int(steps.max()) < FAULT_STEP + 5
        (drops,) = r.writer_drops().values()
        assert drops.faults[0]["reason"] == "file system read-only"


@pytest.mark.parametrize("buffer", [1000, -1])
def test_a_hung_disk_neither_stalls_nor_ends_the_program(tmp_path: Path, buffer: int) -> None:
    logdir = tmp_path / "dump"
    result, stderr = train(logdir, "hung", buffer)
    told(stderr, "disk not responding")
    assert result["executions"] > 0
    assert f"{result['dropped']} events dropped: disk not responding at" in stderr
    if buffer < 0:
        assert result["dropped"] > 0
    # Nothing was written after the write that hung: the dump ends before the fault.
    with nanscope.open_dump(logdir) as r:
        steps = r.index(EXECUTIONS)["step"]
        assert int(np.max(steps, initial=-1)) < FAULT_STEP + 5
