"""nanscope's modules import one another one way: the import graph has no cycles.

Every ``import`` statement counts, at module level or inside a function: a lazy import
hides a cycle from Python at import time, not from the reader. ``from pkg import name``
is an edge to the module ``pkg.name`` when there is one, else to ``pkg``; relative imports
are resolved. Imports of modules outside nanscope, and imports by computed name
(``importlib.import_module``), are not edges.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import nanscope

PACKAGE_ROOT = Path(nanscope.__file__).parent


def modules_under(root: Path) -> dict[str, Path]:
    """Dotted module name -> its file, for every ``.py`` file of the package at ``root``."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _nearest_module(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` if it is a module, else its innermost enclosing module (``None``: none)."""
    while name not in modules:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> Iterator[str]:
    """The dotted names an import statement in ``package`` names, relative ones resolved."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join([*parts, base] if base else parts)
    yield base
    for alias in node.names:
        if alias.name != "*":
            yield f"{base}.{alias.name}"


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [_nearest_module(n, modules) for n in _imported(node, package)]
        elif isinstance(node, ast.ImportFrom):
            base, *names = _imported(node, package)
            # `from pkg import submodule` depends on the submodule; `from pkg import thing`
            # (a function, a class, a constant) on pkg itself.
            targets = [n for n in names if n in modules]
            if len(targets) < len(names) or not names:
                targets.append(_nearest_module(base, modules))
        else:
            continue
        edges.update(t for t in targets if t is not None and t != name)
    return edges


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules it imports, for the package at ``root``."""
    modules = modules_under(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module, each sorted.

    Tarjan's algorithm, iterative (a deep chain of imports must not hit the recursion
    limit).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # Each frame: a module and the iterator over the modules it imports.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, successors = work[-1]
            w = next(successors, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def a_loop(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest import loop through the component's first module: ``[a, b, ..., a]``."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v] & members):
            if w == start:
                loop = [v]
                while loop[-1] != start:
                    loop.append(came_from[loop[-1]])
                return [*reversed(loop), start]
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{component} is not strongly connected")


def describe_cycles(graph: dict[str, set[str]]) -> str:
    """One paragraph per import cycle: its modules, and one loop through them."""
    return "\n".join(
        f"cycle of {len(c)} modules: {', '.join(c)}\n  e.g. {' -> '.join(a_loop(c, graph))}"
        for c in strongly_connected(graph)
    )


# -- the finder, on packages written here -------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_graph_resolves_relative_lazy_and_submodule_imports(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.api import run\nfrom . import util\n",
            "pkg/api.py": "def run():\n    from .sub import deep\n    import pkg.sub.leaf\n",
            "pkg/util.py": "import os\nfrom pkg import api, VERSION\n",
            "pkg/sub/__init__.py": "from ..util import helper as h\n",
            "pkg/sub/deep.py": "from .. import sub\nfrom ...outside import x\n",
            "pkg/sub/leaf.py": "from pkg.sub.deep import *\nimport pkg.sub.leaf.missing\n",
        },
    )
    assert import_graph(root) == {
        "pkg": {"pkg.api", "pkg.util"},
        "pkg.api": {"pkg.sub.deep", "pkg.sub.leaf"},  # inside a function, and relative
        "pkg.util": {"pkg.api", "pkg"},  # a submodule, and a name of the package
        "pkg.sub": {"pkg.util"},
        "pkg.sub.deep": {"pkg.sub"},  # `from .. import sub`: the subpackage itself
        "pkg.sub.leaf": {"pkg.sub.deep"},  # a star import; importing itself is no edge
    }


def test_cycles_are_found_and_told(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f():\n    from pkg.c import g\n",
            "pkg/c.py": "import pkg.a\nimport pkg.d\n",
            "pkg/d.py": "from pkg.e import x\n",
            "pkg/e.py": "from pkg.d import y\n",
            "pkg/f.py": "import pkg.a\n",
        },
    )
    graph = import_graph(root)
    assert strongly_connected(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]
    told = describe_cycles(graph)
    assert "e.g. pkg.a -> pkg.b -> pkg.c -> pkg.a" in told
    assert "e.g. pkg.d -> pkg.e -> pkg.d" in told


def test_a_deep_chain_needs_no_recursion() -> None:
    chain = {f"m{i}": {f"m{i + 1}"} for i in range(5000)}
    chain["m5000"] = {"m0"}
    assert [len(c) for c in strongly_connected(chain)] == [5001]


# -- nanscope ---------------------------------------------------------------------------------


def test_the_graph_sees_nanscope_imports() -> None:
    """The graph is nanscope's, edges and all: the test below cannot pass on an empty one."""
    graph = import_graph(PACKAGE_ROOT)
    assert len(graph) > 100
    assert sum(len(edges) for edges in graph.values()) > 300
    assert "nanscope.api" in graph["nanscope"]
    assert any(m.split(".")[:2] == ["nanscope", "backends"] for m in graph["nanscope.api"])
    assert "nanscope.backends.torch.native" in graph["nanscope.backends.torch.session"]


def test_check_numerics_depends_one_way() -> None:
    """records <- report <- rule <- native <- compiled <- session, and nothing back."""
    graph = import_graph(PACKAGE_ROOT)
    layers = ["records", "report", "rule", "native", "compiled", "session"]
    names = [f"nanscope.backends.torch.check_numerics.{layer}" for layer in layers]
    for i, name in enumerate(names):
        assert not graph[name] & set(names[i + 1 :]), (name, graph[name])
        assert "nanscope.backends.torch.check_numerics" not in graph[name]
    assert graph[names[-1]] >= {*names[2:5], "nanscope.backends.torch.native"}


def test_the_lineage_record_sits_below_what_follows_lineages() -> None:
    """``analysis/_lineage.py`` holds the lineage record and its rules: the modules that
    follow lineages import it, not one another (the circle among them that was)."""
    graph = import_graph(PACKAGE_ROOT)
    boundaries = graph["nanscope.analysis._boundaries"]
    assert "nanscope.analysis._lineage" in boundaries
    assert "nanscope.analysis._lineages" not in boundaries
    analysis = {m: e for m, e in graph.items() if m.startswith("nanscope.analysis.")}
    assert strongly_connected(analysis) == []
    circle = {"_lineages": {"_boundaries"}, "_boundaries": {"_lineages", "_x"}, "_x": set()}
    assert strongly_connected(circle) == [["_boundaries", "_lineages"]]


def test_no_import_cycles() -> None:
    graph = import_graph(PACKAGE_ROOT)
    assert strongly_connected(graph) == [], "nanscope's imports go round:\n" + describe_cycles(
        graph
    )
