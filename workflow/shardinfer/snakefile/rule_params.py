"""What the rules take of each input, computed once when the Snakefile loads.

A run has one input (`input:`) or several named ones (`inputs:`, e.g. a `val` and a `test` split
through the same model). Each input gets its own plan, shards and proven table; the model, batch
and task settings are the same for all. The Snakefile turns these values into rule params: the
values themselves for one input, a lookup by the `{name}` wildcard for several, so that no job
computes anything of them again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shardinfer.input.identity import gather_trigger, plan_trigger, storage_trigger
from shardinfer.settings.config import Settings
from shardinfer.snakefile.checks import check_inputs
from shardinfer.snakefile.configure import settings_by_input
from shardinfer.snakefile.settings_digest import output_digest, tokenizer_digest
from shardinfer.snakefile.stored_model import ModelFiles, hand_on, handed, with_handed_paths

# Sections of the settings that decide how fast rows are computed or how the table is laid out in
# files, never what comes out: not in the rules' params (a change would rerun every finished shard),
# the jobs read them from the config.
OUTPUT_NEUTRAL = ("batch", "output")


@dataclass(frozen=True)
class InputJobs:
    settings: Settings
    files: list[str]  # plan's input: input.path itself, or the parts of a directory or glob, in row order
    plan_input: dict  # plan's settings of the input, its parts included
    shards: int
    # The input's identity as params of plan and gather (docs/troubleshooting.md): a part
    # added, removed or renamed, or another size or mtime, older too, replans; another ctime or
    # inode reruns gather, which checks each part's content digest.
    version: dict
    identity: dict
    digest: str  # what decides the predictions (shardinfer.snakefile.settings_digest.output_digest)
    # infer's and gather's settings: without the list of parts, which they read from the plan, so
    # that thousands of parts are not stored again in every shard job's metadata, and without the
    # OUTPUT_NEUTRAL sections (`config.job_settings` puts them back).
    job_settings: dict
    # gather's `evaluate:` (shardinfer.scores.metrics), a param of gather alone: a change reruns gather, no shard.
    evaluate: dict

    @classmethod
    def of(cls, settings: Settings, storage: bool = False, model_files: tuple[list, list] | None = None) -> InputJobs:
        """`storage`: the input is in a storage provider's bucket (no shared filesystem), which this
        process cannot stat; Snakemake reruns the plan for a newer object, gather proves the content.
        `model_files`: the model's fingerprints as the main process read them (`output_digest`)."""
        job_settings = settings.to_dict()
        job_settings["input"]["parts"] = []
        evaluate = job_settings.pop("evaluate")
        for section in OUTPUT_NEUTRAL:
            del job_settings[section]
        return cls(
            settings=settings,
            files=list(settings.input.files),
            plan_input=settings.to_dict()["input"],
            shards=settings.shards,
            version=storage_trigger(settings.input.files) if storage else plan_trigger(settings.input.files),
            identity=storage_trigger(settings.input.files) if storage else gather_trigger(settings.input.files),
            digest=output_digest(settings, model_files),
            job_settings=job_settings,
            evaluate=evaluate,
        )


def jobs_by_input(config: dict, storage: bool = False, main_process: bool = True, auto_shards: int | None = None,
                  listed: dict[str, list[str]] | None = None) -> tuple[dict[str | None, InputJobs], ModelFiles | None]:
    """What the jobs of each input of a validated config take (`configure.settings_by_input`: its
    `auto_shards` and `listed`), checked against the file system once, by the main process; and
    without a shared filesystem (`storage`) the model's files (`shardinfer.snakefile.stored_model`): a job's
    node may lack the model, so the main process reads it, checks the inputs and hands on what the
    jobs take, and a job (`main_process` false) takes what it was handed."""
    job_model = storage and not main_process and handed()
    if job_model:
        config = with_handed_paths(config, job_model)
    by_name = settings_by_input(config, auto_shards, listed)
    if not job_model:
        check_inputs(by_name, storage)
    model = job_model or (hand_on(next(iter(by_name.values()))) if storage else None)
    fingerprints = model and (model.model, model.adapter)
    return {name: InputJobs.of(settings, storage, fingerprints) for name, settings in by_name.items()}, model


def tokenizer_key(inputs: dict[str | None, InputJobs], model: ModelFiles | None = None) -> str | None:
    """The token files' folder name when tokenizing ahead (None: not): one for every input
    (`shared_tokenizer_key`), from the tokenizer facts the main process handed on when there are
    (`model`, no shared filesystem)."""
    if not next(iter(inputs.values())).settings.tokenize_ahead:
        return None
    facts = model and model.tokenizer
    return shared_tokenizer_key([tokenizer_digest(jobs.settings, facts) for jobs in inputs.values()])


def shared_tokenizer_key(keys: list[str]) -> str:
    """One tokenizer key for every input's token files (their folder's name, a constant in the rules'
    patterns): the inputs' own key when they share it (the same text settings), else a digest of all."""
    distinct = sorted(set(keys))
    if len(distinct) == 1:
        return distinct[0]
    return hashlib.sha256(" ".join(distinct).encode()).hexdigest()[:16]
