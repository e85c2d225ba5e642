"""The settings of a validated config, built once when the Snakefile loads (and by a tokenize job,
from the config it is given): the input's format and parts resolved, the columns its task reads,
`shards: auto` as this machine resolved it, a `pkg:` model path inside its package.

`shardinfer.settings.config` holds the settings' dataclasses alone, so that the input and the tasks, which
this module asks, can import them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from shardinfer.core.errors import UserError
from shardinfer.input.discovery import OWN_FOLDERS, own_outputs_passed_over, resolve_input
from shardinfer.input.formats import format_named, options_in
from shardinfer.settings.config import (
    SIZE_UNITS,
    BatchSettings,
    EvaluateSettings,
    InputSettings,
    ModelSettings,
    OutputSettings,
    RowErrorSettings,
    Settings,
    parse_size,
)
from shardinfer.settings.sections import section_settings
from shardinfer.snakefile.auto_shards import AUTO
from shardinfer.tasks import TASKS, task_class
from shardinfer.tasks.base import TaskInputs

PACKAGE_PREFIX = "pkg:"


def settings_by_input(config: dict, auto_shards: int | None = None,
                      listed: dict[str, list[str]] | None = None) -> dict[str | None, Settings]:
    """The settings of each input of a validated config, by name: `{None: ...}` for its one `input`,
    `{name: ...}` for each of its `inputs`, in the config's order. `auto_shards`: what `shards: auto`
    resolved to on this machine (`shardinfer.snakefile.auto_shards`); `listed`: see `settings_from_config`."""
    if "inputs" not in config:
        return {None: settings_from_config(config, auto_shards=auto_shards, listed=listed)}
    return {name: settings_from_config(config, name, auto_shards, listed) for name in config["inputs"]}


def input_paths(config: dict) -> list[str]:
    """`input.path`, or each of the `inputs`' paths."""
    return [config["input"]["path"]] if "input" in config else [inp["path"] for inp in config["inputs"].values()]


def own_outputs_notes(config: dict, listed: dict[str, list[str]] | None = None) -> list[str]:
    """A line for each input path whose folder or glob also reaches the workflow's own files, which
    were passed over (`shardinfer.input.discovery`); `listed`: as for `settings_from_config`."""
    notes = []
    for path in dict.fromkeys(input_paths(config)):
        passed = own_outputs_passed_over(path, None if listed is None else listed[path])
        if passed:
            folders = ", ".join(f"{folder}/" for folder in OWN_FOLDERS)
            notes.append(f"shardinfer: input.path `{path}` also matches {len(passed)} file(s) in the workflow's own "
                         f"folders (first: {passed[0]}), passed over: nothing in {folders} is input")
    return notes


def settings_from_config(config: dict, name: str | None = None, auto_shards: int | None = None,
                         listed: dict[str, list[str]] | None = None) -> Settings:
    """Build settings from a config that the schema has validated and filled with defaults: for its
    `input`, or for the input `name` of its `inputs` (with that input's own `shards`, if it has one).
    `auto_shards`: the count `shards: auto` stands for (None: `auto` is refused). `listed`: without a
    shared filesystem, the object names in the bucket under each input path (`discovery.listing_root`)."""
    inp, model = config["input"] if name is None else config["inputs"][name], config["model"]
    shards = shard_count(inp.get("shards", config["shards"]), auto_shards)
    section, model = dict(config.get(model["task"]) or {}), model_settings(model)
    return Settings(
        input=input_settings(inp, model, section, None if listed is None else listed[inp["path"]]),
        model=model,
        batch=BatchSettings(**config["batch"]),
        shards=shards,
        tokenize_ahead=config["tokenize"]["ahead"],
        task_settings=section_settings(model.task, section),
        evaluate=EvaluateSettings(**(config.get("evaluate") or {})),
        row_errors=row_error_settings(config.get("row_errors") or {}),
        output=output_settings(config.get("output") or {}),
    )


def shard_count(shards, auto_shards: int | None) -> int:
    """`shards` as configured: an integer >= 1, or `auto` for `auto_shards` (None: refused)."""
    if shards == AUTO:
        if auto_shards is None:
            raise UserError("config `shards: auto` needs this machine's count: resolve it first "
                            "(shardinfer.snakefile.auto_shards)")
        shards = auto_shards
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise UserError(f"config `shards` must be an integer >= 1 or `auto`; got {shards!r}")
    return shards


def input_settings(inp: dict, model: ModelSettings, section: dict, names: list[str] | None) -> InputSettings:
    """An input's settings: its format and parts (`names`: the objects listed in a bucket, when the
    input lies there), its format's options (`options_in`: another format's are refused), the
    columns its task reads (`Task.inputs`, from the task's `section`) and what a row may ask
    (`Task.request_limits`, from `model` too)."""
    task = model.task
    fmt, parts = resolve_input(inp["path"], inp["format"], inp, names)
    reads = task_inputs(task, inp, section)
    return InputSettings(
        path=inp["path"],
        format=fmt,
        parts=parts,
        text_column=inp["text_column"],
        keep_columns=tuple(dict.fromkeys([*format_named(fmt).always_kept, *inp["keep_columns"]])),
        null_text=inp["null_text"],
        columns=tuple(inp.get("columns") or ()),
        stage=inp["stage"],
        options=options_in(inp, format_named(fmt)),
        task_columns=reads.columns if reads else (),
        column_keys=reads.keys if reads else (),
        text_columns=reads.texts if reads else None,
        conversation_columns=reads.conversations if reads else (),
        image_columns=reads.images if reads else (),
        request_limits=task_class(task).request_limits({**inp, "format": fmt}, model, section) if reads else {},
    )


def task_inputs(task: str, inp: dict, section: dict) -> TaskInputs | None:
    """The columns the task reads (`Task.inputs`; None for an unknown task, which the checks refuse);
    input.messages_column and input.image_column are refused for a task that reads none."""
    if task not in TASKS:
        return None
    fmt = format_named(inp["format"]) if inp.get("format", "auto") != "auto" else None
    if fmt is not None and fmt.tasks is not None and task not in fmt.tasks:
        raise UserError(f"input.format {fmt.name} is read by task {' and '.join(fmt.tasks)}; model.task is {task}")
    if inp.get("image_column") is not None and not task_class(task).reads_images:
        able = " and ".join(name for name in TASKS if task_class(name).reads_images)
        raise UserError(f"input.image_column is for task {able} (vision-language models); task {task} reads no "
                        "images, so leave input.image_column out (task custom: name it in input.columns)")
    if inp.get("messages_column") is not None and not task_class(task).reads_conversations:
        able = " and ".join(name for name in TASKS if task_class(name).reads_conversations)
        raise UserError(f"input.messages_column is for task {able}; task {task} reads input.text_column, so leave "
                        "input.messages_column out")
    return task_class(task).inputs(inp, section)


def model_settings(model: dict) -> ModelSettings:
    """`model:`, its `pkg:` path inside its package."""
    return ModelSettings(
        path=None if model["path"] is None else resolve_model_path(model["path"]),
        adapter=model["adapter"],
        task=model["task"],
        max_length=model["max_length"],
        dtype=model["dtype"],
        trust_remote_code=model["trust_remote_code"],
        allow_pickle=model["allow_pickle"],
        labels=None if model["labels"] is None else tuple(model["labels"]),
        max_new_tokens=model["max_new_tokens"],
        entrypoint=model["entrypoint"],
        options=dict(model["options"]),
    )


def row_error_settings(section: dict) -> RowErrorSettings:
    """`row_errors:`; a cap of 1 or more is a count of rows, so it must be whole."""
    settings = RowErrorSettings(**section)
    if settings.max >= 1 and settings.max != int(settings.max):
        raise UserError(f"row_errors.max is a count of rows when 1 or more (a fraction of the shard's rows "
                        f"below 1); got {settings.max!r}")
    return settings


def output_settings(section: dict) -> OutputSettings:
    """`output:`; its part size a size in bytes or with a unit."""
    settings = OutputSettings(**section)
    if parse_size(settings.part_size) is None:
        raise UserError(f"config `output.part_size`: {settings.part_size!r} is not a size; give bytes (an integer "
                        f">= 1) or a number with a unit: {', '.join(unit for unit in SIZE_UNITS if unit)} "
                        "(e.g. 512MB, 1.5GiB)")
    return settings


def resolve_model_path(path: str) -> str:
    """Turn `pkg:<package>/<subdir>` into the directory inside the installed package."""
    if not path.startswith(PACKAGE_PREFIX):
        return path
    package, _, subdir = path[len(PACKAGE_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"model.path `{path}`: Python package `{package}` is not installed")
    return str(Path(list(spec.submodule_search_locations)[0]) / subdir)


