"""What reaches the disk when the program ends badly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import nanscope
from nanscope.reader import EXECUTIONS

PROGRAM = """
import os, signal, sys, time
import numpy as np
from nanscope.events import DumpWriter, ExecutionEvent

logdir, how, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
w = DumpWriter(logdir, "FULL_HEALTH", 50, flush_interval=interval)
v = np.array([-1, -1, 1, 1, 4, 0, 0, 0, 1, 1, 2], dtype=float)
bad = v.copy(); bad[7] = 1
for i in range(200):
    w.write_execution(ExecutionEvent("op", [i], summaries=[bad if i == 10 else v]))
print("written", flush=True)
if how == "raise":
    raise RuntimeError("training crashed")
if how == "exit":
    sys.exit(3)
if how in ("wait", "sigint"):
    time.sleep(60)
if how == "os_exit":
    time.sleep(4 * interval)
    os._exit(7)
"""


def run(tmp_path: Path, how: str, interval: float = 3600.0) -> subprocess.Popen[str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "dump"), how, str(interval)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_written(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "written"


def check_dump(tmp_path: Path) -> None:
    """Circular buffer of 50 + the window around the first NaN (#11): nothing else lost."""
    with nanscope.open_dump(tmp_path / "dump") as r:
        seqs = [e.sequence for e in r.executions()]
        assert seqs[-50:] == list(range(151, 201))
        assert 11 in seqs  # the first non-finite event, kept although it is old
        ref = r.first_nonfinite(EXECUTIONS)
        assert ref is not None and r.execution(ref.index).sequence == 11
        assert not [p for p in r.problems if p.severity == "error"]


@pytest.mark.parametrize(("how", "code"), [("raise", 1), ("exit", 3), ("normal", 0)])
def test_exit_paths_flush_everything(tmp_path: Path, how: str, code: int) -> None:
    proc = run(tmp_path, how)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    if how == "raise":
        assert "training crashed" in err  # the program's own traceback is still shown
    check_dump(tmp_path)
    with nanscope.open_dump(tmp_path / "dump") as r:
        assert r.incomplete == []  # the writer closed: nothing is missing


def _report(tmp_path: Path) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "report", str(tmp_path / "dump"), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return out.returncode, json.loads(out.stdout)


def test_sigterm_flushes_and_still_dies_of_sigterm(tmp_path: Path) -> None:
    proc = run(tmp_path, "wait")
    wait_written(proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    check_dump(tmp_path)


def test_sigint_flushes(tmp_path: Path) -> None:
    proc = run(tmp_path, "sigint")
    wait_written(proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    check_dump(tmp_path)


def test_sigkill_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    proc = run(tmp_path, "wait", interval=0.2)
    wait_written(proc)
    time.sleep(1.0)  # several periodic flushes
    proc.kill()
    proc.wait(timeout=60)
    check_dump(tmp_path)


def test_os_exit_skips_atexit_but_periodic_flush_saved_the_events(tmp_path: Path) -> None:
    proc = run(tmp_path, "os_exit", interval=0.2)
    proc.communicate(timeout=60)
    assert proc.returncode == 7
    check_dump(tmp_path)


def test_sigkill_before_any_flush_loses_the_buffer_but_leaves_a_readable_dump(
    tmp_path: Path,
) -> None:
    proc = run(tmp_path, "wait", interval=3600)
    wait_written(proc)
    proc.kill()
    proc.wait(timeout=60)
    with nanscope.open_dump(tmp_path / "dump") as r:
        assert r.num_executions() == 0  # the documented bound: one flush interval
        assert r.processes and r.processes[0].tensor_debug_mode is not None
    # The NaN made before the kill is lost with the buffer: never an all-clear.
    status, data = _report(tmp_path)
    assert status == 2 and data["verdict"] == "incomplete", data
    assert any("never closed" in p["message"] for p in data["incomplete"])


def test_os_exit_after_a_flush_reads_what_was_flushed_and_gives_no_all_clear(
    tmp_path: Path,
) -> None:
    proc = run(tmp_path, "os_exit", interval=0.2)
    proc.communicate(timeout=60)
    status, data = _report(tmp_path)
    # What was flushed is read (the NaN among it); what came after may be lost: no all-clear.
    assert data["found_nonfinite"] and data["origin"]["index"] == 10
    assert status == 2 and data["verdict"] == "incomplete", data["verdict"]
    assert any("never closed" in p["message"] for p in data["incomplete"])


# A process whose dump cannot close: a source that never returns from close() (as a stuck
# disk or a bug would), registered beside a real writer that flushes every 0.2 s.
HUNG_CLOSE = """
import sys, threading, time
import numpy as np
from nanscope.events import DumpWriter, ExecutionEvent, _lifecycle

_lifecycle.CLOSE_AFTER_SIGNAL_S = 1.0

class StuckSource:
    def flush(self):
        pass

    def close(self):
        threading.Event().wait()

logdir, where = sys.argv[1], sys.argv[2]
w = DumpWriter(logdir, "FULL_HEALTH", 50, flush_interval=0.2)
v = np.array([-1, -1, 1, 1, 4, 0, 0, 0, 1, 1, 2], dtype=float)
for i in range(20):
    w.write_execution(ExecutionEvent("op", [i], summaries=[v]))
source = StuckSource()
_lifecycle.register_source(source)
time.sleep(0.6)  # flushed
if where == "closing":
    # The program is closing its dumps on its own (a pool's worker that was told to stop)
    # when the signal comes: the signal waits for the close, which never ends.
    with _lifecycle.closing():
        print("closing", flush=True)
        source.close()
print("waiting", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("where", ["waiting", "closing"])
def test_a_close_that_hangs_cannot_keep_a_terminated_process_alive(
    tmp_path: Path, where: str
) -> None:
    """SIGTERM closes the dumps, but a close that never ends (or one already running when
    the signal came) ends the process ``CLOSE_AFTER_SIGNAL_S`` later: a multiprocessing
    Pool that terminates its workers joins them, and must not wait for ever. The dump then
    reads as incomplete (its writer never closed), never as whole."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(HUNG_CLOSE))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "dump"), where],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == where
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a hang: leave no process behind
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert f"after signal {int(signal.SIGTERM)}" in err and "ends without it" in err
    status, data = _report(tmp_path)
    assert status == 2 and data["verdict"] == "incomplete", data["verdict"]
    assert any("never closed" in p["message"] for p in data["incomplete"])
