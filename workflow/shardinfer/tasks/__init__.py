"""The tasks a shard can run, by name: one module each (`shardinfer.tasks.base` is the interface).

Task modules import torch only inside their methods, so planning and the config checks can read
a task's output columns and kind without it. A task's settings live in the config section named
after it (`embed:`, `generate:`). Adding a task is one module plus one line here.
"""

from __future__ import annotations

import importlib

TASKS: dict[str, str] = {
    "classify": "shardinfer.tasks.classify:Classify",
    "embed": "shardinfer.tasks.embed:Embed",
    "generate": "shardinfer.tasks.generate.task:Generate",
    "score": "shardinfer.tasks.score:Score",
    "token-classify": "shardinfer.tasks.token_classify:TokenClassify",
    "custom": "shardinfer.tasks.custom:Custom",
}


# A task run on another engine (`<task>.engine`): a subclass of the task's class in a module of its own.
ENGINES: dict[str, dict[str, str]] = {
    "generate": {"vllm": "shardinfer.tasks.vllm.task:VllmGenerate"},
}


def _class_at(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def task_class(task: str) -> type:
    """The task's class (its module imports no torch until the task is loaded)."""
    return _class_at(TASKS[task])


def engine_class(settings) -> type:
    """The class that runs the settings' task: the task's own, or its subclass for the engine that
    the task's section names (`generate.engine: vllm`)."""
    return engine_class_of(settings.model.task, settings.task_settings)


def engine_class_of(task: str, section: dict) -> type:
    """`engine_class` from the task's name and its config section (before settings are built)."""
    spec = ENGINES.get(task, {}).get(section.get("engine"))
    return _class_at(spec) if spec else task_class(task)


def engine_devices(config: dict) -> tuple[int, str]:
    """The devices one engine spans for a validated config (`Task.devices`: the infer rule's GPUs),
    and the setting that says so (`Task.devices_setting`), for messages."""
    task = config["model"]["task"]
    section = config.get(task) or {}
    engine = engine_class_of(task, section)
    return engine.devices(section), engine.devices_setting


def output_columns(task: str) -> tuple[str, ...]:
    """The columns a built-in task adds to each row at its section's defaults (`Task.outputs`; the
    settings' own: `Task.output_fields`), for the docs' task table; custom: known once its code loads."""
    return tuple(task_class(task).outputs)


def may_write_files(task: str) -> bool:
    """Whether the task's outputs may include file columns (then each shard gets a files folder)."""
    return bool(getattr(task_class(task), "writes_files", False))


def task_totals(task: str | None) -> dict[str, str]:
    """The task's running totals (`Reporting.totals`) by what a rate of each is called, for gather's
    summary and the terminal; a summary that names no known task has none."""
    return dict(task_class(task).reporting.totals) if task in TASKS else {}


def counts_tokens(task: str | None) -> bool:
    """Whether the task's rows are texts measured in tokens (`Reporting.counts_tokens`), for the report and
    the terminal; a summary that names no known task (an older one) counts as text."""
    return task not in TASKS or task_class(task).reporting.counts_tokens
