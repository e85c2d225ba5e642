import json
import os
import re
import sys
import time
from pathlib import Path
from typing import NoReturn

from snakemake.logging import logger
from snakemake.utils import validate


def refuse(message) -> NoReturn:
    """Stop loading the workflow with `ERROR: <message>` as the one line on the terminal, exit 1.

    Snakemake prints an exception raised while a Snakefile loads with its class, file and line
    and a `File "..."` line per frame in a workflow file (snakemake/exceptions.py, format_error);
    SystemExit is no Exception, so it passes the `except Exception` that prints them (cli.py).
    """
    logger.error(f"ERROR: {message}")
    sys.exit(1)


def package_root() -> str:
    """The folder holding the shardinfer package, found from this file (not the main Snakefile
    or the working directory), so the workflow also loads as a module of a user's Snakefile.
    """
    here = workflow.current_basedir
    root = Path(here.get_path_or_uri(secret_free=True)).parent
    if not (root / "shardinfer" / "__init__.py").is_file():
        refuse(
            f"shardinfer is loaded from {here}, where its Python package is missing "
            "(Snakemake fetches the Snakefiles from a remote or git source, not the package); "
            "clone the repository and give `snakefile:` the clone's Snakefile path"
        )
    return str(root)


sys.path.insert(0, package_root())

from shardinfer.auto_shards import RESOLVED_VAR, resolve_auto_shards, uses_auto
from shardinfer.checks import (
    check_input_keys,
    check_inputs,
    check_storage_inputs,
    check_writable,
    schema_errors,
)
from shardinfer.configure import input_paths, settings_by_input
from shardinfer.input.bucket import bucket_listing
from shardinfer.settings_digest import tokenizer_digest
from shardinfer.errors import UserError
from shardinfer.rule_params import InputJobs, shared_tokenizer_key
from shardinfer.input.shard_bound import shard_count_note
from shardinfer.stored_model import HANDED_VAR, hand_on, handed, with_handed_paths
from shardinfer.tasks import may_write_files, task_class
from shardinfer.terminal import summary_lines

# Without a shared filesystem: a default storage provider (S3, ...) holds the input and every result,
# and each job sees only its declared files, downloaded (README, "Without a shared filesystem").
STORAGE = (
    getattr(workflow.storage_settings, "default_storage_provider", None) is not None
)
# The default storage prefix (s3://bucket/run) without its trailing `/`; "" on a shared filesystem.
STORAGE_PREFIX = (
    (workflow.storage_settings.default_storage_prefix or "").rstrip("/")
    if STORAGE
    else ""
)

# Threads of each shard job (rule infer) and token-writing job (rule tokenize) on a GPU machine or a
# cluster: feeding the GPU. `shards: auto` without a GPU splits the cores between shard jobs instead.
GPU_JOB_THREADS = 4


def resolve_auto(config):
    """What `shards: auto` stands for in this run (None: no input uses it), said once on the terminal."""
    if not uses_auto(config):
        return None
    resolved = resolve_auto_shards(workflow, GPU_JOB_THREADS)
    # Declared, so that executors without a shared environment (Kubernetes: a secret per run) hand
    # the main process's count to every job; a job that lacks it stops instead of planning another.
    workflow.register_envvars(RESOLVED_VAR)
    if workflow.is_main_process:
        logger.info(f"shardinfer: shards: auto -> {resolved.count} ({resolved.reason})")
    return resolved


def load_inputs(config):
    """Validate the config (filling defaults) and check it against the file system, once: what the
    jobs of each input take, by name (None for the one `input`), and what `shards: auto` resolved
    to (None: no input uses it). A bad value is refused in one line.
    """
    try:
        check_input_keys(config)
        schema_errors(config, workflow.source_path("../schemas/config.schema.yaml"))
        validate(config, "../schemas/config.schema.yaml")
        if STORAGE:
            check_storage_inputs(config)
        auto = resolve_auto(config)
        # Without a shared filesystem a job's node may lack the model: the main process reads it,
        # checks the inputs and hands on what the jobs take (shardinfer.stored_model).
        job_model = STORAGE and not workflow.is_main_process and handed()
        if job_model:
            config = with_handed_paths(config, job_model)
        by_name = settings_by_input(
            config, auto and auto.count, listed_in_bucket(config)
        )
        if not job_model:
            check_inputs(by_name, STORAGE)
        if workflow.is_main_process:
            check_writable()
        model = job_model or (
            hand_on(next(iter(by_name.values()))) if STORAGE else None
        )
        if STORAGE:
            workflow.register_envvars(HANDED_VAR)
        fingerprints = model and (model.model, model.adapter)
        inputs = {
            name: InputJobs.of(settings, STORAGE, fingerprints)
            for name, settings in by_name.items()
        }
    except UserError as error:
        refuse(error)
    note = shard_count_note(sum(run.shards for run in inputs.values()))
    if note and workflow.is_main_process:  # not again in each job of a cluster run
        logger.warning(note)
    return inputs, auto, model


def listed_in_bucket(config):
    """Without a shared filesystem, the objects under each input path in the bucket, among which
    its parts are picked (a folder or glob, as on disk); None on a shared filesystem. Each job lists
    again when it parses the Snakefile (one request per 1,000 objects); gather refuses a listing
    whose parts are not the plan's."""
    if not STORAGE:
        return None
    provider = workflow.storage_registry.default_storage_provider
    return bucket_listing(provider, STORAGE_PREFIX, input_paths(config))


# What the jobs of each input take (shardinfer.rule_params). One input (`input:`): INPUTS is {None: ...}
# and paths are as they always were (results/plan.json). Named inputs (`inputs:`): a `{name}`
# wildcard in every path (results/val/plan.json), by which the jobs' values are looked up.
INPUTS, AUTO, MODEL_FILES = load_inputs(config)
# The threads of rule infer's and rule tokenize's jobs.
INFER_THREADS = AUTO.threads if AUTO else GPU_JOB_THREADS
NAMED = None not in INPUTS
# The model, batch and task settings: the same for every input.
SETTINGS = next(iter(INPUTS.values())).settings
# Without a shared filesystem, the model's copies in storage that the jobs read, by rule input (rule
# stage_model puts them there): {"model": [...], "adapter": [...], "tokenizer": [...]}; else none.
MODEL_COPIES = (
    MODEL_FILES.staged(SETTINGS.model.trust_remote_code) if MODEL_FILES else {}
)
# What the infer and tokenize jobs read of the model as inputs, those copies (the tokenizer's
# alone for tokenize), or on a shared filesystem nothing, model.path itself. `ancient`: the key in
# their path names the files they hold, so a copy uploaded again (`--forcerun stage_model`) is the
# same model and reruns no shard.
INFER_MODEL = {
    key: ancient(MODEL_COPIES[key])
    for key in ("model", "adapter")
    if key in MODEL_COPIES
}
TOKENIZE_MODEL = {"model": ancient(MODEL_COPIES["tokenizer"])} if MODEL_COPIES else {}
# The cost a row adds in a batch beyond its tokens (generate: max_new_tokens), which the plan balances.
PLAN_OVERHEAD = task_class(SETTINGS.model.task).plan_overhead(SETTINGS)


def named_path(pattern):
    """A path of one input: `pattern` itself for the one `input`; for named inputs, with the input's
    name after its first folder (results/{name}/plan.json, logs/{name}/infer/{shard}.log).
    """
    if not NAMED:
        return pattern
    top, _, rest = pattern.partition("/")
    return f"{top}/{{name}}/{rest}"


def input_value(field):
    """A param or input of one input's jobs, an `InputJobs` field: the value itself for the one
    `input`, which Snakemake takes once for all jobs; for named inputs, a function of the job's
    `{name}` wildcard."""
    if not NAMED:
        return getattr(INPUTS[None], field)

    def of_named_input(wildcards):
        return getattr(INPUTS[wildcards.name], field)

    return of_named_input


def report_labels(labels):
    """A report item's labels; for named inputs, the input's name first (an item per input)."""
    return {"input": "{name}", **labels} if NAMED else labels


def every_input(patterns):
    """The paths of `patterns` (a rule's output) for every input, in the config's order."""
    patterns = [as_configured(pattern) for pattern in patterns]
    return expand(patterns, name=list(INPUTS)) if NAMED else patterns


def as_configured(pattern):
    """A rule's output path as its rule names it (`results/{name}/summary.json`). Without a shared
    filesystem Snakemake hands out the local copy's path, flagged with its object in storage, which
    expand() refuses; a plain path is mapped to storage again where it is used, as every path is.
    """
    stored = getattr(pattern, "flags", {}).get("storage_object")
    if stored is None:
        return pattern
    return stored.query.removeprefix(f"{STORAGE_PREFIX}/")


wildcard_constraints:
    shard=r"\d+",
    # The configured names only (no pattern holds {name} for the one `input`).
    name="|".join(re.escape(name) for name in INPUTS if name is not None),


SHARD_FILE = named_path("results/shards/{shard}.parquet")
# What the shard jobs read beside the plan. On a shared filesystem: the input's parts, and the plan's
# copies of those that cannot be read by range (input.stage; often none), a folder. Without one: each
# shard's own rows, cut by the plan (shardinfer.input.shard_cuts), and no folder (a bucket holds none).
STAGED_DIR = named_path("results/staged")
CUT_FILE = named_path("results/cuts/{shard}.parquet")
SHARD_READS = {"cut": CUT_FILE} if STORAGE else {"staged": STAGED_DIR}
# One count for every input without a shared filesystem (checks.check_storage_inputs).
PLAN_READS = (
    {
        "cuts": expand(
            CUT_FILE,
            shard=range(next(iter(INPUTS.values())).shards),
            allow_missing=True,
        )
    }
    if STORAGE
    else {"staged": directory(STAGED_DIR)}
)
# Gather proves the input by its content digest: without a shared filesystem, its downloaded parts.
GATHER_READS = {"parts": input_value("files")} if STORAGE else {"staged": STAGED_DIR}
GATHER_PART_NAMES = input_value("files") if STORAGE else []
# The gather job's outputs: the final table and its summary.
GATHERED = {
    "predictions": named_path("results/predictions.parquet"),
    "summary": named_path("results/summary.json"),
}


def outdated_outputs(wildcards):
    """The gather outputs of the job's input, which a plan or shard job removes before its work: a
    run that fails after it never leaves the previous run's table as if it were current.
    """
    name = wildcards.get("name")
    return [path.format(name=name) if NAMED else path for path in GATHERED.values()]


# A task that may write a file per row (custom) gets a folder per shard, declared as the infer
# job's output beside its table (README, "Your own model").
FILES_DIR = named_path("results/files/{shard}")
SHARD_FILES_OUTPUT = (
    {"files": directory(FILES_DIR)} if may_write_files(SETTINGS.model.task) else {}
)


def metrics_items():
    """The report items of `evaluate:` (shardinfer.metrics), among the outputs of report_items; none
    when it is off, else the scores' table, and for a task scored against labels the confusion matrix.
    """
    if SETTINGS.evaluate.label_column is None:
        return {}
    items = {
        "metrics": report(
            named_path("results/report/metrics.html"),
            caption="../report/metrics.rst",
            category="Evaluation",
            subcategory="Scores",
            labels=report_labels({"item": "scores against the gold labels"}),
        )
    }
    if task_class(SETTINGS.model.task).scored_as == "labels":
        items["confusion"] = report(
            named_path("results/report/confusion.png"),
            caption="../report/confusion.rst",
            category="Evaluation",
            subcategory="Scores",
            labels=report_labels({"item": "confusion matrix"}),
        )
    return items


METRICS_ITEMS = metrics_items()


def token_items():
    """The report's text-length figure, for a task whose rows are texts in tokens
    (`Task.counts_tokens`); none for the others (custom), whose costs are no text lengths.
    """
    if not task_class(SETTINGS.model.task).counts_tokens:
        return {}
    return {
        "token_lengths": report(
            named_path("results/report/token_lengths.png"),
            caption="../report/token_lengths.rst",
            category="Input",
            subcategory="Text lengths",
            labels=report_labels({"item": "text lengths in tokens"}),
        )
    }


TOKEN_ITEMS = token_items()
# One tokenizer key for all inputs (shardinfer.rule_params.shared_tokenizer_key): a constant in the pattern.
TOKENIZER_KEY = (
    shared_tokenizer_key(
        [
            tokenizer_digest(run.settings, MODEL_FILES and MODEL_FILES.tokenizer)
            for run in INPUTS.values()
        ]
    )
    if SETTINGS.tokenize_ahead
    else None
)
TOKENS_FILE = named_path(f"results/tokens/{TOKENIZER_KEY}/{{shard}}.parquet")
# The infer job's token file when tokenizing ahead: a pattern, not an input function, which
# Snakemake would call (and inspect) once per shard job.
TOKENS_INPUT = {"tokens": TOKENS_FILE} if SETTINGS.tokenize_ahead else {}


def shard_count(wildcards):
    """The planned shards of the job's input."""
    return INPUTS[wildcards.get("name")].shards


def shard_files(wildcards):
    """Every planned shard file of the gather job's input, in shard order."""
    return expand(SHARD_FILE, shard=range(shard_count(wildcards)), **wildcards)


def files_folders(wildcards):
    """Every planned shard's files folder, when the task may write files; nothing otherwise."""
    if not SHARD_FILES_OUTPUT:
        return []
    return expand(FILES_DIR, shard=range(shard_count(wildcards)), **wildcards)


STARTED = time.time()  # when this Snakemake run loaded the workflow


def print_run_summary(predictions, summary):
    """After a successful run, a few lines on the terminal for each input, from the summary gather
    wrote in this run; a summary from an earlier run (this run's target did not include that
    input's gather) is not shown. `predictions` and `summary`: the gather rule's patterns.
    """
    if STORAGE:
        # the rule's outputs name this process's local copies: the objects' own paths instead
        predictions, summary = GATHERED["predictions"], GATHERED["summary"]
    lines = []
    tables, summaries = every_input([predictions]), every_input([summary])
    for name, table, written in zip(INPUTS, tables, summaries):
        local = written_in_this_run(written)
        if local is None:
            continue
        logs = named_path("logs/infer/<shard>.log").format(name=name)
        with open(local) as handle:
            summary = json.load(handle)
        where = stored_at(table), stored_at(written)
        lines += summary_lines(summary, *where, logs, report=False, since=STARTED)
    if lines:
        lines.append("shardinfer: figures and tables: snakemake --report report.zip")
        logger.info("\n".join(lines))
