"""Settings parsed once from the validated config, and checks that need the file system.

The Snakefile calls `settings_from_config` and `check_settings` when it loads, so a bad value is
reported on the user's terminal before any job runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from shardinfer.errors import UserError
from shardinfer.labels import label_names
from shardinfer.tasks import TASKS, output_columns

PACKAGE_PREFIX = "pkg:"
INPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
INDEX_COLUMN = "index"
IDENTITY_KEY = b"shardinfer"  # shard file metadata: the plan, range and settings it was made under
STATS_KEY = b"shardinfer.stats"  # shard file metadata: rows, time, device, tokens


@dataclass(frozen=True)
class InputSettings:
    path: str
    format: str
    text_column: str
    keep_columns: tuple[str, ...]
    null_text: str

    @classmethod
    def from_dict(cls, data: dict) -> InputSettings:
        return cls(**{**data, "keep_columns": tuple(data["keep_columns"])})


@dataclass(frozen=True)
class ModelSettings:
    path: str
    adapter: str | None
    task: str
    max_length: int
    dtype: str
    trust_remote_code: bool
    allow_pickle: bool
    pooling: str
    normalize: bool
    labels: tuple[str, ...] | None = None  # names of the classifier's labels; None: the base config's or LABEL_i

    @classmethod
    def from_dict(cls, data: dict) -> ModelSettings:
        labels = data.get("labels")
        return cls(**{**data, "labels": None if labels is None else tuple(labels)})


@dataclass(frozen=True)
class BatchSettings:
    max_tokens: int
    max_rows: int
    sort_window: int


@dataclass(frozen=True)
class Settings:
    input: InputSettings
    model: ModelSettings
    batch: BatchSettings
    shards: int
    tokenize_ahead: bool = False  # token ids made by a CPU rule per shard, not inside the GPU job

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Settings:
        return cls(
            input=InputSettings.from_dict(data["input"]),
            model=ModelSettings.from_dict(data["model"]),
            batch=BatchSettings(**data["batch"]),
            shards=int(data["shards"]),
            tokenize_ahead=bool(data.get("tokenize_ahead", False)),
        )


def schema_errors(config: dict, schema_path: str) -> None:
    """Refuse a config the schema rejects, in one line naming the key, the value and what is allowed."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        key = ".".join(str(part) for part in error.absolute_path) or "(top level)"
        raise UserError(f"config `{key}`: {error.message}")


def settings_from_config(config: dict) -> Settings:
    """Build settings from a config that the schema has validated and filled with defaults."""
    inp, model, embed = config["input"], config["model"], config["embed"]
    shards = config["shards"]
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise UserError(f"config `shards` must be an integer >= 1; got {shards!r}")
    return Settings(
        input=InputSettings(
            path=inp["path"],
            format=detect_format(inp["path"]) if inp["format"] == "auto" else inp["format"],
            text_column=inp["text_column"],
            keep_columns=tuple(inp["keep_columns"]),
            null_text=inp["null_text"],
        ),
        model=ModelSettings(
            path=resolve_model_path(model["path"]),
            adapter=model["adapter"],
            task=model["task"],
            max_length=model["max_length"],
            dtype=model["dtype"],
            trust_remote_code=model["trust_remote_code"],
            allow_pickle=model["allow_pickle"],
            pooling=embed["pooling"],
            normalize=embed["normalize"],
            labels=None if model.get("labels") is None else tuple(model["labels"]),
        ),
        batch=BatchSettings(**config["batch"]),
        shards=shards,
        tokenize_ahead=config["tokenize"]["ahead"],
    )


def refuse_directory(path: str) -> None:
    """A folder of files (Spark's `table.parquet/` too) is not one table yet: say so, not "unknown type"."""
    if Path(path).is_dir():
        raise UserError(f"input.path `{path}` is a directory; give one file (.parquet, .csv or .jsonl): "
                        "inputs of several files are not supported yet")


def detect_format(path: str) -> str:
    """Infer the input format from the extension, looking through a trailing .gz."""
    refuse_directory(path)
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    fmt = INPUT_FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        allowed = ", ".join(sorted(INPUT_FORMATS))
        raise UserError(f"input `{path}`: unknown file type; allowed extensions: {allowed} (or set input.format)")
    return fmt


def resolve_model_path(path: str) -> str:
    """Turn `pkg:<package>/<subdir>` into the directory inside the installed package."""
    if not path.startswith(PACKAGE_PREFIX):
        return path
    package, _, subdir = path[len(PACKAGE_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"model.path `{path}`: Python package `{package}` is not installed")
    return str(Path(list(spec.submodule_search_locations)[0]) / subdir)


def check_settings(settings: Settings) -> None:
    """Checks that need the file system; each raises a one-line UserError."""
    inp, model = settings.input, settings.model
    refuse_directory(inp.path)
    if not Path(inp.path).is_file():
        raise UserError(f"input.path `{inp.path}` does not exist (or is not a file)")
    reserved = (INDEX_COLUMN, *output_columns(model.task))
    for column in inp.keep_columns:
        if column in reserved:
            raise UserError(f"input.keep_columns: `{column}` clashes with an output column ({', '.join(reserved)})")
    if len(set(inp.keep_columns)) != len(inp.keep_columns):
        raise UserError(f"input.keep_columns lists a column twice: {list(inp.keep_columns)}")
    if model.task not in TASKS:
        raise UserError(f"model.task must be one of {', '.join(TASKS)}; got {model.task!r}")
    if not (Path(model.path) / "config.json").is_file():
        raise UserError(f"model.path `{model.path}` is not a Hugging Face model directory (no config.json there)")
    check_max_length(model)
    if model.adapter is not None and not (Path(model.adapter) / "adapter_config.json").is_file():
        raise UserError(f"model.adapter `{model.adapter}` is not a PEFT adapter directory (no adapter_config.json there)")
    check_labels(model)


def check_max_length(model: ModelSettings) -> None:
    """max_length leaves room for at least one text token beside the tokenizer's special tokens (a
    shorter one fails inside the model and counts every text as cut) and is within the model's limit."""
    limit = model_length_limit(model.path)
    lowest = special_tokens(model.path) + 1
    if model.max_length < lowest:
        allowed = f"use {lowest}..{limit}" if limit else f"use at least {lowest}"
        raise UserError(f"model.max_length {model.max_length} leaves no room for text: the tokenizer adds "
                        f"{lowest - 1} special token(s) to every text; {allowed}")
    if limit is not None and model.max_length > limit:
        raise UserError(f"model.max_length {model.max_length} is above the model's limit of {limit} tokens; "
                        f"use {lowest}..{limit}")


def special_tokens(path: str) -> int:
    """Special tokens the tokenizer adds to one text ([CLS] and [SEP]: 2), read from its
    tokenizer.json's post-processor by the `tokenizers` library: tens of ms, no torch or
    transformers import. 0 without a tokenizer.json (the shard job checks those: tokens.Encoder)."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return 0
    from tokenizers import Tokenizer

    try:
        processor = Tokenizer.from_file(str(file)).post_processor
    except Exception as error:  # tokenizers raises a bare Exception on a malformed file
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"model.path `{path}`: cannot read its tokenizer.json ({reason})") from None
    return processor.num_special_tokens_to_add(False) if processor is not None else 0


def check_labels(model: ModelSettings) -> None:
    """`model.labels` names a classifier's labels, as many as its head has: checked before any job runs."""
    if model.labels is None:
        return
    if "label" not in output_columns(model.task):
        raise UserError(f"model.labels names the labels of task classify; task {model.task} has none, so leave it out")
    label_names(model.path, model.adapter, model.labels)


def model_length_limit(path: str) -> int | None:
    """The longest input the model takes: its tokenizer's model_max_length or its position table."""
    limits = []
    for name, key in (("tokenizer_config.json", "model_max_length"), ("config.json", "max_position_embeddings")):
        file = Path(path) / name
        value = json.loads(file.read_text()).get(key) if file.is_file() else None
        if isinstance(value, int) and 0 < value < 1_000_000:
            limits.append(value)
    return min(limits) if limits else None


def directory_fingerprint(path: str | None) -> list:
    """Name, size and mtime of each file directly in a model or adapter directory."""
    if path is None:
        return []
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in Path(path).iterdir() if p.is_file())


def output_digest(settings: Settings) -> str:
    """A digest of everything that changes the predictions, model files included.

    Stored in each shard file and passed as a rule param: a change reruns the shards, and gather
    refuses a shard computed under other settings.
    """
    relevant = {
        "input": {"text_column": settings.input.text_column, "keep_columns": settings.input.keep_columns,
                  "null_text": settings.input.null_text},
        "model": dataclasses.asdict(settings.model),
        "model_files": directory_fingerprint(settings.model.path),
        "adapter_files": directory_fingerprint(settings.model.adapter),
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=list).encode()).hexdigest()[:16]


VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model")  # one of these (or a *.tiktoken file) means a tokenizer is there
TOKENIZER_FILES = (*VOCABULARY_FILES, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "merges.txt")  # every file that can change the token ids


def is_vocabulary_file(path: Path) -> bool:
    return path.name in VOCABULARY_FILES or path.suffix == ".tiktoken"


def tokenizer_digest(settings: Settings) -> str:
    """A digest of what decides the token ids: the tokenizer's files (by content; remote code too,
    when allowed), the config entries that pick its class, the transformers and tokenizers
    versions, max_length and the text settings. Not the weights: token files made for one model
    are reused by another with the same tokenizer."""
    from importlib.metadata import version

    folder = Path(settings.model.path)
    code = settings.model.trust_remote_code
    files = sorted((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in folder.iterdir()
                   if p.is_file() and (p.name in TOKENIZER_FILES or is_vocabulary_file(p) or (code and p.suffix == ".py")))
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    relevant = {"files": files, "model_type": config.get("model_type"), "tokenizer_class": config.get("tokenizer_class"),
                "versions": [version("transformers"), version("tokenizers")], "max_length": settings.model.max_length,
                "trust_remote_code": settings.model.trust_remote_code, "text_column": settings.input.text_column,
                "null_text": settings.input.null_text}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]
