"""The package surface: what ``import nanscope`` exports and what it does not import."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

import nanscope

FRAMEWORKS = ("torch", "tensorflow", "jax", "jaxlib", "keras", "tensorboard")


def test_import_loads_no_deep_learning_framework() -> None:
    code = (
        "import sys, nanscope, nanscope.reader, nanscope.events, nanscope.cli;"
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# The top-level API, written out: adding a name is a decision this test makes visible.
TOP_LEVEL = [
    "DebugSession",
    "DumpNotFoundError",
    "DumpReader",
    "DumpWriter",
    "NonFiniteError",
    "TensorDebugMode",
    "__version__",
    "disable_check_numerics",
    "disable_dump_debug_info",
    "enable_check_numerics",
    "enable_dump_debug_info",
    "load_ipython_extension",
    "open_dump",
]
# Library packages: their modules are private, their __init__ re-exports the API.
LIBRARY_PACKAGES = (
    "nanscope.reader",
    "nanscope.analysis",
    "nanscope.report",
    "nanscope.events",
    "nanscope.sentinel",
)


def test_public_names_are_deliberate() -> None:
    assert sorted(nanscope.__all__) == sorted(TOP_LEVEL)
    public = {n for n in dir(nanscope) if not n.startswith("_")}
    # Every public attribute is exported, except the subpackages themselves.
    undeclared = {
        n
        for n in public - set(nanscope.__all__)
        if not isinstance(getattr(nanscope, n), types.ModuleType)
    }
    assert undeclared == set()
    for name in nanscope.__all__:
        value = getattr(nanscope, name)
        if callable(value):
            assert (value.__doc__ or "").strip(), f"nanscope.{name} has no docstring"


@pytest.mark.parametrize("name", LIBRARY_PACKAGES)
def test_library_packages_export_from_private_modules(name: str) -> None:
    package = importlib.import_module(name)
    assert package.__file__ is not None
    folder = Path(package.__file__).parent
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert modules and all(m.startswith("_") for m in modules), modules
    exported = set(package.__all__)
    public = {
        n
        for n in dir(package)
        if not n.startswith("_") and not isinstance(getattr(package, n), types.ModuleType)
    }
    assert exported == public, exported ^ public
    for n in exported:
        value = getattr(package, n)
        if isinstance(value, type) or inspect.isfunction(value):
            assert (value.__doc__ or "").strip(), f"{name}.{n} has no docstring"


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"nanscope {nanscope.__version__}"
