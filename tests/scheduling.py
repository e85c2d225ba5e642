"""Which pytest-xdist worker runs which tests, derived from the tests' marks (tests/conftest.py hands
it to xdist). Each test module runs whole on one worker, so its module fixtures are made once; the
modules that name one of the marks registered as `shared:` in pyproject.toml (a server or a folder
the tests of several modules use: `slurm`, `s3`, `repo`) share a worker, with every module that
names another mark one of them names. Those shared groups start first: their tests wait on a
server (Slurm's queue and its status checks, the S3 server's runs) more than they compute, and the
other worker's end-to-end runs fill the cores meanwhile (started later, the shared group's waits
left one core idle beside the other worker's single runs). Then the groups with the most `e2e`
tests, so that no worker is left alone with a long group at the end.

The groups are read from the modules' source (`pytest.mark.<name>` in them: their `pytestmark` and
their tests' decorators), not from collected items: xdist's scheduler, in the controller, sees node
ids only (xdist's own `--dist loadgroup` passed marks on in the node ids, which pytest 9.2 no longer
lets it change: pytest-xdist#1386).
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable
from functools import cache
from pathlib import Path

SHARED = "shared:"  # how a mark's description in pyproject.toml says that its tests share a worker


def shared_marks(registered: Iterable[str]) -> frozenset[str]:
    """The marks whose tests share a worker, from the registered ones (`name: description`)."""
    return frozenset(line.partition(":")[0].strip() for line in registered
                     if line.partition(":")[2].strip().startswith(SHARED))


def marks_named(path: Path) -> set[str]:
    """The marks a test module names anywhere: `pytest.mark.<name>` (or `mark.<name>`)."""
    def names_mark(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and "mark" in (getattr(node.value, "attr", None),
                                                              getattr(node.value, "id", None))

    return {node.attr for node in ast.walk(ast.parse(path.read_text())) if names_mark(node)}


@cache
def worker_groups(tests: Path, shared: frozenset[str]) -> dict[str, str]:
    """Each test module's group, by module name: its own name, or for modules that name shared
    marks, those marks joined with `+` over every module linked to it by one."""
    marked = {path.stem: marks_named(path) & shared for path in sorted(tests.glob("test_*.py"))}
    groups: list[tuple[set[str], set[str]]] = []  # (modules, marks), no mark in two
    for module, marks in marked.items():
        if marks:
            joined = [group for group in groups if group[1] & marks]
            groups = [group for group in groups if group not in joined]
            groups.append(({module}.union(*(g[0] for g in joined)), marks.union(*(g[1] for g in joined))))
    names = {module: module for module in marked}
    names.update({module: "+".join(sorted(marks)) for modules, marks in groups for module in modules})
    return names


def group_of(nodeid: str, root: Path, shared: frozenset[str]) -> str:
    """The worker group of the test `nodeid` (its path relative to `root`, pytest's rootdir)."""
    path = root / nodeid.split("::")[0]
    return worker_groups(path.parent, shared).get(path.stem, path.stem)


def run_order(groups: list[str], e2e: list[bool], shared: frozenset[str]) -> list[int]:
    """The order to run tests in, given each one's group and whether it is marked `e2e`: the groups
    of shared marks first (worker_groups names them by their marks), then the groups with the most
    e2e tests, each test's place within its group and among groups with as many kept (a stable sort)."""
    count = Counter(group for group, marked in zip(groups, e2e) if marked)
    waits = {group: set(group.split("+")) <= shared for group in groups}
    return sorted(range(len(groups)), key=lambda k: (not waits[groups[k]], -count[groups[k]]))
