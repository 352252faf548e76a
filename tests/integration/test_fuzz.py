"""Bounded runs of the coverage-guided fuzzers (fuzz/fuzz_reader.py, fuzz/fuzz_claims.py).

CI fuzzes for a short, fixed number of inputs; ``python fuzz/fuzz_reader.py
-max_total_time=3600`` fuzzes longer. A crash, a hang (over 20 s on one input)
or memory over 1 GiB makes atheris exit non-zero with the offending input.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

HARNESS = Path(__file__).parents[2] / "fuzz" / "fuzz_reader.py"
CLAIMS = Path(__file__).parents[2] / "fuzz" / "fuzz_claims.py"


def _fuzz(harness: Path, runs: int, tmp_path: Path, *extra: str) -> None:
    fuzzer = [sys.executable, str(harness), f"-runs={runs}", "-max_len=512", "-rss_limit_mb=1024",
              "-seed=1", f"-artifact_prefix={tmp_path}/", *extra]  # fmt: skip
    # Through a shell that forks it (no exec): on Linux a process started straight from this
    # one inherits this process's peak RSS (ru_maxrss survives exec), and pytest, with
    # PyTorch and transformers loaded by earlier tests, is past the fuzzer's 1 GiB limit.
    proc = subprocess.run(
        ["sh", "-c", '"$0" "$@"; exit $?', *fuzzer],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    tail = proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert f"Done {runs} runs" in proc.stderr, tail
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("timeout-*"))


def test_fuzzer_finds_no_crash_hang_or_leak(tmp_path: Path) -> None:
    _fuzz(HARNESS, 600, tmp_path)


def test_claims_fuzzer_finds_no_crash_or_allocation_past_1_gib(tmp_path: Path) -> None:
    # Well-framed records whose shapes, dtypes, sizes and summary slots lie; -len_control=0
    # lets inputs grow at once to the length that reaches several mutations per dump.
    _fuzz(CLAIMS, 400, tmp_path, "-len_control=0")
