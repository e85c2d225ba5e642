"""The engines that run a task's rows, by name: one module each (`shardinfer.engines.base` is the
interface). A task names those that serve it (`Task.engines`, its default first) and
`<task>.engine` picks one; the schema's `engine` values and the docs' engine table follow this
registry (tests/test_engines.py, scripts/config_docs.py). Adding an engine is one module, one
line here, its name in the tasks' `engines` it serves, and its test.

A name is one class for every task it serves, or, where one library runs tasks of different kinds
by different means, a class per task: `vllm` is vLLM's generation engine for generate and its
pooling runner for the encoder tasks, `server` a server's completions for generate and its
embeddings for embed (`engine_class(name, task)`).

Engine modules import torch and their engine library inside their methods only: the Snakefile
reads an engine's devices, checks and identity without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from shardinfer.core.errors import UserError
from shardinfer.tasks import TASKS, task_class

VLLM_POOLING = "shardinfer.engines.vllm.pooling:VllmPooling"
ENGINES: dict[str, str | dict[str, str]] = {
    "transformers": "shardinfer.engines.transformers:Transformers",
    "vllm": {"generate": "shardinfer.engines.vllm.generate:VllmGenerate", "classify": VLLM_POOLING,
             "embed": VLLM_POOLING, "score": VLLM_POOLING, "token-classify": VLLM_POOLING},
    "server": {"generate": "shardinfer.engines.server.generate:ServerGenerate",
               "embed": "shardinfer.engines.server.embed:ServerEmbed"},
}


def _class_at(spec: str) -> type:
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


def engine_class(name: str, task: str) -> type:
    """The registered engine's class for `task` (its module imports no torch until it loads)."""
    spec = ENGINES[name]
    return _class_at(spec if isinstance(spec, str) else spec[task])


def engine_classes(name: str) -> dict[str, type]:
    """The engine's class for each task it serves (`serving`), for the docs and the checks."""
    return {task: engine_class(name, task) for task in serving(name)}


def engine_for(task: str, section: Mapping | None) -> type:
    """The engine that runs `task` with its config section: the one `<task>.engine` names, else the
    task's default. A name that is no engine, or one that does not serve the task, is refused in
    one line naming those that do."""
    served = task_class(task).engines
    name = (section or {}).get("engine") or served[0]
    if name not in ENGINES:
        raise UserError(f"{task}.engine {name!r} is not an engine; known: {', '.join(ENGINES)} (task {task} "
                        f"runs on {', '.join(served)})")
    if name not in served:
        raise UserError(f"{task}.engine {name!r} does not run task {task}; its engines: {', '.join(served)}")
    return engine_class(name, task)


def engine_of(settings) -> type:
    """The engine that runs the settings' task (`engine_for` its section)."""
    return engine_for(settings.model.task, settings.task_settings)


def engine_devices(config: dict) -> tuple[int, str]:
    """The devices one engine spans for a validated config (`Engine.devices`: the infer rule's
    GPUs), and the setting that says so (`Engine.devices_setting`), for messages."""
    task = config["model"]["task"]
    section = config.get(task) or {}
    engine = engine_for(task, section)
    return engine.devices(section), engine.devices_setting


def check_engine(settings) -> None:
    """The engine's refusals of the settings when the Snakefile loads, and those of the task's
    other engines whose settings are given but unused (`Engine.check_unused`)."""
    engine, task = engine_of(settings), settings.model.task
    engine.check_settings(settings)
    for name in task_class(task).engines:
        if name != engine.name:
            engine_class(name, task).check_unused(settings)


def serving(name: str) -> list[str]:
    """The tasks an engine serves (those whose `engines` name it), for the docs and messages."""
    return [task for task in TASKS if name in task_class(task).engines]
