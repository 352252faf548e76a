"""The package surface: what ``import nanscope`` exports and what it does not import."""

from __future__ import annotations

import subprocess
import sys

import nanscope

FRAMEWORKS = ("torch", "tensorflow", "jax", "jaxlib", "keras", "tensorboard")


def test_import_loads_no_deep_learning_framework() -> None:
    code = (
        "import sys, nanscope, nanscope.reader, nanscope.events, nanscope.cli;"
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_names_are_deliberate() -> None:
    public = sorted(n for n in dir(nanscope) if not n.startswith("_"))
    exported = sorted(n for n in nanscope.__all__ if not n.startswith("_"))
    assert exported == [n for n in public if n in exported]
    assert set(exported) <= set(public)
    for name in nanscope.__all__:
        assert getattr(nanscope, name) is not None


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"nanscope {nanscope.__version__}"
