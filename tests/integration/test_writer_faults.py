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
import textwrap
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


# FULL_TENSOR: each event holds whole tensors (a 512-wide MLP: values of 128 KiB to 1 MiB),
# about 2.7 MiB a step. The disk fills up for good at step 20; a NaN is born at step 23.
FULL_TENSOR_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch
    import nanscope

    logdir, steps, fault_step = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

    def status(field):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 512)
    y = torch.nn.functional.one_hot(torch.arange(64) % 8, 8).float()
    session = nanscope.enable_dump_debug_info(
        logdir, tensor_debug_mode="FULL_TENSOR", circular_buffer_size=-1, flush_interval=0.2,
        **json.loads(os.environ["WRITER_OPTIONS"]),
    )
    rss_at_fault = 0
    for step in range(steps):
        if step == fault_step:
            session.flush()
            rss_at_fault = status("VmRSS")
            with open(logdir.parent / "filler", "wb") as fh:
                try:
                    while True:
                        fh.write(b"\\0" * (1 << 20))
                        fh.flush()
                except OSError:
                    pass  # ENOSPC: full
        probs = torch.softmax(model(x), dim=1)
        sign = -1.0 if step == fault_step + 3 else 1.0
        loss = -(y * torch.log(sign * probs)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    growth = status("VmHWM") - rss_at_fault
    nanscope.disable_dump_debug_info()
    st = session.writer.stats
    print(json.dumps({"growth_kb": growth, "dropped": st.dropped, "failing": session.writer.failing}))
    """
)


def test_full_tensor_on_a_full_disk_holds_bounded_bytes(tmp_path: Path) -> None:
    """FULL_TENSOR on a disk that stays full: the events held are bounded in bytes
    (``hold_limit_bytes``), and so is the queue (``max_queue_bytes``), whatever
    ``hold_limit`` allows in events. 580 steps past the fault would hold about 1.5 GiB
    of tensors; memory grows as in a healthy run (about 250 MiB here, the writer's
    pipeline at this rate), and the report says that the NaN born meanwhile was lost.

    glibc's heap, whose threshold for mapping large blocks rises as they are freed,
    keeps freed 1 MiB buffers as fragments and grows the RSS of both a healthy and a
    failing run step after step; a fixed threshold makes the RSS say what is held.
    """
    program = tmp_path / "program.py"
    program.write_text(FULL_TENSOR_PROGRAM)
    with tmpfs(tmp_path / "fs", "128m") as mount:
        logdir = mount / "dump"
        options = {"hold_limit_bytes": 32 << 20, "max_queue_bytes": 32 << 20}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
               "WRITER_OPTIONS": json.dumps(options), "MALLOC_MMAP_THRESHOLD_": "131072"}  # fmt: skip
        out = subprocess.run([sys.executable, str(program), str(logdir), "600", "20"],
                             capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["failing"] and result["dropped"] > 0
        assert result["growth_kb"] < 600 << 10, result  # before the bounds in bytes: 1.4 GiB
        with nanscope.open_dump(logdir) as r:
            (drops,) = r.writer_drops().values()
            assert drops.closed is True and drops.dropped == result["dropped"]
            assert drops.nonfinite_dropped is not None and drops.nonfinite_dropped >= 1
