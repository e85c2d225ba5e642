"""Settings parsed once from the validated config: frozen dataclasses that every rule's code
takes (and that travel to jobs as a params dict, `Settings.to_dict`/`from_dict`).

The Snakefile builds them with `shardinfer.snakefile.configure.settings_from_config` when it loads;
`shardinfer.snakefile.checks` then checks them against the file system, so a bad value is reported before
any job runs. This module reads no input and knows no task: every room imports it. A task's own
section is typed in `shardinfer.settings.sections`, which also says why a key added to a section, here as
there (`added`), travels only when set.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from shardinfer.settings.schema import defaults
from shardinfer.settings.sections import ADDED, TaskSettings, added, default_of, section_settings


def plain(settings) -> dict:
    """A settings dataclass as a dict (as `dataclasses.asdict`), without the fields added after the
    digests were pinned (metadata ADDED) that hold their default: the jobs' params and the shard
    digest of a config that does not set them stay as they were."""
    values = dataclasses.asdict(settings)
    return {spec.name: values[spec.name] for spec in dataclasses.fields(settings)
            if not (spec.metadata.get(ADDED) and getattr(settings, spec.name) == default_of(spec))}

# Format options that were once keys of `input` itself (`input.delimiter` for `input.csv.delimiter`,
# `input.split` for `input.hf_dataset.split`): still read, and in every input's rule params at their
# old place (null when unset), so that a config's params stay as they were (`InputSettings.to_dict`).
FLAT_OPTIONS = ("delimiter", "split")


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
    # The input's format's own settings as configured (`input.csv: {delimiter: ";"}` gives
    # {"delimiter": ";"}), unset ones left out; the format reads them as its options object
    # (`Format.options`), and refuses another format's when the Snakefile loads.
    options: dict = field(default_factory=dict)
    # What the task reads (`Task.inputs`, filled by `configure.settings_from_config`): its columns in
    # the order it gets them, the config key naming each (for errors), and those that hold text (the
    # plan measures them for its cost; a null is allowed only as `null_text` says). Default: the text column.
    task_columns: tuple[str, ...] = ()
    column_keys: tuple[str, ...] = ()
    text_columns: tuple[str, ...] | None = None
    # Those of the task's columns that hold a conversation per row (generate: input.messages_column).
    conversation_columns: tuple[str, ...] = field(default=(), metadata={ADDED: True})
    # Those holding images per row (generate: input.image_column; shardinfer.tasks.generate.images).
    image_columns: tuple[str, ...] = field(default=(), metadata={ADDED: True})
    # What a row may ask of the run, for a format whose rows carry their own request (openai_batch:
    # `Task.request_limits`, e.g. {max_tokens, vocab_size, engine}), checked as the plan reads each line.
    request_limits: dict = field(default_factory=dict, metadata={ADDED: True})

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

    def to_dict(self) -> dict:
        """The settings as rule params (`plain`: added fields only when set): the options' FLAT_OPTIONS
        in their old place, each null when unset, and any other option under `options`, only when one
        is set; so that an input's params are what they were before options had sections, whichever
        way the config spells them."""
        data = {}
        for key, value in plain(self).items():
            if key != "options":
                data[key] = value
                continue
            data.update({name: value.get(name) for name in FLAT_OPTIONS})
            if rest := {name: option for name, option in value.items() if name not in FLAT_OPTIONS}:
                data["options"] = rest
        return data

    @classmethod
    def from_dict(cls, data: dict) -> InputSettings:
        tuples = ("keep_columns", "columns", "parts", "task_columns", "column_keys", "text_columns",
                  "conversation_columns", "image_columns")
        flat = {name: data[name] for name in FLAT_OPTIONS if data.get(name) is not None}
        data = {key: value for key, value in data.items() if key not in FLAT_OPTIONS}
        return cls(**{**data, "options": {**data.get("options", {}), **flat},
                      **{key: tuple(data[key]) for key in tuples if data.get(key) is not None}})


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
    max_tokens: int | str  # or "auto": the shard job resolves it (shardinfer.hf.batching.batch_budget)
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


SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(value: int | str) -> int | None:
    """Bytes of a size as a config gives it (`512MB`, `1.5GiB`, `2 GB`, 1000000); None when it is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).upper() not in SIZE_UNITS:
        return None
    size = int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])
    return size if size >= 1 else None


@dataclass(frozen=True)
class OutputSettings:
    """`output:`: one file, or a folder of parts (`layout`), cut at about `part_size` by the shard jobs,
    and the files gather writes (`writers`, by name: `shardinfer.output`; None: the defaults).
    Where the values go, never what they are: not in the shard digest, and no rule param of a shard
    job (rule_params.OUTPUT_NEUTRAL), so a change reruns no finished shard."""

    layout: str = field(default_factory=lambda: defaults("output")["layout"])
    part_size: int | str = field(default_factory=lambda: defaults("output")["part_size"])
    writers: tuple[str, ...] | None = added("output", "writers")

    def __post_init__(self) -> None:
        if self.writers is not None:
            object.__setattr__(self, "writers", tuple(self.writers))

    @property
    def parts(self) -> bool:
        return self.layout == "parts"

    @property
    def part_bytes(self) -> int:
        """`part_size` in bytes (checked when the Snakefile loads: `configure.output_settings`)."""
        size = parse_size(self.part_size)
        if size is None:
            raise ValueError(f"output.part_size {self.part_size!r} is not a size")
        return size


@dataclass(frozen=True)
class Settings:
    input: InputSettings
    model: ModelSettings
    batch: BatchSettings
    shards: int
    # token ids made by a CPU rule per shard, not inside the GPU job
    tokenize_ahead: bool = field(default_factory=lambda: defaults("tokenize")["ahead"])
    # the config section named after the task (`embed:`), typed (`shardinfer.settings.sections`; a mapping given
    # here is typed by the task's section class)
    task_settings: TaskSettings = field(default_factory=dict)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    row_errors: RowErrorSettings = field(default_factory=RowErrorSettings)
    output: OutputSettings = field(default_factory=OutputSettings)

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_settings", section_settings(self.model.task, self.task_settings))

    def to_dict(self) -> dict:
        """What travels to jobs as params: the sections as dicts (`plain`; the task's as its mapping)."""
        return {"input": self.input.to_dict(), "model": plain(self.model), "batch": plain(self.batch),
                "shards": self.shards, "tokenize_ahead": self.tokenize_ahead,
                "task_settings": self.task_settings.to_dict(), "evaluate": plain(self.evaluate),
                "row_errors": plain(self.row_errors), "output": plain(self.output)}

    @classmethod
    def from_dict(cls, data: dict) -> Settings:
        return cls(
            input=InputSettings.from_dict(data["input"]),
            model=ModelSettings.from_dict(data["model"]),
            batch=BatchSettings(**data["batch"]),
            shards=int(data["shards"]),
            tokenize_ahead=bool(data["tokenize_ahead"]),
            task_settings=data["task_settings"],
            evaluate=EvaluateSettings(**(data.get("evaluate") or {})),
            row_errors=RowErrorSettings(**(data.get("row_errors") or {})),
            output=OutputSettings(**(data.get("output") or {})),
        )


def job_settings(params: dict, config: dict) -> Settings:
    """A job's settings: its rule's `settings` param, which leaves out what cannot change an output
    (`rule_params.OUTPUT_NEUTRAL`: the batch and output sections, read here from the job's config), so
    that a changed batch size or layout reruns no finished shard (Snakemake reruns a job whose params
    changed)."""
    return Settings.from_dict({**params, "batch": config["batch"], "output": config.get("output") or {}})
