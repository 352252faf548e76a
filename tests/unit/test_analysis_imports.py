"""The analysis modules' imports point one way: no module imports one that imports it back.

Every import counts, at module level, inside a function, or under ``TYPE_CHECKING``: a
circle among them means a piece sits in the wrong module (the lineage record and its
rules live in ``analysis/_lineage.py``, below everything that follows lineages).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nanscope.analysis

PACKAGE = "nanscope.analysis"
ROOT = Path(nanscope.analysis.__file__).parent


def imports_of(path: Path) -> set[str]:
    """The analysis modules ``path`` imports, anywhere in it (``_lineage``, ``_views``...)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(PACKAGE + "."):
                found.add(node.module.split(".")[2])
            elif node.module == PACKAGE:
                found.update(a.name for a in node.names if (ROOT / f"{a.name}.py").exists())
        elif isinstance(node, ast.Import):
            found.update(
                a.name.split(".")[2] for a in node.names if a.name.startswith(PACKAGE + ".")
            )
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of ``graph`` once, as the modules along it."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                loop = path[path.index(nxt) :]
                if frozenset(loop) not in seen:
                    seen.add(frozenset(loop))
                    found.append(loop)
            elif len(path) < len(graph):
                walk(nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def test_the_checker_finds_a_circle() -> None:
    graph = {"_lineages": {"_boundaries"}, "_boundaries": {"_lineages", "_x"}, "_x": set()}
    assert circles(graph) == [["_boundaries", "_lineages"]]


def test_no_import_circle_among_the_analysis_modules() -> None:
    graph = {p.stem: imports_of(p) - {p.stem} for p in ROOT.glob("_*.py") if p.stem != "__init__"}
    assert "_lineage" in graph["_boundaries"] and "_lineages" not in graph["_boundaries"]
    assert circles(graph) == []
