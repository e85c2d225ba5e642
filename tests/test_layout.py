"""The package's rooms: the import graph has no cycle, and the stages that run without a GPU
(loading the Snakefile, planning, gathering) import no torch."""

import ast
import subprocess
import sys
from pathlib import Path

from factory import REPO

PACKAGE = REPO / "workflow" / "shardinfer"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:` (imports for type hints only, never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(path: Path) -> set[str]:
    """The package's modules that a module imports when it runs, at any depth of its code (lazy
    imports too; not those for type checkers only)."""
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shardinfer"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("shardinfer"))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


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


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 20  # the walk found the package
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_find_cycle_sees_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_planning_and_gathering_import_no_torch():
    code = ("import sys; import shardinfer.checks, shardinfer.plan, shardinfer.proof.gather, "
            "shardinfer.input.shard_bound, shardinfer.rule_params, shardinfer.report, shardinfer.terminal; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO / "workflow", capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_a_shard_job_loads_transformers_without_scikit_learn_and_the_users_code_still_can():
    """hf.transformers_import: about 1.3 s of CPU less per shard job; hidden only from transformers."""
    code = ("import sys; from shardinfer.hf.transformers_import import hide_sklearn_from_transformers; "
            "hide_sklearn_from_transformers(); import transformers.generation.candidate_generator as generator; "
            "from transformers import AutoModelForSequenceClassification; "
            "print('sklearn' in sys.modules, hasattr(generator, 'roc_curve')); "
            "import sklearn.metrics; print(sklearn.metrics.roc_curve.__name__)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO / "workflow", capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.split() == ["False", "False", "roc_curve"]
