"""The command line, through ``main([...])`` and as a real subprocess."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanscope.cli import main

from ..helpers import write_small_dump


def test_report_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # op1 (#4) makes -inf and op2 (#5) reads it into a finite value: absorbed, so benign.
    write_small_dump(tmp_path, n=6, bad=(4,))
    assert main(["report", str(tmp_path), "--json"]) == 0  # 0: nothing harmful
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "nanscope.report/2"
    assert data["num_executions"] == 6 and data["alerts"]["executions"] == 1
    origin = data["origin"]
    assert origin["op_type"] in {"op1", "Log"} and origin["counts"]["neg_inf"] == 2
    assert origin["source"]["file"].endswith("helpers.py")
    assert data["found_nonfinite"] is True and data["found_harmful"] is False
    assert data["cause"] is None
    execution = [g for g in data["lineages"] if g["birth"]["kind"] == "execution"]
    assert [(g["kind"], g["birth"]["index"], g["absorbed_at"]) for g in execution] == [
        ("benign", 4, {"kind": "execution", "index": 5, "op_type": "op2"})
    ]
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Origin" in out and "no harmful Inf/NaN" in out


def test_report_exits_one_for_harmful_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The last op's -inf is read by nothing: it is still there when the recording ends.
    write_small_dump(tmp_path, n=6, bad=(5,))
    assert main(["report", str(tmp_path), "--json"]) == 1  # 1: harmful non-finite values
    data = json.loads(capsys.readouterr().out)
    assert data["found_harmful"] is True
    assert data["cause"]["op_type"] in {"op2", "Log"} and data["cause"]["counts"]["neg_inf"] == 2
    assert {g["kind"] for g in data["lineages"]} == {"harmful"}
    assert main(["report", str(tmp_path)]) == 1
    assert "Cause" in capsys.readouterr().out


def test_report_clean_dump_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_small_dump(tmp_path, n=3, bad=())
    assert main(["report", str(tmp_path)]) == 0
    assert "no Inf/NaN recorded" in capsys.readouterr().out


def test_missing_logdir_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("nanscope report: error:") and "no such directory" in err


def test_demo_end_to_end(tmp_path: Path) -> None:
    logdir = tmp_path / "demo"
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "demo", "--logdir", str(logdir), "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Accuracy at step 0" in out.stdout
    assert "Origin" in out.stdout and "log of zero" in out.stdout
    assert "debug_mnist.py" in out.stdout
    again = subprocess.run(
        [sys.executable, "-m", "nanscope", "demo", "--logdir", str(logdir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "already holds a dump" in again.stderr


@pytest.mark.jax
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs JAX")
def test_demo_jax_end_to_end(tmp_path: Path) -> None:
    """``--framework jax`` trains the JAX example: the report names its jitted log."""
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "demo", "--framework", "jax",
         "--logdir", str(tmp_path / "demo"), "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # the console wraps long lines
    assert "in JAX" in text and "(loss nan)" in text
    assert "log of zero" in text and "graph train_step" in text
    assert "debug_mnist_jax.py" in text
    assert "python -m nanscope.examples.debug_mnist_jax --fix" in text


def test_demo_without_its_framework_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)  # what find_spec takes for "not installed"
    assert main(["demo", "--framework", "jax"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err == (
        "nanscope demo: error: the JAX demo needs JAX, which is not installed: "
        "pip install 'nanscope[jax]'"
    )
