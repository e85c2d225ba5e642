"""Settings parsed once from the validated config: frozen dataclasses that every rule's code
takes (and that travel to jobs as a params dict, `Settings.to_dict`/`from_dict`).

The Snakefile builds them with `settings_from_config` when it loads; `shardinfer.checks` then
checks them against the file system, so a bad value is reported before any job runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from shardinfer.auto_shards import AUTO
from shardinfer.errors import UserError
from shardinfer.input.discovery import resolve_input
from shardinfer.schema import defaults
from shardinfer.tasks import TASKS, task_class

PACKAGE_PREFIX = "pkg:"


@dataclass(frozen=True)
class InputSettings:
    path: str
    format: str
    text_column: str
    keep_columns: tuple[str, ...]
    null_text: str
    columns: tuple[str, ...] = ()  # task custom: the input columns handed to the user's code
    parts: tuple[str, ...] = ()  # the files `path` names, in row order (shardinfer.input.discovery); (): `path` itself
    # when the plan copies a part for its shards to read by range (shardinfer.input.staging)
    stage: str = field(default_factory=lambda: defaults("input")["stage"])
    delimiter: str | None = None  # CSV: the field separator (None: the format's own, `,` or a tab for .tsv)
    split: str | None = None  # a Hugging Face DatasetDict folder: the split to read (shardinfer.input.formats.hf_dataset)
    # What the task reads (`Task.inputs`, filled by settings_from_config): its columns in the order
    # it gets them, the config key naming each (for errors), and those that hold text (the plan
    # measures them for its cost; a null is allowed only as `null_text` says). Default: the text column.
    task_columns: tuple[str, ...] = ()
    column_keys: tuple[str, ...] = ()
    text_columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.task_columns:
            custom = bool(self.columns)
            object.__setattr__(self, "task_columns", self.columns or (self.text_column,))
            object.__setattr__(self, "column_keys", ("input.columns" if custom else "input.text_column",)
                               * len(self.task_columns))
            if self.text_columns is None:
                object.__setattr__(self, "text_columns", () if custom else (self.text_column,))
        object.__setattr__(self, "text_columns", tuple(self.text_columns or ()))

    @property
    def files(self) -> tuple[str, ...]:
        """The input's files in row order: its parts (one for a single file)."""
        return self.parts or (self.path,)

    @property
    def read_columns(self) -> list[str]:
        """Every column a shard reads, in order: the task's, then the keep columns."""
        return [*self.task_columns, *self.keep_columns]

    @classmethod
    def from_dict(cls, data: dict) -> InputSettings:
        tuples = ("keep_columns", "columns", "parts", "task_columns", "column_keys", "text_columns")
        return cls(**{**data, **{key: tuple(data[key]) for key in tuples if data.get(key) is not None}})


@dataclass(frozen=True)
class ModelSettings:
    path: str | None  # None only for a custom task that needs no model folder
    adapter: str | None
    task: str
    max_length: int
    dtype: str
    trust_remote_code: bool
    allow_pickle: bool
    labels: tuple[str, ...] | None = None  # names of the classifier's labels; None: the base config's or LABEL_i
    max_new_tokens: int | None = None  # generate: tokens to generate at most per row
    entrypoint: str | None = None  # custom: `file.py:function` or `module:function`
    options: dict = field(default_factory=dict)  # custom: handed to the user's code

    @classmethod
    def from_dict(cls, data: dict) -> ModelSettings:
        labels = data.get("labels")
        return cls(**{**data, "labels": None if labels is None else tuple(labels)})


@dataclass(frozen=True)
class BatchSettings:
    max_tokens: int | str  # or "auto": the shard job resolves it (shardinfer.batching.batch_budget)
    max_rows: int
    sort_window: int


@dataclass(frozen=True)
class EvaluateSettings:
    """`evaluate:`, which gather alone reads: the shard jobs never get it (rule_params.InputJobs), so
    changing it reruns gather and the report, not a shard."""

    label_column: str | None = None  # a keep column of gold values; None: nothing is scored


@dataclass(frozen=True)
class RowErrorSettings:
    """`row_errors:`: whether an exception while predicting rows fails the shard (`fail`) or is
    narrowed down to the failing rows and recorded in an `error` column (`record`), and how many
    rows may fail in a shard: a count (>= 1), or a fraction (< 1) of its rows."""

    mode: str = field(default_factory=lambda: defaults("row_errors")["mode"])
    max: float = field(default_factory=lambda: defaults("row_errors")["max"])

    @property
    def record(self) -> bool:
        return self.mode == "record"

    def cap(self, rows: int) -> int:
        """The most rows of a shard of `rows` rows that may fail."""
        return int(self.max) if self.max >= 1 else int(self.max * rows)


@dataclass(frozen=True)
class Settings:
    input: InputSettings
    model: ModelSettings
    batch: BatchSettings
    shards: int
    # token ids made by a CPU rule per shard, not inside the GPU job
    tokenize_ahead: bool = field(default_factory=lambda: defaults("tokenize")["ahead"])
    task_settings: dict = field(default_factory=dict)  # the config section named after the task (`embed:`)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    row_errors: RowErrorSettings = field(default_factory=RowErrorSettings)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Settings:
        return cls(
            input=InputSettings.from_dict(data["input"]),
            model=ModelSettings.from_dict(data["model"]),
            batch=BatchSettings(**data["batch"]),
            shards=int(data["shards"]),
            tokenize_ahead=bool(data["tokenize_ahead"]),
            task_settings=dict(data["task_settings"]),
            evaluate=EvaluateSettings(**(data.get("evaluate") or {})),
            row_errors=RowErrorSettings(**(data.get("row_errors") or {})),
        )


def job_settings(params: dict, config: dict) -> Settings:
    """A job's settings: its rule's `settings` param, which leaves out what cannot change an output
    (`rule_params.OUTPUT_NEUTRAL`: the batch section, read here from the job's config), so that a
    changed batch size reruns no finished shard (Snakemake reruns a job whose params changed)."""
    return Settings.from_dict({**params, "batch": config["batch"]})


def settings_by_input(config: dict, auto_shards: int | None = None,
                      listed: dict[str, list[str]] | None = None) -> dict[str | None, Settings]:
    """The settings of each input of a validated config, by name: `{None: ...}` for its one `input`,
    `{name: ...}` for each of its `inputs`, in the config's order. `auto_shards`: what `shards: auto`
    resolved to on this machine (`shardinfer.auto_shards`); `listed`: see `settings_from_config`."""
    if "inputs" not in config:
        return {None: settings_from_config(config, auto_shards=auto_shards, listed=listed)}
    return {name: settings_from_config(config, name, auto_shards, listed) for name in config["inputs"]}


def input_paths(config: dict) -> list[str]:
    """`input.path`, or each of the `inputs`' paths."""
    return [config["input"]["path"]] if "input" in config else [inp["path"] for inp in config["inputs"].values()]


def settings_from_config(config: dict, name: str | None = None, auto_shards: int | None = None,
                         listed: dict[str, list[str]] | None = None) -> Settings:
    """Build settings from a config that the schema has validated and filled with defaults: for its
    `input`, or for the input `name` of its `inputs` (with that input's own `shards`, if it has one).
    `auto_shards`: the count `shards: auto` stands for (None: `auto` is refused). `listed`: without a
    shared filesystem, the object names in the bucket under each input path (`discovery.listing_root`)."""
    inp, model = config["input"] if name is None else config["inputs"][name], config["model"]
    shards = inp.get("shards", config["shards"])
    if shards == AUTO:
        if auto_shards is None:
            raise UserError("config `shards: auto` needs this machine's count: resolve it first (shardinfer.auto_shards)")
        shards = auto_shards
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise UserError(f"config `shards` must be an integer >= 1 or `auto`; got {shards!r}")
    fmt, parts = resolve_input(inp["path"], inp["format"], inp["split"], None if listed is None else listed[inp["path"]])
    reads = task_class(model["task"]).inputs(inp, dict(config.get(model["task"]) or {})) if model["task"] in TASKS else None
    return Settings(
        input=InputSettings(
            path=inp["path"],
            format=fmt,
            parts=parts,
            text_column=inp["text_column"],
            keep_columns=tuple(inp["keep_columns"]),
            null_text=inp["null_text"],
            columns=tuple(inp.get("columns") or ()),
            stage=inp["stage"],
            delimiter=inp["delimiter"],
            split=inp["split"],
            task_columns=reads.columns if reads else (),
            column_keys=reads.keys if reads else (),
            text_columns=reads.texts if reads else None,
        ),
        model=ModelSettings(
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
        ),
        batch=BatchSettings(**config["batch"]),
        shards=shards,
        tokenize_ahead=config["tokenize"]["ahead"],
        task_settings=dict(config.get(model["task"]) or {}),
        evaluate=EvaluateSettings(**(config.get("evaluate") or {})),
        row_errors=row_error_settings(config.get("row_errors") or {}),
    )


def row_error_settings(section: dict) -> RowErrorSettings:
    """`row_errors:`; a cap of 1 or more is a count of rows, so it must be whole."""
    settings = RowErrorSettings(**section)
    if settings.max >= 1 and settings.max != int(settings.max):
        raise UserError(f"row_errors.max is a count of rows when 1 or more (a fraction of the shard's rows "
                        f"below 1); got {settings.max!r}")
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


