"""What a new user sees from ``nanscope run`` when something goes wrong, or looks wrong.

Each test runs the real command (or a real program) in a subprocess, as a user would:
a traceback shows the program's frames only, a module that cannot be found is one line
that says what to check, and ``torch.compile(module)`` under nanscope prints no warning
about nanscope's own module hooks.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
COMPILED_MLP = REPO / "tests" / "programs" / "real" / "compiled_mlp.py"
HOOK_WARNING = "when there are global hooks on modules"


def run(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def traceback_files(stderr: str) -> list[str]:
    """The files of a printed traceback's frames, outermost first."""
    return re.findall(r'^  File "([^"]+)", line \d+', stderr, flags=re.MULTILINE)


def test_check_numerics_error_shows_the_programs_frames_only(tmp_path: Path) -> None:
    """The checker raises from inside ``backward()``: the traceback ends at the program's
    line, with no frame of nanscope's checker, of the launcher, or of PyTorch in between."""
    (tmp_path / "train.py").write_text(
        textwrap.dedent(
            """\
            import torch

            def loss_of(x):
                return torch.log(x - x).sum()  # -inf: log of zero

            loss = loss_of(torch.ones(3, requires_grad=True))
            loss.backward()
            """
        )
    )
    out = run("-m", "nanscope", "run", "--check-numerics", "train.py", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("Traceback (most recent call last):\n"), out.stderr
    assert traceback_files(out.stderr) == ["train.py"], out.stderr
    assert "    loss.backward()\nnanscope.errors.NonFiniteError: " in out.stderr, out.stderr
    assert "born at aten.log.default train.py:4" in out.stderr


def test_error_of_the_program_keeps_its_frames_and_the_librarys(tmp_path: Path) -> None:
    """An error of the program's own call into PyTorch, run as ``-m``: the program's frames
    and PyTorch's as ``python -m`` shows them, none of nanscope's or runpy's."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(
        textwrap.dedent(
            """\
            import torch

            def forward(x):
                return torch.nn.functional.linear(x, torch.ones(3, 4))

            forward(torch.ones(2, 2))
            """
        )
    )
    out = run("-m", "nanscope", "run", "--logdir", "dump", "-m", "pkg.train", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    files = traceback_files(out.stderr)
    assert files and all(f.endswith("pkg/train.py") for f in files), out.stderr
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in out.stderr
    assert "nanscope/" not in "".join(files) and "runpy" not in out.stderr


def test_missing_module_is_one_line_that_says_what_to_check(tmp_path: Path) -> None:
    out = run("-m", "nanscope", "run", "-m", "missing_module", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("nanscope run: error: -m missing_module: No module named")
    assert "check the name" in lines[0] and "PYTHONPATH" in lines[0], lines[0]
    assert not list(tmp_path.iterdir())  # no logdir left behind


def test_torch_compile_module_under_nanscope_run_prints_no_hook_warning(tmp_path: Path) -> None:
    """nanscope's global module hooks made PyTorch warn at every call of the compiled
    module; they tolerate the extra call it warns about (context.py), so it is not shown."""
    out = run(
        "-m",
        "nanscope",
        "run",
        "--logdir",
        "dump",
        str(COMPILED_MLP),
        "--steps",
        "2",
        cwd=tmp_path,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "dump written to dump" in out.stderr
    assert HOOK_WARNING not in out.stderr, out.stderr
    from nanscope import open_dump

    # The compiled model's ops still carry its module paths.
    with open_dump(tmp_path / "dump") as dump:
        paths = {e.module_path for e in dump.executions()}
        ops = [dump.graph_op(t.graph_id, t.op_name) for t in dump.traces()]
        paths |= {op.module_path for op in ops if op is not None}
    assert any(p.startswith("fc1 (Linear)") for p in paths), paths


def test_hook_warning_is_shown_again_once_recording_stops(tmp_path: Path) -> None:
    """Only nanscope's own hooks are excused: after recording stops, a program that
    registers global hooks of its own gets PyTorch's warning as usual."""
    (tmp_path / "prog.py").write_text(
        textwrap.dedent(
            """\
            import warnings
            import torch
            import nanscope

            warnings.simplefilter("always")
            model = torch.compile(torch.nn.Linear(4, 2), backend="eager")
            nanscope.enable_dump_debug_info("dump")
            model(torch.ones(1, 4))
            nanscope.disable_dump_debug_info()
            print("recorded")
            torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
            model(torch.ones(1, 4))
            """
        )
    )
    out = run("prog.py", cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "recorded\n"
    # One warning: the call after recording stopped, not the one recorded.
    assert out.stderr.count(HOOK_WARNING) == 1, out.stderr
