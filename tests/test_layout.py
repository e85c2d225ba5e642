"""The package's rooms: one order, bottom to top, in which every import runs downwards (lazy imports
inside functions and imports for type checkers only included), no import cycle, and the stages that
run without a GPU (loading the Snakefile, planning, gathering) import no torch."""

import ast
import sys
from pathlib import Path

import patience
from factory import REPO

PACKAGE = REPO / "workflow" / "shardinfer"


def rooms_of(package: Path = PACKAGE) -> tuple[str, ...]:
    """The rooms, bottom to top, as the package declares them (`shardinfer.ROOMS`): one folder each.
    Read from the source, so a test of a made-up package can declare its own."""
    tree = ast.parse((package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["ROOMS"]:
            return tuple(ast.literal_eval(node.value))
    return ()


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules (among `modules`) that a module imports, at any depth of its code: lazy
    imports and those under `if TYPE_CHECKING:` too. `from a.b import c` counts module a.b.c where
    there is one, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shardinfer"):
            named = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= named or {node.module}
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("shardinfer"))
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    paths = {module_name(path, package): path for path in package.rglob("*.py")}
    modules = set(paths)
    return {name: {m for m in imports_of(path, modules) if m in modules and m != name} for name, path in paths.items()}


def room_of(module: str, rooms: tuple[str, ...] | None = None) -> int | None:
    """The room's place among the rooms (0: the ground): the folder the module lies in; None for a
    module in no room's folder. The package's own `__init__` imports nothing and stands on the ground."""
    rooms = rooms_of() if rooms is None else rooms
    relative = module.removeprefix("shardinfer").removeprefix(".")
    if not relative:
        return 0
    folder = relative.split(".")[0]
    return rooms.index(folder) if folder in rooms else None


def upward_imports(graph: dict[str, set[str]], rooms: tuple[str, ...] | None = None) -> list[str]:
    """Every import of a room above the importer's, as `a (room) -> b (room)`."""
    rooms = rooms_of() if rooms is None else rooms
    return [f"{module} ({rooms[room_of(module, rooms)]}) -> {target} ({rooms[room_of(target, rooms)]})"
            for module, targets in sorted(graph.items()) for target in sorted(targets)
            if room_of(target, rooms) > room_of(module, rooms)]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return trail[trail.index(nxt):] + [node, nxt] if nxt in trail else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, trail + [node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_every_module_is_in_a_room():
    graph = import_graph()
    assert len(graph) > 40  # the walk found the package
    assert [module for module in sorted(graph) if room_of(module) is None] == []


def test_the_rooms_are_the_packages_folders_each_saying_what_it_holds():
    """No module lies loose in the package's root, every folder is a declared room, and each room's
    `__init__` has a docstring (the architecture page lists it)."""
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert sorted(rooms_of()) == folders
    assert [p.name for p in PACKAGE.glob("*.py")] == ["__init__.py"]
    undescribed = [room for room in rooms_of()
                   if not ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))]
    assert undescribed == []


def test_no_room_imports_a_room_above_it():
    assert upward_imports(import_graph()) == []


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_check_sees_an_import_up_whether_lazy_or_for_type_checkers_only(tmp_path):
    """A module of the settings importing the report under TYPE_CHECKING, and the plan importing the
    proof inside a function, are both imports up."""
    package = tmp_path / "shardinfer"
    rooms = ("settings", "plan", "proof", "report")
    for room in rooms:
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "__init__.py").write_text(f"ROOMS = {rooms!r}\n")
    (package / "report" / "items.py").write_text("")
    (package / "proof" / "gather.py").write_text("")
    (package / "settings" / "config.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                                    "    from shardinfer.report.items import write_report\n")
    (package / "plan" / "plan_file.py").write_text("def run():\n    from shardinfer.proof import gather\n")
    graph = import_graph(package)
    assert rooms_of(package) == rooms
    assert graph["shardinfer.settings.config"] == {"shardinfer.report.items"}
    assert graph["shardinfer.plan.plan_file"] == {"shardinfer.proof.gather"}
    assert upward_imports(graph, rooms) == [
        "shardinfer.plan.plan_file (plan) -> shardinfer.proof.gather (proof)",
        "shardinfer.settings.config (settings) -> shardinfer.report.items (report)"]


def test_find_cycle_sees_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_planning_and_gathering_import_no_torch():
    modules = ("snakefile.checks", "snakefile.configure", "snakefile.layout", "plan.plan_file", "proof.gather",
               "input.shard_bound", "snakefile.rule_params", "report.snakemake_report", "report.terminal")
    code = (f"import sys; import {', '.join(f'shardinfer.{m}' for m in modules)}; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    result = patience.run([sys.executable, "-c", code], cwd=REPO / "workflow")
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr[-3000:]


def test_a_shard_job_loads_transformers_without_scikit_learn_and_the_users_code_still_can():
    """hf.transformers_import: about 1.3 s of CPU less per shard job; hidden only from transformers."""
    code = ("import sys; from shardinfer.hf.transformers_import import hide_sklearn_from_transformers; "
            "hide_sklearn_from_transformers(); import transformers.generation.candidate_generator as generator; "
            "from transformers import AutoModelForSequenceClassification; "
            "print('sklearn' in sys.modules, hasattr(generator, 'roc_curve')); "
            "import sklearn.metrics; print(sklearn.metrics.roc_curve.__name__)")
    result = patience.run([sys.executable, "-c", code], cwd=REPO / "workflow")
    assert result.returncode == 0 and result.stdout.split() == ["False", "False", "roc_curve"], result.stderr[-3000:]


def test_no_module_is_long():
    """Files a reader takes in at once (nanoGPT's measure: about 350 lines); a module that grows past
    it wants splitting by concern."""
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 360}
    assert long == {}
