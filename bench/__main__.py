"""``python -m bench``: every benchmark suite behind one entry point.

``python -m bench`` (or ``--help``) lists the suites, grouped by what they measure;
``python -m bench SUITE [ARGS]`` runs one, the same as ``python bench/SUITE.py [ARGS]``
(``python -m bench SUITE --help`` gives its arguments). Run it from the repository root
with nanscope importable (``PYTHONPATH=src``).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# The suites, each bench/<name>.py with a main(argv), by what they measure. The other
# modules in bench/ are what the suites share (harness.py) or run in their children.
SUITES: dict[str, tuple[str, ...]] = {
    "overhead: what recording costs a program": (
        "overhead_torch",
        "overhead_jax",
        "jax_breakdown",
        "small_ops",
        "check_numerics_ops",
        "gil_holds",
        "startup",
        "integrations_lightning",
        "integrations_transformers",
        "sentinel",
        "statistics_cost",
    ),
    "dumps: writing and reading them, at scale": (
        "reader",
        "scale",
        "scale_ranks",
        "views_memory",
        "writer_faults",
        "diff",
    ),
    "server: nanscope serve": ("server_load", "gui"),
    "diagnostics: not timings": ("real_programs",),
}


def summary(name: str) -> str:
    """The first line of a suite's docstring, read without importing it (a suite
    imports PyTorch, JAX or TensorFlow)."""
    doc = ast.get_docstring(ast.parse((BENCH / f"{name}.py").read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    return line.removeprefix("Benchmark: ").removeprefix("Diagnostic: ")


def usage() -> str:
    """The list of suites, as ``python -m bench`` prints it."""
    lines = ["usage: python -m bench SUITE [ARGS]   (python -m bench SUITE --help)", ""]
    width = max(len(name) for names in SUITES.values() for name in names)
    for group, names in SUITES.items():
        lines.append(f"{group}")
        lines += [f"  {name:<{width}}  {summary(name)}" for name in names]
        lines.append("")
    lines.append("Figures, and the command that gave each: bench/RESULTS.md")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """List the suites, or run one with the arguments that follow its name."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if not any(name in names for names in SUITES.values()):
        print(f"python -m bench: no suite {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    # The command line the suite would see as a script: its "Command:" lines print it.
    sys.argv = [f"bench/{name}.py", *rest]
    suite = importlib.import_module(name)  # by its plain name: bench/ is on sys.path
    return int(suite.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
