"""Framework backends: each instruments one framework and reports into the event writer.

Backends import their framework lazily; nothing here imports one.
"""

from __future__ import annotations

import importlib.util
import sys

# The frameworks nanscope knows, in the order detect() tries them, and whether
# nanscope can record programs of each.
FRAMEWORKS: dict[str, bool] = {"torch": True, "tensorflow": True, "jax": True}
RECORDED = tuple(name for name, recorded in FRAMEWORKS.items() if recorded)


def detect(framework: str = "auto") -> str:
    """The framework to instrument: the one already imported, else the one installed."""
    if framework != "auto":
        if framework not in FRAMEWORKS:
            raise ValueError(
                f"unknown framework {framework!r}; use one of: auto, {', '.join(FRAMEWORKS)}"
            )
        return framework
    for name in FRAMEWORKS:
        if name in sys.modules:
            return name
    for name in FRAMEWORKS:
        if importlib.util.find_spec(name) is not None:
            return name
    raise RuntimeError(
        "no supported framework is installed (PyTorch, TensorFlow or JAX); "
        "install one, e.g. pip install 'nanscope[torch]'"
    )
