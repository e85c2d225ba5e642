"""Digests of what decides a shard's contents: a change reruns the shards it affects, and gather
refuses a shard made under other settings. Tokenizer files have their own digest, so token ids
made ahead are kept while only the weights change."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import model_config
from shardinfer.engines import engine_of
from shardinfer.hf.tokenizer_files import is_tokenizer_side
from shardinfer.settings.config import Settings, plain
from shardinfer.tasks import task_class
from shardinfer.tasks.generate.params import lines_carry_parameters


def directory_fingerprint(path: str | None, recursive: bool = False) -> list:
    """Relative name, size and mtime of each file in a model or adapter directory: those directly in
    it (a Hugging Face folder is flat), or every file below it (`recursive`, for a custom task's
    model.path); or of the file itself, when model.path names one."""
    if path is None or not Path(path).exists():
        return []
    root = Path(path)
    if root.is_file():
        files = [root]
    elif recursive:
        files = [Path(folder, name) for folder, _, names in os.walk(root) for name in names]
    else:
        files = list(root.iterdir())
    return sorted((p.relative_to(root).as_posix() if p != root else p.name, p.stat().st_size, p.stat().st_mtime_ns)
                  for p in files if p.is_file())


def entrypoint_digest(entrypoint: str | None) -> str | None:
    """SHA-256 of a custom task's code file (a `.py` path, or the module's source file): editing it
    reruns the shards. Only that file: modules it imports are not read."""
    if not entrypoint:
        return None
    import importlib.util

    source = entrypoint.rpartition(":")[0]
    try:
        path = source if source.endswith(".py") else getattr(importlib.util.find_spec(source), "origin", None)
    except (ImportError, ValueError):
        path = None
    if not path or not Path(path).is_file():
        raise UserError(f"model.entrypoint `{entrypoint}`: no source file of `{source}` found to digest; "
                        "name a .py file or a module importable here")
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def output_digest(settings: Settings, model_files: tuple[list, list] | None = None) -> str:
    """A digest of everything that changes the predictions, model files included.

    Stored in each shard file and passed as a rule param: a change reruns the shards, and gather
    refuses a shard computed under other settings. `model_files`: the fingerprints of model.path and
    model.adapter as the main process read them, for a job whose node lacks them (no shared
    filesystem, `shardinfer.snakefile.stored_model`); read here otherwise.
    """
    if model_files is None:
        below = task_class(settings.model.task).model_files_below
        model_files = (directory_fingerprint(settings.model.path, recursive=below),
                       directory_fingerprint(settings.model.adapter))
    relevant = {
        "input": {"text_column": settings.input.text_column, "keep_columns": settings.input.keep_columns,
                  "null_text": settings.input.null_text, "columns": settings.input.columns},
        "model": plain(settings.model),
        "task_settings": settings.task_settings.to_dict(),  # the task's own section only (keys added later: when set)
        "model_files": model_files[0],
        "adapter_files": model_files[1],
        "code": entrypoint_digest(settings.model.entrypoint),
    }
    if settings.input.conversation_columns:  # absent otherwise: the digests of text prompts stay as they were
        relevant["input"]["conversation_columns"] = settings.input.conversation_columns
    if lines_carry_parameters(settings):  # each row's parameters come from its line (the input's content)
        relevant["input"]["format"] = settings.input.format
    if settings.input.image_columns:  # absent otherwise, likewise
        relevant["input"]["image_columns"] = settings.input.image_columns
    extra = engine_of(settings).identity(settings)  # e.g. the vLLM engine's version
    if extra:  # absent otherwise, so that the other tasks' digests stay as they were
        relevant["task"] = extra
    if settings.row_errors.record:  # an `error` column; absent with the default, digests unchanged
        relevant["row_errors"] = settings.row_errors.mode
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=list).encode()).hexdigest()[:16]


def tokenizer_facts(model_path: str, trust_remote_code: bool) -> dict:
    """What the tokenizer digest reads of model.path: its tokenizer files (by content; remote code
    too, when allowed), the config entries that pick its class, and the transformers and tokenizers
    versions."""
    from importlib.metadata import version

    folder = Path(model_path)
    files = sorted([p.name, hashlib.sha256(p.read_bytes()).hexdigest()] for p in folder.iterdir()
                   if p.is_file() and p.name != "config.json" and is_tokenizer_side(p.name, trust_remote_code))
    config = model_config(folder)  # the top level's: the composite model's own type, as before
    return {"files": files, "model_type": config.get("model_type"), "tokenizer_class": config.get("tokenizer_class"),
            "versions": [version("transformers"), version("tokenizers")]}


def tokenizer_digest(settings: Settings, facts: dict | None = None) -> str:
    """A digest of what decides the token ids: the tokenizer's `facts` (`tokenizer_facts`, read here
    unless given: the main process's, for a job without the folder), max_length and the text
    settings. Not the weights: token files made for one model are reused by another with the same
    tokenizer."""
    facts = facts or tokenizer_facts(settings.model.path, settings.model.trust_remote_code)
    relevant = {**facts, "max_length": settings.model.max_length,
                "trust_remote_code": settings.model.trust_remote_code, "text_column": settings.input.text_column,
                "null_text": settings.input.null_text}
    if settings.input.text_columns[1:]:  # a pair (task score): its second text decides the ids too
        relevant["text_columns"] = settings.input.text_columns
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]
