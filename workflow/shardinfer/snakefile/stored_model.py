"""The model without a shared filesystem: staged into storage once, downloaded by each job that reads it.

A job on a node of its own (Kubernetes, cloud batch, `--shared-fs-usage none`) sees only its declared
inputs, so model.path and model.adapter on the machine of the main Snakemake process mean nothing
there. The main process hands what it read of those folders (`ModelFiles`: each file's name, size
and mtime, and what decides the token ids) to the jobs in HANDED_VAR, as it hands `shards: auto` on;
its rule stage_model copies each file into results/model/<key>/ (the key: a digest of those
facts, so another model is another folder, never mixed with a stale file of the last one), and
Snakemake uploads them. Each shard job then has them as inputs, downloaded, and loads the model from
that folder (`with_staged`); each tokenize job gets the tokenizer's files alone, not the weights.
On a shared filesystem none of this runs: every job reads model.path itself. Torch-free.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from shardinfer.core.errors import UserError
from shardinfer.hf.tokenizer_files import is_tokenizer_side
from shardinfer.settings.config import Settings

HANDED_VAR = "SHARDINFER_MODEL_FILES"
STAGED_DIR = "results/model/{key}"


@dataclass(frozen=True)
class ModelFiles:
    """What the jobs' rules and digests take of the model's folders: `model` and `adapter` are
    directory fingerprints ([name, size, mtime_ns] per file, `settings_digest.directory_fingerprint`),
    `tokenizer` what the tokenizer digest reads of model.path (None: no token files are made ahead),
    `paths` model.path and model.adapter as the main process resolved them (a `pkg:` path to the
    package's folder there)."""

    model: list
    adapter: list
    tokenizer: dict | None
    paths: list

    @classmethod
    def of(cls, settings: Settings) -> ModelFiles:
        from shardinfer.snakefile.settings_digest import directory_fingerprint, tokenizer_facts

        model = settings.model
        tokenizer = tokenizer_facts(model.path, model.trust_remote_code) if settings.tokenize_ahead else None
        model_files, adapter_files = ([list(entry) for entry in directory_fingerprint(path)]  # as JSON has them
                                      for path in (model.path, model.adapter))
        return cls(model_files, adapter_files, tokenizer, [model.path, model.adapter])

    def key(self) -> str:
        """The staged folder's name: another model (or adapter), or the same files at another path,
        is another folder."""
        facts = json.dumps([self.paths, self.model, self.adapter], sort_keys=True)
        return hashlib.sha256(facts.encode()).hexdigest()[:16]

    def staged(self, trust_remote_code: bool = False) -> dict[str, list[str]]:
        """The staged copies by the rule input that takes them: `model` and `adapter` (infer) and
        `tokenizer` (tokenize: the tokenizer's files and config.json, no weights)."""
        folder = STAGED_DIR.format(key=self.key())
        names = [entry[0] for entry in self.model]
        copies = {
            "model": [f"{folder}/model/{name}" for name in names],
            "tokenizer": [f"{folder}/model/{name}" for name in names if is_tokenizer_side(name, trust_remote_code)],
        }
        if self.adapter:
            copies["adapter"] = [f"{folder}/adapter/{entry[0]}" for entry in self.adapter]
        return copies

    def sources(self, settings: Settings) -> list[str]:
        """The local files of model.path and model.adapter that stage_model copies, in the order of
        its outputs (`staged()`'s model then adapter)."""
        model = settings.model
        return [os.path.join(model.path, entry[0]) for entry in self.model] + [
            os.path.join(model.adapter, entry[0]) for entry in self.adapter]


def hand_on(settings: Settings, env: MutableMapping[str, str] = os.environ) -> ModelFiles:
    """The main process reads the folders and hands the facts on in HANDED_VAR (JSON in base64, so
    that no name or path needs quoting on the way)."""
    files = ModelFiles.of(settings)
    if not files.model:
        raise UserError(f"model.path `{settings.model.path}` has no files to send to storage")
    env[HANDED_VAR] = base64.b64encode(json.dumps(dataclasses.asdict(files)).encode()).decode()
    return files


def handed(env: Mapping[str, str] = os.environ) -> ModelFiles:
    """What a job, whose node may lack the folders, takes of the model: the main process's facts."""
    if HANDED_VAR not in env:
        raise UserError(f"{HANDED_VAR} is not set: without a shared filesystem a job takes the model's files "
                        "from the main Snakemake process, whose executor passes its environment on")
    return ModelFiles(**json.loads(base64.b64decode(env[HANDED_VAR])))


def with_handed_paths(config: dict, files: ModelFiles) -> dict:
    """The config with model.path and model.adapter as the main process resolved them: a job's node
    may lack a `pkg:` model's package, or hold it elsewhere, and the path enters the digests, which
    must be the main process's."""
    return {**config, "model": {**config["model"], "path": files.paths[0], "adapter": files.paths[1]}}


def stage(sources: list[str], copies: list[str]) -> None:
    """Each local file to its copy, which Snakemake then uploads. A copy, not a link: Snakemake
    touches a job's outputs, which through a link would change the model's own mtime, and so its
    fingerprint, and rerun every shard."""
    for source, copy in zip(sources, copies, strict=True):
        Path(copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)


def with_staged(settings: Settings, model: list[str] | None, adapter: list[str] | None = None) -> Settings:
    """The job's settings with model.path (and model.adapter) at its downloaded copies, when it has
    them as inputs (no shared filesystem); the settings as they are otherwise."""
    if not model:
        return settings
    staged = {"path": str(Path(model[0]).parent)}
    if adapter:
        staged["adapter"] = str(Path(adapter[0]).parent)
    return dataclasses.replace(settings, model=dataclasses.replace(settings.model, **staged))
