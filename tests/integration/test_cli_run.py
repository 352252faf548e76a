"""``nanscope run``: launcher semantics, recording, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from nanscope import open_dump
from tests.helpers import tmpfs

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, os, sys
import torch

x = torch.tensor([0.0, 1.0])
y = torch.log(x)  # the -inf
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__}))
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def nanscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nanscope", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    script = tmp_path / "pkg" / "train.py"
    script.write_text(textwrap.dedent(PROGRAM))
    return script


def test_script_sees_python_launcher_semantics_and_exit_code(tmp_path: Path, program: Path) -> None:
    out = nanscope("run", "--logdir", "dump", "pkg/train.py", "7", "--flag", cwd=tmp_path)
    assert out.returncode == 7, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "argv": ["pkg/train.py", "7", "--flag"],
        "path0": str(program.parent),
        "name": "__main__",
    }
    assert "nanscope report dump" in out.stderr
    report = nanscope("report", "dump", "--json", cwd=tmp_path)
    assert report.returncode == 1
    origin = json.loads(report.stdout)["origin"]
    assert origin["op_type"] == "aten.log.default"
    assert origin["source"]["file"] == str(program) and origin["source"]["line"] == 6


def test_module_form(tmp_path: Path, program: Path) -> None:
    (tmp_path / "pkg" / "__init__.py").write_text("")
    out = nanscope("run", "--logdir", "dump", "-m", "pkg.train", "3", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["argv"][1:] == ["3"] and seen["name"] == "__main__"
    assert seen["path0"] == str(tmp_path)
    assert nanscope("report", "dump", cwd=tmp_path).returncode == 1


def test_refuses_to_overwrite_without_force(tmp_path: Path, program: Path) -> None:
    assert nanscope("run", "--logdir", "dump", "pkg/train.py", cwd=tmp_path).returncode == 0
    again = nanscope("run", "--logdir", "dump", "pkg/train.py", cwd=tmp_path)
    assert (
        again.returncode == 2
        and "already holds a dump" in again.stderr
        and "--force" in again.stderr
    )
    forced = nanscope("run", "--force", "--logdir", "dump", "pkg/train.py", cwd=tmp_path)
    assert forced.returncode == 0
    assert len(list((tmp_path / "dump").glob("*.metadata"))) == 1  # the old set was replaced


def test_default_logdir_and_options(tmp_path: Path, program: Path) -> None:
    out = nanscope(
        "run", "--mode", "CONCISE_HEALTH", "--circular-buffer-size", "-1", "--op-regex", r"aten\.log",
        "pkg/train.py", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(nanscope("report", "nanscope-train", "--json", cwd=tmp_path).stdout)
    assert data["tensor_debug_mode"] == "CONCISE_HEALTH"
    assert data["origin"]["op_type"] == "aten.log.default"


def test_check_numerics_stops_the_program(tmp_path: Path, program: Path) -> None:
    out = nanscope("run", "--check-numerics", "pkg/train.py", cwd=tmp_path)
    assert out.returncode == 1
    assert "NonFiniteError" in out.stderr and "aten.log.default produced -inf" in out.stderr
    assert not (tmp_path / "nanscope-train").exists()


def test_crashing_program_keeps_its_dump_and_exit_status(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(
        "import torch\ntorch.log(torch.zeros(3))\nraise RuntimeError('boom')\n"
    )
    out = nanscope("run", "--logdir", "dump", "crash.py", cwd=tmp_path)
    assert out.returncode == 1 and "RuntimeError: boom" in out.stderr
    assert nanscope("report", "dump", cwd=tmp_path).returncode == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "missing.py: no such file"),
        ([], "nothing to run"),
        (["--mode", "LOUD", "x.py"], "unknown tensor debug mode 'LOUD'"),
    ],
)
def test_bad_invocations_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "x.py").write_text("")
    out = nanscope("run", *args, cwd=tmp_path)
    assert out.returncode == 2
    assert message in out.stderr and out.stderr.strip().count("\n") == 0


@pytest.mark.tf
def test_tensorflow_program_is_dumped_by_tensorflow(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    (tmp_path / "tfprog.py").write_text(
        "import tensorflow as tf\nx = tf.constant([0.0, 2.0])\ny = tf.math.log(x)\n"
    )
    out = nanscope("run", "--logdir", "dump", "tfprog.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(nanscope("report", "dump", "--json", cwd=tmp_path).stdout)
    assert data["framework"].startswith("tensorflow")
    assert data["origin"]["op_type"] == "Log" and data["origin"]["source"]["line"] == 3


# pip's console-script template, as in a virtual environment's bin/nanscope.
CONSOLE_SCRIPT = """#!{python}
import sys
from nanscope.cli import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_the_launcher_is_not_the_programs_source(
    tmp_path: Path, program: Path, recorder: str
) -> None:
    """Under the console script, stacks begin at the program's first frame, and only the
    program's files are its sources: neither bin/nanscope nor runpy shows."""
    launcher = tmp_path / "venv" / "bin" / "nanscope"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(CONSOLE_SCRIPT.format(python=sys.executable))
    launcher.chmod(0o755)
    env = dict(os.environ, NANSCOPE_TORCH_RECORDER=recorder)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [str(launcher), "run", "--logdir", "dump", "--circular-buffer-size", "-1", "pkg/train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    with open_dump(tmp_path / "dump") as dump:
        sources = {f.file_path: f.to_json()["user"] for f in dump.source_files()}
        user = {path for path, is_user in sources.items() if is_user}
        assert user == {str(program)}
        assert not any(p.endswith(("/bin/nanscope", "/runpy.py")) for p in sources)
        execs = dump.executions()
        log = [e for e in execs if e.op_type == "aten.log.default"]
        assert log
        for e in execs:
            frames = dump.stack(e)
            assert frames and frames[0].file_path == str(program), [f.file_path for f in frames]
        assert dump.stack(log[0])[-1].lineno == 6


def test_read_only_logdir_is_one_clear_line_before_the_program_runs(
    tmp_path: Path, program: Path
) -> None:
    with tmpfs(tmp_path / "ro", "1m") as fs:
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        out = nanscope("run", "--logdir", str(fs / "dump"), str(program), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"nanscope run: error: cannot write the dump in {fs / 'dump'}: Read-only file system"
    )
    assert '"argv"' not in out.stdout  # the program did not run


def test_enabling_that_fails_is_never_called_a_dump(tmp_path: Path) -> None:
    """The logdir turns read-only after the check, before the program imports PyTorch:
    the program runs on unrecorded, and nanscope says so instead of "dump written"."""
    with tmpfs(tmp_path / "fs", "1m") as fs:
        (tmp_path / "late.py").write_text(
            "import subprocess, sys\n"
            f"subprocess.run(['mount', '-o', 'remount,ro', {str(fs)!r}], check=True)\n"
            "import torch\n"
            "print(torch.log(torch.ones(2)).sum().item())\n"
        )
        out = nanscope("run", "--logdir", str(fs / "dump"), "late.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.0"
    assert "dump written" not in out.stderr
    lines = out.stderr.splitlines()
    assert any(line.startswith("nanscope: recording is off: cannot create dump directory")
               and line.endswith("Read-only file system") for line in lines), lines  # fmt: skip
    assert any(line.startswith("nanscope: no dump was written: ") for line in lines), lines
