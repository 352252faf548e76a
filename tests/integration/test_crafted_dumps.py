"""``nanscope report`` on dumps whose records claim more than they hold, as a real process.

The issue's dump: a few hundred bytes whose summary claims a 12000x12000 shape made the
report allocate gigabytes and end in a traceback. The report must stay under 1 GiB, finish
with its usual exit status, and name each refused claim in one line with file and offset.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.crafted import big_full_tensor_dump, big_summary_dump

GiB = 1 << 30

# Runs the command in a child and prints that child's peak RSS (KiB) on its last stderr line.
# The child is forked from this small interpreter, not from pytest: on Linux a process's
# peak RSS survives exec, so one started from pytest would report pytest's peak as its own.
_MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _address_space_cap() -> None:
    # A regression then fails with MemoryError at 3 GiB instead of taking the machine down.
    resource.setrlimit(resource.RLIMIT_AS, (3 * GiB, 3 * GiB))


def report(logdir: Path, *extra: str) -> tuple[int, str, str, int]:
    """``nanscope report logdir``: exit status, stdout, stderr and peak RSS in bytes."""
    env = {**os.environ, "COLUMNS": "1000"}  # one problem, one line
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "nanscope", "report",
         str(logdir), *extra],
        capture_output=True, text=True, timeout=300, env=env, preexec_fn=_address_space_cap,
    )  # fmt: skip
    err, _, peak = proc.stderr.rstrip("\n").rpartition("\n")
    if not err and peak and not peak.isdigit():
        err, peak = peak, ""
    assert peak.isdigit(), proc.stderr[-2000:]
    return proc.returncode, proc.stdout, err, int(peak) * 1024


@pytest.mark.parametrize(
    ("make", "claim"),
    [
        (big_summary_dump, "output 0: a summary of shape 12000x12000 claims 144,000,000 elements"),
        (big_full_tensor_dump, "output 1: shape 12000x12000 of float32 claims 144,000,000 "
                               "elements, the record holds 0 values"),
    ],
)  # fmt: skip
def test_report_on_a_crafted_dump_stays_small_and_names_the_claim(
    tmp_path: Path, make: Callable[[Path], Path], claim: str
) -> None:
    path = make(tmp_path)
    rc, out, err, peak = report(tmp_path)
    assert "Traceback" not in err and "Traceback" not in out, err[-2000:]
    assert rc == 0, err  # no Inf/NaN could be read: the usual "none found"
    assert peak < GiB, f"peak RSS {peak / 2**20:.0f} MiB"
    # The .execution file's record (the trace's is reported on its own line).
    lines = [line for line in out.splitlines() if claim in line and str(path) in line]
    assert len(lines) == 1, out
    assert lines[0].startswith(f"error: {path}: record at byte offset 0: {claim}")
    assert lines[0].endswith("; not shown")


def test_report_json_on_a_crafted_dump_is_strict_json(tmp_path: Path) -> None:
    path = big_summary_dump(tmp_path)
    rc, out, err, peak = report(tmp_path, "--json")
    assert rc == 0 and "Traceback" not in err, err[-2000:]
    assert peak < GiB, f"peak RSS {peak / 2**20:.0f} MiB"
    problems = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))["problems"]
    assert {p["message"].split(": output")[0] for p in problems} >= {
        f"{path}: record at byte offset 0"
    }
