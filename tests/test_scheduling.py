"""The pytest-xdist workers' groups and order, derived from the tests' marks (tests/scheduling.py)."""

import tomllib

from factory import REPO
from scheduling import group_of, run_order, shared_marks, worker_groups

REGISTERED = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]


def test_the_marks_registered_as_shared_are_the_servers_and_the_folder():
    assert shared_marks(REGISTERED) == {"slurm", "s3", "repo"}
    assert "e2e" in {line.partition(":")[0] for line in REGISTERED}
    assert shared_marks(["x: shared: a server", "y: not shared: a note", "z: shared"]) == {"x"}


def test_modules_that_name_a_shared_mark_share_a_group_with_every_module_linked_by_one(tmp_path):
    modules = {"test_a": "@pytest.mark.s3", "test_b": "pytestmark = [pytest.mark.slurm, pytest.mark.s3]",
               "test_c": "from pytest import mark\n@mark.repo", "test_d": "@pytest.mark.slurm\n@pytest.mark.e2e",
               "test_e": "@pytest.mark.e2e\n@pytest.mark.parametrize('x', [1])"}
    for name, marks in modules.items():
        (tmp_path / f"{name}.py").write_text(f"{marks}\ndef test_x(): pass\n")
    shared = frozenset({"slurm", "s3", "repo"})
    assert worker_groups(tmp_path, shared) == {"test_a": "s3+slurm", "test_b": "s3+slurm", "test_c": "repo",
                                               "test_d": "s3+slurm", "test_e": "test_e"}
    assert group_of(f"{tmp_path.name}/test_d.py::test_x[1]", tmp_path.parent, shared) == "s3+slurm"


def test_the_suites_own_groups():
    """The S3 server's bucket runs are test_storage's and test_slurm's, the repository folder
    test_module's and test_style's; every other module is a group of its own."""
    groups = worker_groups(REPO / "tests", shared_marks(REGISTERED))
    assert groups["test_storage"] == groups["test_slurm"] != groups["test_module"] == groups["test_style"]
    assert groups["test_workflow"] == "test_workflow"


def test_the_shared_groups_run_first_then_those_with_the_most_e2e_tests_and_the_rest_as_collected():
    groups = ["unit", "one", "many", "unit", "many", "s3+slurm", "many", "one", "none", "s3+slurm"]
    e2e = [False, True, True, False, True, True, False, False, False, False]
    order = run_order(groups, e2e, frozenset({"slurm", "s3", "repo"}))
    assert [groups[k] for k in order] == ["s3+slurm", "s3+slurm", "many", "many", "many", "one", "one", "unit",
                                          "unit", "none"]
    assert order[:5] == [5, 9, 2, 4, 6]  # a group's tests keep their order
