"""The package reads one way down: no import circle, and nothing below the command line imports it or click.

Static: every module under orchestrator/ is parsed (never imported), its imports resolved (relative ones
too) to the package's own modules, and the graph searched for circles. Every import statement counts:
module level, inside a function (a lazy import is a circle all the same, only one that fails later) and
under ``if TYPE_CHECKING`` (a type-only dependency still ties the two modules together).
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = "orchestrator"


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _modules() -> dict[str, tuple[Path, bool]]:
    return {name: (path, is_package) for path in sorted((ROOT / PACKAGE).rglob("*.py"))
            for name, is_package in [_module_name(path)]}


def _imported_names(module: str, is_package: bool, tree: ast.Module) -> list[tuple[str, int]]:
    """(dotted name, line) of everything the module imports: ``import a.b`` -> a.b; ``from .x import y`` ->
    <package>.x.y (a submodule or a name in <package>.x: the caller keeps the longest that is a module)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def graph_of(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """module -> {imported module of ``sources``: first line}; ``sources``: module -> (its text, is a package)."""
    graph: dict[str, dict[str, int]] = {}
    for module, (text, is_package) in sources.items():
        edges = graph.setdefault(module, {})
        for name, line in _imported_names(module, is_package, ast.parse(text, module)):
            while name and name not in sources:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.setdefault(name, line)
    return graph


def import_graph() -> dict[str, dict[str, int]]:
    """The graph of the package's own modules."""
    return graph_of({module: (path.read_text(), is_package) for module, (path, is_package) in _modules().items()})


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search, colours white/grey/black)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 100 and "orchestrator.estimate.step" in graph["orchestrator.planner"]
    cycle = find_cycle(graph)
    assert cycle is None, ("import circle: " + _describe(cycle, graph) + ". Move what both need into a module "
                           "below them (do not hide the import inside a function: it is still a circle)")


def test_the_cycle_finder_finds_a_circle_through_lazy_and_type_checking_imports():
    """The finder itself: a -> b at module level, b -> c in a function, c -> a under TYPE_CHECKING."""
    sources = {"p": ("", True), "p.a": ("from . import b\n", False),
               "p.b": ("import os\n\ndef f():\n    from .c import g\n", False),
               "p.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import A\n", False)}
    graph = graph_of(sources)
    assert graph["p.b"] == {"p.c": 4}
    assert find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    assert find_cycle(graph_of({**sources, "p.c": ("from . import A\n", False)})) is None


def test_only_the_command_line_imports_click_or_the_cli_package():
    """cli/ may import anything; nothing below it imports orchestrator.cli, click, or the benchmarks' and tests'
    modules (published runs' data and the scoring live there, not in the run-time package)."""
    modules = _modules()
    offenders = []
    for module, (path, is_package) in modules.items():
        if module == f"{PACKAGE}.cli" or module.startswith(f"{PACKAGE}.cli."):
            continue
        for name, line in _imported_names(module, is_package, ast.parse(path.read_text(), str(path))):
            top = name.split(".")[0]
            if top in ("click", "tests", "benchmarks") or name.startswith(f"{PACKAGE}.cli"):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not offenders, offenders
