"""The tasks a shard can run, by name.

This module stays free of torch so that planning and config checks can name a task's output
columns; `load_task` imports the task's own module only in the inference job. Adding a task is
one module with a `Task` class plus one line here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskInfo:
    module: str
    columns: tuple[str, ...]


TASKS: dict[str, TaskInfo] = {
    "classify": TaskInfo("shardinfer.tasks.classify", ("label", "label_id", "probs")),
    "embed": TaskInfo("shardinfer.tasks.embed", ("embedding",)),
}


def output_columns(task: str) -> tuple[str, ...]:
    """The columns a task adds to each row, in output order."""
    return TASKS[task].columns


def load_task(task: str) -> type:
    """The task's class (imports torch and transformers)."""
    return importlib.import_module(TASKS[task].module).Task
