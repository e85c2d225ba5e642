"""The tasks a shard can run, by name: one module each (`shardinfer.tasks.base` is the interface).

Task modules import torch only inside their methods, so planning and the config checks can read
a task's output columns and kind without it. A task's settings live in the config section named
after it (`embed:`, `generate:`). Adding a task is one module plus one line here. What runs its
rows is an engine (`shardinfer.engines`, the room above): a task names those that serve it.
"""

from __future__ import annotations

import importlib

TASKS: dict[str, str] = {
    "classify": "shardinfer.tasks.classify:Classify",
    "embed": "shardinfer.tasks.embed:Embed",
    "generate": "shardinfer.tasks.generate.task:Generate",
    "score": "shardinfer.tasks.score:Score",
    "token-classify": "shardinfer.tasks.token_classify:TokenClassify",
    "seq2seq": "shardinfer.tasks.seq2seq:Seq2Seq",
    "custom": "shardinfer.tasks.custom:Custom",
}


def _class_at(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def task_class(task: str) -> type:
    """The task's class (its module imports no torch until the task is loaded)."""
    return _class_at(TASKS[task])


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
