"""Checks of the settings against the file system, run when the Snakefile loads: each raises a
one-line UserError naming the bad value and what is allowed, before any job runs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from shardinfer.config import InputSettings, ModelSettings, Settings
from shardinfer.errors import UserError
from shardinfer.tasks.labels import label_names
from shardinfer.input.discovery import missing_input
from shardinfer.input.shard_bound import check_shard_count
from shardinfer.proof.shard_file import INDEX_COLUMN
from shardinfer.tasks import TASKS, is_text_task, output_columns
from shardinfer.tasks.generate import names_a_generator
from shardinfer.tasks.generate_vllm import check_vllm_settings

INPUT_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a name of `inputs`: a folder under results/ and logs/


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


def check_inputs(by_name: dict[str | None, Settings]) -> None:
    """`check_settings` for each input; an error in a named one says which (`inputs.test: ...`)."""
    for name, settings in by_name.items():
        try:
            check_settings(settings)
        except UserError as error:
            if name is None:
                raise
            raise UserError(f"inputs.{name}: {error}") from None


def check_settings(settings: Settings) -> None:
    """Checks that need the file system; each raises a one-line UserError."""
    inp, model = settings.input, settings.model
    if model.task not in TASKS:
        raise UserError(f"model.task must be one of {', '.join(TASKS)}; got {model.task!r}")
    for part in inp.files:
        if not Path(part).is_file():
            raise missing_input(part)
    check_keep_columns(inp, (INDEX_COLUMN, *output_columns(model.task)))
    check_shard_count(inp, settings.shards)
    if is_text_task(model.task):
        check_text_task(settings)
    else:
        check_custom_task(settings)


def check_keep_columns(inp: InputSettings, reserved: tuple[str, ...]) -> None:
    """Keep columns are copied beside the outputs: each once, and none named like an output column."""
    for column in inp.keep_columns:
        if column in reserved:
            raise UserError(f"input.keep_columns: `{column}` clashes with an output column ({', '.join(reserved)})")
    if len(set(inp.keep_columns)) != len(inp.keep_columns):
        raise UserError(f"input.keep_columns lists a column twice: {list(inp.keep_columns)}")


def check_text_task(settings: Settings) -> None:
    """A Hugging Face model (and adapter) that can run the task over `input.text_column`."""
    inp, model = settings.input, settings.model
    if inp.columns:
        raise UserError(f"input.columns is for task custom; task {model.task} reads input.text_column "
                        f"(`{inp.text_column}`), so leave input.columns out")
    if model.path is None:
        raise UserError(f"model.path is required for task {model.task}: a Hugging Face model directory")
    if not (Path(model.path) / "config.json").is_file():
        raise UserError(f"model.path `{model.path}` is not a Hugging Face model directory (no config.json there)")
    check_max_length(model)
    if model.adapter is not None and not (Path(model.adapter) / "adapter_config.json").is_file():
        raise UserError(f"model.adapter `{model.adapter}` is not a PEFT adapter directory (no adapter_config.json there)")
    check_labels(model)
    if model.task == "generate":
        check_generate(settings)


def check_generate(settings: Settings) -> None:
    model = settings.model
    if model.max_new_tokens is None or model.max_new_tokens < 1:
        raise UserError(f"model.max_new_tokens must be an integer >= 1 for task generate (tokens to generate at "
                        f"most per row); got {model.max_new_tokens!r}")
    if settings.tokenize_ahead:
        raise UserError("tokenize.ahead is for classify and embed; task generate tokenizes its prompts in the "
                        "shard job (set tokenize.ahead: false)")
    named = json.loads((Path(model.path) / "config.json").read_text()).get("architectures") or []
    if not names_a_generator(named):
        raise UserError(f"model.path `{model.path}` holds {', '.join(named)}, not a causal language model "
                        "(…ForCausalLM) with a generation head; task generate needs one")
    limit = model_length_limit(model.path)
    if limit is not None and model.max_new_tokens >= limit:  # no max_length would help: say what would
        room = f"; use at most {limit - model.max_length} with max_length {model.max_length}" if model.max_length < limit else ""
        raise UserError(f"model.max_new_tokens {model.max_new_tokens} leaves no room for a prompt within the model's "
                        f"limit of {limit} positions{room}")
    if limit is not None and model.max_length + model.max_new_tokens > limit:
        raise UserError(f"model.max_length {model.max_length} + model.max_new_tokens {model.max_new_tokens} is above "
                        f"the model's limit of {limit} positions; lower max_length to {limit - model.max_new_tokens} "
                        f"or less, or max_new_tokens to {limit - model.max_length} or less")
    if settings.task_settings.get("engine") == "vllm":
        check_vllm_settings(model.path, model.adapter, settings.task_settings)


def check_custom_task(settings: Settings) -> None:
    """The user's code is named by the config (never by data) and exists; it reads `input.columns`."""
    inp, model = settings.input, settings.model
    if not inp.columns:
        raise UserError("input.columns is required for task custom: the input columns handed to your code, "
                        "e.g. [img, cond]")
    if len(set(inp.columns)) != len(inp.columns):
        raise UserError(f"input.columns lists a column twice: {list(inp.columns)}")
    for key, value in (("model.adapter", model.adapter), ("model.labels", model.labels),
                       ("model.max_new_tokens", model.max_new_tokens)):
        if value is not None:
            raise UserError(f"{key} is for the Hugging Face tasks; task custom hands model.path and "
                            "model.options to your code, so leave it out")
    if settings.tokenize_ahead:
        raise UserError("tokenize.ahead is for classify and embed; task custom has no tokenizer (set it to false)")
    if model.path is not None and not Path(model.path).exists():
        raise UserError(f"model.path `{model.path}` does not exist")
    check_entrypoint(model.entrypoint)


def check_entrypoint(entrypoint: str | None) -> None:
    """`path/to/file.py:function` (relative to the working directory) or `module:function`."""
    if not entrypoint:
        raise UserError("model.entrypoint is required for task custom: `hooks/file.py:build` or `module:build`")
    source, _, function = entrypoint.rpartition(":")
    if not source or not function.isidentifier():
        raise UserError(f"model.entrypoint `{entrypoint}` must be `file.py:function` or `module:function`")
    if source.endswith(".py"):
        if not Path(source).is_file():
            raise UserError(f"model.entrypoint `{entrypoint}`: file `{source}` does not exist "
                            "(paths are relative to the working directory)")
    elif importlib.util.find_spec(source.split(".")[0]) is None:
        raise UserError(f"model.entrypoint `{entrypoint}`: module `{source}` cannot be imported here")


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
    if model.task != "classify":
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


