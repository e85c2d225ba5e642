"""scripts/ stays readable: no Python file in it (scripts/benchmarks/ included) is over 350 lines,
and its modules import each other without a cycle. They import each other as top-level names
(`import tiny_workflow`, scripts/ being on the path) and as the package `benchmarks` (`from
benchmarks.common import ...`); imports inside functions count, as they run all the same."""

from __future__ import annotations

import ast
from pathlib import Path

from factory import REPO

SCRIPTS = REPO / "scripts"
MOST_LINES = 350


def modules_under(root: Path) -> dict[str, Path]:
    """Each module by the name it is imported by with `root` on the path: scripts/tiny_workflow.py ->
    tiny_workflow, scripts/benchmarks/common.py -> benchmarks.common, a package's __init__.py -> the package."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path) -> set[str]:
    """The dotted names a module imports, absolute (relative imports resolved against its package),
    each `from X import y` also as X.y, which is a module where y is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(filter(None, [*base, node.module or ""]))
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports among `modules`. Importing a.b runs the package a's __init__ first, so it
    counts too: a package's __init__ that imported its own modules would close a cycle."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for dotted in imported(name, path):
            parts = dotted.split(".")
            targets.update(prefix for k in range(1, len(parts) + 1) if (prefix := ".".join(parts[:k])) in modules)
        graph[name] = targets - {name}
    return graph


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first again at the end), or None."""
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*trail[trail.index(target):], target]
            if target not in state and (cycle := visit(target, [*trail, target])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_no_python_file_in_scripts_is_over_350_lines():
    long = {str(path.relative_to(REPO)): lines for path in SCRIPTS.rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > MOST_LINES}
    assert not long, f"over {MOST_LINES} lines (split them): {long}"


def test_scripts_import_each_other_without_a_cycle():
    graph = import_graph(modules_under(SCRIPTS))
    assert {"benchmarks", "benchmarks.common"} <= graph["benchmark"]  # the tree this test reads, as it is
    assert a_cycle(graph) is None, f"an import cycle in scripts/: {' -> '.join(a_cycle(graph))}"


def test_the_cycle_check_finds_cycles_through_packages_and_relative_imports(tmp_path):
    """The check itself, on a tree made here: a -> pkg.b -> (relative) pkg.c -> a, an import inside a
    function on the way; then a package's __init__ importing its own module b, which imports pkg."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "a.py").write_text("def f():\n    from pkg.b import x\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "b.py").write_text("from . import c\n")
    (tmp_path / "pkg" / "c.py").write_text("import a\n")
    assert a_cycle(import_graph(modules_under(tmp_path))) == ["a", "pkg.b", "pkg.c", "a"]
    (tmp_path / "pkg" / "c.py").write_text("import os\n")
    assert a_cycle(import_graph(modules_under(tmp_path))) is None
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg import b\n")
    assert a_cycle(import_graph(modules_under(tmp_path))) == ["pkg", "pkg.b", "pkg"]
