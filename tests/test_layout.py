"""The package's rooms: one order, bottom to top, in which every import runs downwards (lazy imports
inside functions and imports for type checkers only included), no import cycle, and the stages that
run without a GPU (loading the Snakefile, planning, gathering) import no torch."""

import ast
import sys
from pathlib import Path

import patience
from factory import REPO

PACKAGE = REPO / "workflow" / "shardinfer"
# The rooms, bottom to top: a module may import its own room's modules and those of the rooms below.
# Each is named by its modules and folders (relative to the package); every module is in one room.
ROOMS = (
    ("base", ("errors", "schema", "sections", "config", "atomic", "jobs", "devices", "auto_shards", "model_folder")),
    ("the shard-file contract", ("contract",)),
    ("input", ("input",)),
    ("the plan", ("balance", "plan")),
    ("what tasks need", ("batching", "hf")),
    ("tasks", ("tasks",)),
    ("shard jobs", ("shard",)),
    ("scores", ("metrics",)),
    ("the proof", ("proof",)),
    ("the Snakefile's helpers", ("configure", "checks", "settings_digest", "stored_model", "rule_params", "layout",
                                  "report_items", "incomplete")),
    ("what a user reads", ("report", "terminal")),
)


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


def room_of(module: str) -> int | None:
    """The room's place in ROOMS (0: the ground); None for a module in no room. The package's own
    `__init__` imports nothing and stands on the ground."""
    relative = module.removeprefix("shardinfer").removeprefix(".")
    if not relative:
        return 0
    for floor, (_, members) in enumerate(ROOMS):
        if any(relative == member or relative.startswith(f"{member}.") for member in members):
            return floor
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a room above the importer's, as `a (room) -> b (room)`."""
    return [f"{module} ({ROOMS[room_of(module)][0]}) -> {target} ({ROOMS[room_of(target)][0]})"
            for module, targets in sorted(graph.items()) for target in sorted(targets)
            if room_of(target) > room_of(module)]


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


def test_no_room_imports_a_room_above_it():
    assert upward_imports(import_graph()) == []


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_check_sees_an_import_up_whether_lazy_or_for_type_checkers_only(tmp_path):
    """A module of the base importing the report under TYPE_CHECKING, and the plan importing the
    proof inside a function, are both imports up."""
    package = tmp_path / "shardinfer"
    (package / "proof").mkdir(parents=True)
    for name in ("__init__", "report", "proof/__init__", "proof/gather"):
        (package / f"{name}.py").write_text("")
    (package / "config.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                        "    from shardinfer.report import write_report\n")
    (package / "plan.py").write_text("def run():\n    from shardinfer.proof import gather\n")
    graph = import_graph(package)
    assert graph["shardinfer.config"] == {"shardinfer.report"}
    assert graph["shardinfer.plan"] == {"shardinfer.proof.gather"}
    assert upward_imports(graph) == ["shardinfer.config (base) -> shardinfer.report (what a user reads)",
                                     "shardinfer.plan (the plan) -> shardinfer.proof.gather (the proof)"]


def test_find_cycle_sees_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_planning_and_gathering_import_no_torch():
    code = ("import sys; import shardinfer.checks, shardinfer.configure, shardinfer.layout, shardinfer.plan, "
            "shardinfer.proof.gather, shardinfer.input.shard_bound, shardinfer.rule_params, shardinfer.report, "
            "shardinfer.terminal; print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
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
