"""Checks of the settings against the file system, run when the Snakefile loads: each raises a
one-line UserError naming the bad value and what is allowed, before any job runs. What a task
needs is checked by the task (`Task.check_settings`); this module names no task."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from shardinfer.contract.shard_file import INDEX_COLUMN
from shardinfer.core.errors import UserError, words_list
from shardinfer.engines import check_engine
from shardinfer.input.discovery import missing_input
from shardinfer.input.shard_bound import check_shard_count
from shardinfer.output import chosen_writers
from shardinfer.settings.config import InputSettings, Settings
from shardinfer.settings.schema import BARE_WORDS, schema_at
from shardinfer.tasks import TASKS, may_write_files, task_class

INPUT_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a name of `inputs`: a folder under results/ and logs/


def schema_errors(config: dict, schema_path: str) -> None:
    """Refuse a config the schema rejects, in one line naming the key, the value and what is allowed."""
    import jsonschema

    schema = schema_at(schema_path)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        key = ".".join(str(part) for part in error.absolute_path) or "(top level)"
        message = error.message
        if error.validator in ("oneOf", "anyOf"):  # jsonschema says only "not valid under any of the given schemas"
            message = f"{error.instance!r} is not allowed; give " + " or ".join(map(allowed, error.validator_value))
        if isinstance(error.instance, bool) and wants_a_string(error):
            message += f" ({BARE_WORDS}: quote the word, e.g. 'yes')"
        raise UserError(f"config `{key}`: {message}")


def wants_a_string(error) -> bool:
    """Whether the value the schema refused had to be a string (or one of some strings)."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    alternatives = [schema, *(error.validator_value if error.validator in ("oneOf", "anyOf") else [])]
    for node in alternatives:
        types = node.get("type")
        if "string" in (types if isinstance(types, list) else [types]) or any(
                isinstance(value, str) for value in node.get("enum", [])):
            return True
    return False


def allowed(schema: dict) -> str:
    """What one alternative of a `oneOf` allows, in words: "an integer >= 1", "`auto`"."""
    if "const" in schema:
        return f"`{schema['const']}`"
    if "enum" in schema:
        return " or ".join(f"`{value}`" for value in schema["enum"])
    words = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false"}
    text = words.get(schema.get("type"), f"a value of type {schema.get('type')}")
    return text + (f" >= {schema['minimum']}" if "minimum" in schema else "")


def check_input_keys(config: dict) -> None:
    """`input` (one table) or `inputs` (named tables), exactly one; each name fit for a folder name.
    Checked before the schema, whose message for either would be a dump of the whole config."""
    given = [key for key in ("input", "inputs") if key in config]
    if not given:
        raise UserError("config needs `input` (one table) or `inputs` (named tables, e.g. val and test); "
                        "it has neither")
    if len(given) == 2:
        raise UserError("config has both `input` and `inputs`; give one: `input` for one table, `inputs` for "
                        "named tables (a --configfile is merged into config/config.yaml: add "
                        "--replace-workflow-config to use it alone)")
    names = config.get("inputs")
    for name in names if isinstance(names, dict) else ():
        if not isinstance(name, str) or not INPUT_NAME.fullmatch(name):
            raise UserError(f"config `inputs`: the name {name!r} is not allowed; a name holds letters, digits, "
                            "`_` and `-` only (it names the folders results/<name>/ and logs/<name>/)")


# The folders in the working directory that the workflow's rules write under: their outputs, logs and
# benchmarks (without a shared filesystem, the outputs are in the bucket; only what is local is checked).
WRITTEN_UNDER = ("results", "logs")


def written_folders(patterns: Iterable[str], names: Iterable[str | None]) -> list[str]:
    """The folders that the rules' products (`patterns`: outputs, logs and benchmarks, `{name}` filled
    with each input's name, None for the one `input`) are written into, and those between them and
    the working directory, top first, under WRITTEN_UNDER: where Snakemake makes, removes and
    renames files. A folder that is itself an output (results/staged) is in it when it exists."""
    folders = set(WRITTEN_UNDER)
    for pattern in patterns:
        for name in names:
            literal = (pattern if name is None else pattern.replace("{name}", name)).split("{", 1)[0]
            is_folder = literal.endswith("/") or os.path.isdir(literal)
            folder = literal.rstrip("/") if is_folder else os.path.dirname(literal)
            parts = Path(os.path.normpath(folder)).parts if folder else ()
            if parts[:1] and parts[0] in WRITTEN_UNDER:
                folders.update(os.path.join(*parts[:depth]) for depth in range(1, len(parts) + 1))
    return sorted(folders, key=lambda folder: (folder.count(os.sep), folder))


def check_writable(folders: Iterable[str] = WRITTEN_UNDER) -> None:
    """Each of the workflow's output folders that exists takes a new file, tried for real (a
    read-only mount refuses even root): else Snakemake fails at the first job with a traceback."""
    for folder in folders:
        if not Path(folder).is_dir():
            continue
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".shardinfer-write-check-"):
                pass
        except OSError as error:
            raise UserError(f"`{folder}/` is not writable ({error.strerror}): the workflow writes its plan, shards "
                            f"and predictions under results/ and its logs under logs/; make `{folder}/` writable, "
                            "or run from another folder") from None


def check_storage_inputs(config: dict) -> None:
    """Without a shared filesystem (a default storage provider), every input has the same number of
    shards, since the plan rule declares one cut per shard as its outputs (shardinfer.input.shard_cuts)."""
    inputs = {None: config["input"]} if "input" in config else config["inputs"]
    task = config["model"]["task"]
    if task in TASKS and may_write_files(task):
        others = ", ".join(name for name in TASKS if not may_write_files(name))
        raise UserError(f"task {task} may write files per row into a folder per shard (a directory() output), "
                        "which Snakemake reports missing in storage after a job uploaded it; without a shared "
                        f"filesystem run tasks that write no files ({others})")
    counts = {name: inp.get("shards", config["shards"]) for name, inp in inputs.items()}
    if len(set(map(str, counts.values()))) > 1:
        raise UserError(f"inputs have different `shards` ({counts}); without a shared filesystem give them one "
                        "count (the top-level `shards`)")


def check_inputs(by_name: dict[str | None, Settings], storage: bool = False) -> None:
    """`check_settings` for each input; an error in a named one says which (`inputs.test: ...`).
    `storage`: the input is in a storage provider's bucket, which this process does not see."""
    for name, settings in by_name.items():
        try:
            check_settings(settings, storage)
        except UserError as error:
            if name is None:
                raise
            raise UserError(f"inputs.{name}: {error}") from None
    check_same_writers(by_name, storage)


def check_same_writers(by_name: dict[str | None, Settings], storage: bool = False) -> None:
    """One set of files for every input (`output.writers`, or each input's defaults: an OpenAI batch
    file's output files), since the gather rule has one set of outputs."""
    writers = {name: [w.name for w in chosen_writers(s.output, s.input, storage)] for name, s in by_name.items()}
    first, *others = writers
    other = next((name for name in others if writers[name] != writers[first]), None)
    if other is not None:
        raise UserError(f"inputs.{first} gets the files of output writers {', '.join(writers[first])} and "
                        f"inputs.{other} those of {', '.join(writers[other])} (input.format "
                        f"{by_name[first].input.format} and {by_name[other].input.format}): gather writes one set of "
                        "files for every input; run them with two configs, or name output.writers")


def check_settings(settings: Settings, storage: bool = False) -> None:
    """Checks that need the file system; each raises a one-line UserError. `storage`: the input's
    files are objects in a storage provider's bucket, whose absence Snakemake reports itself."""
    inp, model = settings.input, settings.model
    if model.task not in TASKS:
        raise UserError(f"model.task must be one of {', '.join(TASKS)}; got {model.task!r}")
    for part in () if storage else inp.files:
        if not Path(part).is_file():
            raise missing_input(part)
    check_keep_columns(inp, (INDEX_COLUMN, *task_class(model.task).output_fields(settings)))
    check_evaluate(settings)
    chosen_writers(settings.output, inp, storage)  # each one refused where it cannot write this input or layout
    if not storage:  # reads the input's row count, which only the plan job sees in storage
        check_shard_count(inp, settings.shards)
    task_class(model.task).check_settings(settings)  # the task's own checks (`Task.check_settings`)
    check_engine(settings)  # its engine's (`Engine.check_settings`)


def check_evaluate(settings: Settings) -> None:
    """`evaluate.label_column`: for a task with a metric (`Reporting.scored_as`), and a keep column, which
    is how it reaches gather. Reads no file: the plan's scan checks that every keep column is in
    every part (a JSONL file's columns cost a pass over it, too much for every job's start)."""
    column, inp, task = settings.evaluate.label_column, settings.input, settings.model.task
    if column is None:
        return
    if task_class(task).reporting.scored_as is None:
        scored = [name for name in TASKS if task_class(name).reporting.scored_as]
        raise UserError(f"evaluate is for {words_list(scored)}; task {task} has no metric, so leave "
                        "evaluate.label_column out (or null)")
    if column not in inp.keep_columns:
        raise UserError(f"evaluate.label_column `{column}` must be one of input.keep_columns (the gold values "
                        f"reach gather in the shard files); add it there: keep_columns: "
                        f"[{', '.join([*inp.keep_columns, column])}]")


def check_keep_columns(inp: InputSettings, reserved: tuple[str, ...]) -> None:
    """Keep columns are copied beside the outputs: each once, and none named like an output column."""
    for column in inp.keep_columns:
        if column in reserved:
            raise UserError(f"input.keep_columns: `{column}` clashes with an output column ({', '.join(reserved)})")
    if len(set(inp.keep_columns)) != len(inp.keep_columns):
        raise UserError(f"input.keep_columns lists a column twice: {list(inp.keep_columns)}")
