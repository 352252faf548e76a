"""The report of the tutorial's diverging MLP leads with the answer, in the program's steps.

``nanscope.examples.debug_mnist`` prints ``Accuracy at step N`` for N from 0, once per
training step, after that step's update; its ``log`` makes -inf at step 3. The report's
header must name the same steps (the evaluation after the last update is recorded as one
step more, and said apart), its first line after the header must be the cause, and the
cause's op type must lead the op-type table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

STEPS = 4
PRINTED = re.compile(r"^Accuracy at step (\d+):", re.M)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("mnist") / "dump"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanscope.examples.debug_mnist",
            "--dump_dir",
            str(d),
            "--max_steps",
            str(STEPS),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return d, [int(s) for s in PRINTED.findall(out.stdout)]


def report(logdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="100")
    return subprocess.run(
        [sys.executable, "-m", "nanscope", "report", str(logdir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.slow
def test_the_header_names_the_steps_the_program_printed(run: tuple[Path, list[int]]) -> None:
    logdir, printed = run
    assert printed == list(range(STEPS))
    r = report(logdir)
    assert r.returncode == 1, r.stdout + r.stderr
    header = r.stdout.splitlines()[1]
    assert f"steps {printed[0]}–{printed[-1]} (step {STEPS}: after the last)" in (header), header
    # The JSON keeps its documented range: every step recorded, the evaluation's too.
    data = json.loads(report(logdir, "--json").stdout)
    assert data["steps"] == [0, STEPS]


@pytest.mark.slow
def test_the_answer_leads_the_report(run: tuple[Path, list[int]]) -> None:
    logdir, _ = run
    lines = report(logdir).stdout.splitlines()
    assert lines[3].startswith("✗ aten.log.default produced -inf at step 3"), lines[:6]
    table = lines.index(next(ln for ln in lines if ln.startswith("op type")))
    assert lines[table + 1].startswith("aten.log.default"), lines[table : table + 3]
    assert sum("✗" in ln for ln in lines) == 1
    assert sum("✓" in ln for ln in lines) == 0
    # Its values stayed far below float32's limit: no Headroom section.
    assert not any(ln.startswith("Headroom") for ln in lines)
    lineages = lines[lines.index("lineages (births of Inf/NaN and what became of them):") + 1 :]
    births = [ln for ln in lineages if ln.startswith("  harmful")]
    assert births and all(len(ln) <= 100 for ln in births)
    assert len(set(births)) == len(births)


@pytest.mark.tf
@pytest.mark.slow
def test_a_tensorflow_report_lists_no_variable_reads_as_births(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """TensorFlow's version of the tutorial: once the update made the weights NaN, every
    ``ReadVariableOp`` of a later call reads them back with no recorded edge to the update.
    Those reads are one line after the cause, not a list of harmful births."""
    pytest.importorskip("tensorflow")
    d = tmp_path_factory.mktemp("mnist_tf") / "dump"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanscope.examples.debug_mnist_tf",
            "--dump_dir",
            str(d),
            "--max_steps",
            str(STEPS),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    printed = [int(s) for s in PRINTED.findall(out.stdout)]
    r = report(d)
    lines = r.stdout.splitlines()
    assert f"steps {printed[0]}–{printed[-1]}" in lines[1], lines[1]
    assert lines[3].startswith("✗ Log produced -inf"), lines[:5]
    table = lines.index(next(ln for ln in lines if ln.startswith("op type")))
    assert lines[table + 1].startswith("Log (graph)"), lines[table : table + 3]
    start = lines.index("lineages (births of Inf/NaN and what became of them):")
    lineages = lines[start + 1 :]
    assert not any("ReadVariableOp #" in ln for ln in lineages), "\n".join(lineages)
    assert any(ln.startswith("  and ") and "reads of variables" in ln for ln in lineages)
    # The JSON still lists every lineage group, the reads among them.
    data = json.loads(report(d, "--json").stdout)
    assert any(g["birth"]["op_type"] == "ReadVariableOp" for g in data["lineages"])


@pytest.mark.slow
def test_a_jax_header_names_the_steps_the_program_printed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """JAX records no phases: a step ends when a jitted training step returns, and the
    evaluation after the last one is the step apart."""
    pytest.importorskip("jax")
    d = tmp_path_factory.mktemp("mnist_jax") / "dump"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanscope.examples.debug_mnist_jax",
            "--dump_dir",
            str(d),
            "--max_steps",
            str(STEPS),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    printed = [int(s) for s in PRINTED.findall(out.stdout)]
    assert printed == list(range(STEPS))
    header = report(d).stdout.splitlines()[1]
    assert f"steps 0–{STEPS - 1} (step {STEPS}: after the last)" in header, header
