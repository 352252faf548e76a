"""``nanscope run`` ends when the program's idle worker pools would let Python end.

A ``concurrent.futures`` executor left open (torch.compile keeps one for its compile
workers) has non-daemon threads that wait for work until Python's shutdown tells the
executor to stop. ``nanscope run`` waits for the program's non-daemon threads before it
closes the dump, as Python does; it must tell the pools to stop first, as Python does, or
it waits forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import concurrent.futures, threading, time

pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
print("squares", list(pool.map(lambda x: x * x, range(4))), flush=True)

def late():
    time.sleep(0.5)
    print("late thread done", flush=True)

threading.Thread(target=late).start()  # a non-daemon thread that still has work
"""


def test_an_open_executor_does_not_keep_nanscope_run_waiting(tmp_path: Path) -> None:
    program = tmp_path / "pool.py"
    program.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "--logdir", str(tmp_path / "dump"), str(program)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "squares [0, 1, 4, 9]" in out.stdout
    # The non-daemon thread was still waited for: its work is part of the run.
    assert "late thread done" in out.stdout
