"""The engine registry (`shardinfer.engines`) is the one list of engine names: every registered
engine runs some task and is in the schema's `engine` values and the docs' engine table; a task
names only registered engines; a name that is no engine, or an engine that does not run the task,
is refused in one line naming those that do, when the Snakefile loads (before any job)."""

from __future__ import annotations

import sys

import pytest

import config_docs as DOCS
import patience
from factory import REPO
from shardinfer.core.errors import UserError
from shardinfer.engines import ENGINES, engine_class, engine_classes, engine_devices, engine_for, serving
from shardinfer.engines.base import Engine
from shardinfer.engines.transformers import Transformers
from shardinfer.settings.schema import schema
from shardinfer.snakefile.checks import schema_errors
from shardinfer.tasks import TASKS, task_class

SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")


def engine_keys() -> dict[str, dict]:
    """Each task section of the schema that has an `engine` key: task -> that key's schema."""
    sections = schema()["properties"]
    return {task: sections[task]["properties"]["engine"] for task in TASKS
            if "engine" in sections.get(task, {}).get("properties", {})}


def test_every_registered_engine_is_an_engine_that_runs_some_task():
    for name, spec in ENGINES.items():
        assert serving(name), f"engine {name} runs no task: add it to a task's `engines`"
        if isinstance(spec, dict):  # a class per task: exactly the tasks that name it
            assert sorted(spec) == sorted(serving(name))
        for engine in engine_classes(name).values():
            assert issubclass(engine, Engine) and engine.name == name


def test_a_task_names_registered_engines_only_and_transformers_first():
    for task in TASKS:
        engines = task_class(task).engines
        assert engines and set(engines) <= set(ENGINES) and len(set(engines)) == len(engines)
        assert engines[0] == "transformers"


def test_the_schemas_engine_values_are_the_engines_that_run_the_task():
    """A task that may run on several engines has an `engine` key whose values are exactly its
    engines, its default first; every registered engine is among them."""
    keys = engine_keys()
    assert keys, "no task section has an engine key"
    for task, node in keys.items():
        assert node["enum"] == list(task_class(task).engines) and node["default"] == task_class(task).engines[0]
    several = {task for task in TASKS if len(task_class(task).engines) > 1}
    assert several <= set(keys), f"tasks with several engines but no {{task}}.engine key: {several - set(keys)}"
    assert {name for node in keys.values() for name in node["enum"]} | {"transformers"} == set(ENGINES)


def test_every_engine_is_in_the_docs_engine_table():
    table = DOCS.engine_table()
    assert [line.split("|")[1].strip() for line in table[2:]] == [f"`{name}`" for name in ENGINES]
    written = (REPO / "docs" / "tasks" / "index.md").read_text()
    assert all(line in written for line in table)


def test_the_default_engine_is_the_tasks_first():
    for task in TASKS:
        assert engine_for(task, {}) is engine_class(task_class(task).engines[0], task)
    assert engine_for("generate", {"engine": "vllm"}).name == "vllm"
    assert engine_for("embed", None) is Transformers


def test_an_unknown_engine_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(UserError) as refused:
        engine_for("generate", {"engine": "tgi"})
    assert str(refused.value) == ("generate.engine 'tgi' is not an engine; known: transformers, vllm, server (task "
                                  "generate runs on transformers, vllm, server)")
    with pytest.raises(UserError, match=r"^config `generate.engine`: 'tgi' is not one of \['transformers', 'vllm', "
                                        r"'server'\]$"):
        schema_errors({"input": {"path": "x"}, "model": {"task": "generate"}, "generate": {"engine": "tgi"}}, SCHEMA)


def test_an_engine_that_does_not_run_the_task_is_refused_in_one_line():
    with pytest.raises(UserError) as refused:
        engine_for("custom", {"engine": "vllm"})
    assert str(refused.value) == "custom.engine 'vllm' does not run task custom; its engines: transformers"
    with pytest.raises(UserError, match=r"^custom.engine 'vllm' does not run task custom; its engines: "
                                        r"transformers$"):
        engine_devices({"model": {"task": "custom"}, "custom": {"engine": "vllm"}})


def test_the_devices_one_engine_spans_come_from_the_engine():
    assert engine_devices({"model": {"task": "classify"}}) == (1, "")
    assert engine_devices({"model": {"task": "generate"}, "generate": {"engine": "transformers"}}) == (1, "")
    spans = engine_devices({"model": {"task": "generate"},
                            "generate": {"engine": "vllm", "vllm": {"tensor_parallel_size": 2}}})
    assert spans == (2, "generate.vllm.tensor_parallel_size x pipeline_parallel_size")


def test_the_engines_import_neither_torch_nor_their_library_when_the_snakefile_reads_them():
    code = ("import sys; from shardinfer.engines import ENGINES, engine_classes; "
            "[kind.devices({}) for name in ENGINES for kind in engine_classes(name).values()]; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    result = patience.run([sys.executable, "-c", code], cwd=REPO / "workflow")
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr[-3000:]
