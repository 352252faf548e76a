"""`nanscope diff` follows writes made in place, through a view, to the op that really fed
the parted op (``x[0] = x[0] * 1.1`` is a ``select`` and a ``copy_``, and later ops read
``x`` by its old id): the diff must not claim the inputs agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

PROGRAM = """\
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
x = torch.randn(8, 4)
if len(sys.argv) > 1:
    x[0] = x[0] * float(sys.argv[1])  # <- changed in place
loss = model(x).square().mean()
loss.backward()
"""


def record(tmp: Path, name: str, *args: str) -> Path:
    script = tmp / f"{name}.py"
    script.write_text(PROGRAM)
    logdir = tmp / name
    command = [sys.executable, "-m", "nanscope", "run", "--statistics", "--logdir", str(logdir)]
    subprocess.run([*command, str(script), *args], check=True, capture_output=True)
    return logdir


def diff(a: Path, b: Path) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, "-m", "nanscope", "diff", str(a), str(b), "--json"],
        capture_output=True,
        text=True,
    )
    return done.returncode, json.loads(done.stdout)


def test_a_write_through_a_view_is_the_op_that_fed_the_parted_op(tmp_path: Path) -> None:
    a = record(tmp_path, "a")
    b = record(tmp_path, "b", "1.1")
    status, result = diff(a, b)
    assert status == 1
    parted = result["parted"]
    assert parted["a"]["op_type"] == "aten.addmm.default"  # the first op that reads x
    assert parted["inputs_agree"] is False
    only = parted["only_in_one_run"]
    assert only["op_type"] == "aten.copy_.default"
    assert only["source"]["code"].strip().endswith("# <- changed in place")


def test_the_same_program_twice_agrees(tmp_path: Path) -> None:
    a = record(tmp_path, "a")
    b = record(tmp_path, "b")
    status, result = diff(a, b)
    assert status == 0
    assert result["parted"] is None
