"""The import graph of both packages and the lab, read from the source with ``ast``: no cycle, and the agreed directions.

Every module of ``platform_sim``, ``evalstop_callbacks`` and the lab (``benchmarks/lab``, imported as ``lab``) is
parsed (nothing is imported); every ``import`` and
``from ... import`` statement counts, wherever it is (module level, inside a function, under ``if``), with relative
imports resolved. An edge goes to the most specific module the statement names: ``import a.b.c`` -> ``a.b.c``,
``from a.b import c`` -> ``a.b.c`` when that is a module, else ``a.b``; ``from . import x`` likewise.

The directions (the agreed layout of issue 30):

- ``platform_sim.core`` is pure: it imports nothing of ``platform_sim`` outside ``core`` and nothing of
  ``evalstop_callbacks``;
- nothing installed (``evalstop_callbacks``, ``platform_sim``) imports the lab (``lab``, not in the wheel);
- the library (``evalstop_callbacks`` outside ``demo/``; ``watch/`` and ``cli`` are library) never imports the demo,
  the simulator (``platform_sim.sim``), the studies or the service; the demo (``evalstop_callbacks.demo``) replays the
  shipped traces on the simulator, like a user's script would;
- the simulator engine (``platform_sim.sim``) never imports the studies nor the Ray/Optuna adapters;
- ``platform_sim`` never imports the lab nor the demo.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("platform_sim", "evalstop_callbacks")
#: The lab: a package under benchmarks/ (what sys.path gets for it), beside the installed ones.
LAB = (REPO / "benchmarks", "lab")

Graph = dict[str, set[str]]


def _module_files(root: Path, package: str) -> Iterator[tuple[str, Path, bool]]:
    """``(dotted name, path, is_package)`` of every module of ``package`` under ``root``."""
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        yield ".".join(parts[:-1] if is_package else parts), path, is_package


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` statement reads from."""
    if node.level == 0:
        return node.module or ""
    # A package's own __init__ is level 1 of itself; a plain module's level 1 is its parent package.
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _most_specific(name: str, modules: set[str]) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of ``modules`` (None: not one of ours)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def build_graph(root: Path, packages: Iterable[str], more: Iterable[tuple[Path, str]] = ()) -> Graph:
    """The import graph of ``packages`` (folders under ``root``): module -> the modules of those packages it imports.

    Args:
        root: The folder that holds the packages (what ``sys.path`` would get).
        packages: The top-level package names to read; imports of anything else are left out.
        more: ``(folder, package)`` of packages that live in other folders of ``sys.path``.
    """
    sources = [(root, package) for package in packages] + list(more)
    files = [entry for folder, package in sources for entry in _module_files(folder, package)]
    modules = {name for name, _, _ in files}
    graph: Graph = {name: set() for name in modules}
    for name, path, is_package in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # every statement, function bodies included
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve_from(name, is_package, node)
                # "from a import b" reads the module a.b when there is one, else the attribute b of a
                targets = [f"{source}.{alias.name}" if source else alias.name for alias in node.names]
                targets = [t if t in modules else source for t in targets]
            for target in targets:
                resolved = _most_specific(target, modules)
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def import_circles(graph: Graph) -> list[list[str]]:
    """Every cycle-carrying group of ``graph``: one cycle through each set of modules that import each other
    (strongly connected, more than one module), as ``[a, b, ..., a]``."""
    reach: dict[str, set[str]] = {}

    def reachable(start: str) -> set[str]:
        if start not in reach:
            seen, todo = set(), [start]
            while todo:
                for nxt in graph.get(todo.pop(), ()):
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            reach[start] = seen
        return reach[start]

    circles, placed = [], set()
    for node in sorted(graph):
        if node in placed or node not in reachable(node):
            continue
        group = {m for m in reachable(node) if node in reachable(m)}
        placed |= group
        cycle = find_cycle({m: graph[m] & group for m in group}) or [node]
        rest = sorted(group - set(cycle))
        circles.append(cycle + ([f"(and {', '.join(rest)})"] if rest else []))
    return circles


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(graph: Graph, importer: str, forbidden: Iterable[str], exempt: Iterable[str] = ()) -> list[str]:
    """``"a -> b"`` for every module ``a`` in package ``importer`` (outside ``exempt``) importing a module of
    ``forbidden``."""
    forbidden, exempt = tuple(forbidden), tuple(exempt)
    return sorted(
        f"{src} -> {dst}"
        for src, targets in graph.items()
        if _in(src, importer) and not any(_in(src, e) for e in exempt)
        for dst in targets
        if any(_in(dst, f) for f in forbidden)
    )


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(REPO, PACKAGES, [LAB])


def test_the_graph_is_read_from_both_packages(graph):
    # Pins the builder on real edges it must see (a relative import at module level, a function-local one).
    assert "platform_sim.core" in graph and "evalstop_callbacks.cli" in graph and "lab.cli" in graph
    assert any(_in(dst, "platform_sim.core") for dst in graph["evalstop_callbacks.callback"])
    assert any(_in(dst, "evalstop_callbacks") for dst in graph["evalstop_callbacks.demo.run"])
    assert "evalstop_callbacks.demo.overopt" in graph["lab.trainers"]  # the lab builds on the demo's world
    assert "lab.runs" in graph["lab.trainers"]


def test_no_import_cycle(graph):
    circles = import_circles(graph)
    assert circles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_core_is_pure(graph):
    outside = {m.split(".")[1] for m in graph if m.count(".") >= 1 and _in(m, "platform_sim")} - {"core"}
    forbidden = [f"platform_sim.{sub}" for sub in sorted(outside)] + ["evalstop_callbacks"]
    assert _violations(graph, "platform_sim.core", forbidden) == []


def test_nothing_installed_imports_the_lab(graph):
    assert _violations(graph, "evalstop_callbacks", ["lab"]) == []
    assert _violations(graph, "platform_sim", ["lab"]) == []


def test_library_never_imports_demo_simulator_studies_or_service(graph):
    forbidden = ["evalstop_callbacks.demo", "platform_sim.sim", "platform_sim.studies", "platform_sim.service"]
    assert _violations(graph, "evalstop_callbacks", forbidden, exempt=["evalstop_callbacks.demo"]) == []


def test_the_demo_imports_no_service(graph):
    assert _violations(graph, "evalstop_callbacks.demo", ["platform_sim.service"]) == []


def test_engine_never_imports_studies_or_adapters(graph):
    assert _violations(graph, "platform_sim.sim", ["platform_sim.studies", "platform_sim.integrations"]) == []


def test_platform_never_imports_the_demo(graph):
    assert _violations(graph, "platform_sim", ["evalstop_callbacks.demo"]) == []


def _module_level_imports(tree: ast.Module) -> Iterator[str]:
    """The modules a file imports when it is imported: statements outside any function body (classes, ``if`` and
    ``try`` blocks at module level included)."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        todo.extend(ast.iter_child_nodes(node))


def test_matplotlib_is_imported_only_where_a_plot_is_drawn():
    # The base install has no matplotlib (the plot and demo extras do): no installed module may need it to import.
    eager = sorted(
        f"{name} imports {target}"
        for package in PACKAGES
        for name, path, _ in _module_files(REPO, package)
        for target in _module_level_imports(ast.parse(path.read_text(encoding="utf-8")))
        if target.split(".")[0] == "matplotlib"
    )
    assert eager == []
    # ...and the check sees one where it is (a function-level import is left alone).
    assert list(_module_level_imports(ast.parse("import matplotlib.pyplot as plt\n"))) == ["matplotlib.pyplot"]
    assert list(_module_level_imports(ast.parse("def f():\n    import matplotlib\n"))) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_builder_finds_a_cycle_through_a_function_local_relative_import(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .sub import b\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": "import pkg.c\n",
            "pkg/c.py": "def f():\n    from . import a\n    return a\n",
            "pkg/d.py": "from .sub.b import anything\nimport os\n",
        },
    )
    graph = build_graph(tmp_path, ["pkg"])
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.sub.b"}  # an attribute of a module; the standard library is left out
    assert import_circles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    (tmp_path / "pkg/c.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    assert import_circles(build_graph(tmp_path, ["pkg"])) == []


def test_builder_resolves_parent_relative_imports_from_a_package_init(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .sub import thing\n",
            "pkg/sub/__init__.py": "from .. import other\nfrom ..other import name\n",
            "pkg/other.py": "",
        },
    )
    graph = build_graph(tmp_path, ["pkg"])
    assert graph["pkg"] == {"pkg.sub"}
    assert graph["pkg.sub"] == {"pkg.other"}
