import json
import os
import re
import sys
import time
from pathlib import Path
from typing import NoReturn

from snakemake.logging import logger


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


def on_python_path(root):
    """The package for this process, and on PYTHONPATH for the processes it starts: the `script:`
    jobs import it from there. Every job parses the Snakefile again, so every executor's job has
    it, whatever environment the executor hands on."""
    sys.path.insert(0, root)
    paths = [
        path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path
    ]
    # Set for the jobs, not read from the user (which the `envvars:` directive is for).
    if root not in paths:
        os.environ.update(PYTHONPATH=os.pathsep.join([root, *paths]))


on_python_path(package_root())

from shardinfer.snakefile.auto_shards import (
    RESOLVED_VAR,
    check_gpus_given,
    missing_gpus,
    resolve_auto_shards,
    resource_value,
    uses_auto,
)
from shardinfer.snakefile.checks import (
    check_input_keys,
    check_storage_inputs,
    check_writable,
    schema_errors,
    written_folders,
)
from shardinfer.snakefile.configure import input_paths, own_outputs_notes
from shardinfer.core.errors import UserError
from shardinfer.settings.schema import fill_defaults
from shardinfer.snakefile.incomplete import settle
from shardinfer.input.bucket import bucket_listing, object_names
from shardinfer.input.shard_bound import shard_count_note
from shardinfer.proof.verify import damage
from shardinfer.snakefile.layout import Layout, fill
from shardinfer.snakefile.rule_params import jobs_by_input, tokenizer_key
from shardinfer.snakefile.stored_model import HANDED_VAR
from shardinfer.engines import engine_devices
from shardinfer.nodes.span import engine_nodes
from shardinfer.tasks import task_class
from shardinfer.report.terminal import summary_lines

# Without a shared filesystem: a default storage provider (S3, ...) holds the input and every result,
# and each job sees only its declared files, downloaded (docs/storage.md).
STORAGE = (
    getattr(workflow.storage_settings, "default_storage_provider", None) is not None
)
# The default storage prefix (s3://bucket/run) without its trailing `/`; "" on a shared filesystem.
STORAGE_PREFIX = (
    (workflow.storage_settings.default_storage_prefix or "").rstrip("/")
    if STORAGE
    else ""
)
SCHEMA = "../schemas/config.schema.yaml"

# Threads of each shard job (rule infer) and token-writing job (rule tokenize) on a GPU machine or a
# cluster: feeding the GPU (at least one per GPU of an engine that spans several). `shards: auto`
# without a GPU splits the cores between shard jobs instead.
GPU_JOB_THREADS = 4


def resolve_auto(config, per_engine):
    """What `shards: auto` stands for in this run (None: no input uses it), said once on the
    terminal: engines, each spanning `per_engine` devices."""
    if not uses_auto(config):
        return None
    threads = max(GPU_JOB_THREADS, per_engine)
    resolved = resolve_auto_shards(workflow, threads, per_engine=per_engine)
    # Declared, so that executors without a shared environment (Kubernetes: a secret per run) hand
    # the main process's count to every job; a job that lacks it stops instead of planning another.
    workflow.register_envvars(RESOLVED_VAR)
    if workflow.is_main_process:
        logger.info(f"shardinfer: shards: auto -> {resolved.count} ({resolved.reason})")
    return resolved


def load_inputs(config):
    """Validate the config (filling defaults) and check it against the file system, once: what the
    jobs of each input take, by name (None for the one `input`: shardinfer.snakefile.rule_params), what
    `shards: auto` resolved to (None: no input uses it), without a shared filesystem the model's
    files the main process read, the devices one engine spans (`Engine.devices`) and the machines
    (shardinfer.nodes.span). A bad value is refused in one line.
    """
    try:
        check_input_keys(config)
        schema = workflow.source_path(SCHEMA)
        schema_errors(config, schema)
        fill_defaults(config, schema)
        if STORAGE:
            check_storage_inputs(config)
        devices, setting = engine_devices(config)
        nodes = engine_nodes(config, devices, STORAGE)
        # Not again in each job, which is given its own resources.
        if workflow.is_main_process:
            gpus = resource_value(workflow.global_resources.get("gpu"))
            check_gpus_given(gpus, devices, setting)
        auto = resolve_auto(config, devices)
        listed = listed_in_bucket(config)
        inputs, model = jobs_by_input(
            config, STORAGE, workflow.is_main_process, auto and auto.count, listed
        )
        if STORAGE:
            # The model's files, handed on to the jobs (set by now: shardinfer.snakefile.stored_model).
            workflow.register_envvars(HANDED_VAR)
    except UserError as error:
        refuse(error)
    if workflow.is_main_process:  # not again in each job of a cluster run
        notes = own_outputs_notes(config, listed)
        notes.append(shard_count_note(sum(run.shards for run in inputs.values())))
        notes.append(missing_gpus(workflow))
        for note in filter(None, notes):
            logger.warning(note)
    return inputs, auto, model, devices, nodes


def before_any_job():
    """What the main process does once every rule is defined (the Snakefile calls it), before
    Snakemake builds the graph of jobs: the folders checked, an interrupted run's outputs settled.
    """
    if workflow.is_main_process:
        check_written_folders()
        settle_interrupted_run()


def settle_interrupted_run():
    """The outputs an interrupted run left marked incomplete (shardinfer.snakefile.incomplete): a shard file
    proven complete kept, anything else removed to run again, so that the same command resumes.
    On a shared filesystem with Snakemake's file persistence (its default) only."""
    backend = str(getattr(workflow.workflow_settings, "persistence_backend", "file"))
    if STORAGE or not backend.lower().endswith("file"):
        return
    settled = settle(LAYOUT)
    KEPT_FROM_INTERRUPTED.extend(settled.kept)
    for line in settled.lines:
        logger.info(line)


def record_kept_outputs():
    """Once the graph of jobs is built (onstart): the job of each output kept from an interrupted
    run recorded as finished, as Snakemake records a job it saw finish (its params, code, input),
    so that a later change of settings reruns it as any other."""
    kept = set(KEPT_FROM_INTERRUPTED)
    for job in workflow.dag.jobs if kept else ():
        if kept & {str(path) for path in job.output} and not workflow.dag.needrun(job):
            workflow.async_run(workflow.persistence.finished(job))


def check_written_folders():
    """Each existing folder that a rule writes an output, log or benchmark into takes a new file,
    else one line names it (a read-only results/shards/ is Snakemake's traceback at the first shard
    job otherwise).
    """
    products = [product for rule in workflow.rules for product in rule.products()]
    local = [
        str(p) for p in products if not getattr(p, "flags", {}).get("storage_object")
    ]
    try:
        check_writable(written_folders(local, INPUTS))
    except UserError as error:
        refuse(error)


def listed_in_bucket(config):
    """Without a shared filesystem, the objects under each input path in the bucket, among which
    its parts are picked (a folder or glob, as on disk); None on a shared filesystem. Each job lists
    again when it parses the Snakefile (one request per 1,000 objects); gather refuses a listing
    whose parts are not the plan's."""
    if not STORAGE:
        return None
    provider = workflow.storage_registry.default_storage_provider
    return bucket_listing(provider, STORAGE_PREFIX, input_paths(config))


# What the jobs of each input take (shardinfer.snakefile.rule_params), by name ({None: ...} for the one `input`),
# and the GPUs each shard job asks for: the devices one engine spans (generate.vllm's parallel sizes),
# on the machines it spans (generate.vllm.nnodes).
INPUTS, AUTO, MODEL_FILES, ENGINE_DEVICES, ENGINE_NODES = load_inputs(config)
# Every path of the run, and each rule's inputs and outputs that depend on it (shardinfer.snakefile.layout).
LAYOUT = Layout.of(INPUTS, STORAGE, STORAGE_PREFIX, tokenizer_key(INPUTS, MODEL_FILES))


def withdraw_damaged_folders():
    """On a shared filesystem, the parts layout's folders (whose files Snakemake does not know: the
    manifest is gather's output) checked against their manifests by names and sizes, by the main
    process before the run: a folder with a part deleted, renamed or cut loses its manifest, so that
    gather runs again and links what is missing; no shard reruns."""
    if STORAGE or "manifest" not in LAYOUT.gathered or not workflow.is_main_process:
        return
    folders = LAYOUT.every_input([LAYOUT.table])
    for folder, manifest in zip(
        folders, LAYOUT.every_input([LAYOUT.gathered["manifest"]])
    ):
        fault = damage(folder)
        if fault:
            os.remove(manifest)
            logger.warning(
                f"shardinfer: {fault}; its manifest is withdrawn: gather runs again"
            )


withdraw_damaged_folders()
# The threads of rule infer's and rule tokenize's jobs.
INFER_THREADS = AUTO.threads if AUTO else max(GPU_JOB_THREADS, ENGINE_DEVICES)
# The model, batch and task settings: the same for every input.
SETTINGS = next(iter(INPUTS.values())).settings
# Without a shared filesystem, the model's copies in storage that the jobs read, by rule input (rule
# stage_model puts them there): {"model": [...], "adapter": [...], "tokenizer": [...]}; else none.
MODEL_COPIES = (
    MODEL_FILES.staged(SETTINGS.model.trust_remote_code) if MODEL_FILES else {}
)
# The cost a row adds in a batch beyond its tokens (generate: max_new_tokens), which the plan balances.
PLAN_OVERHEAD = task_class(SETTINGS.model.task).cost.overhead(SETTINGS)
# The tokens an image adds to its row's cost (input.image_column); no param without images.
PLAN_IMAGE_PARAMS = task_class(SETTINGS.model.task).cost.image_params(SETTINGS)
STARTED = time.time()  # when this Snakemake run loaded the workflow
# The outputs an interrupted run finished that this run keeps (shardinfer.snakefile.incomplete), recorded at onstart.
KEPT_FROM_INTERRUPTED = []


wildcard_constraints:
    shard=r"\d+",
    # The configured names only (no pattern holds {name} for the one `input`).
    name="|".join(re.escape(name) for name in INPUTS if name is not None),


def model_copies(**copies):
    """What a job reads of the model as inputs, by input name: its copies in storage of each given
    kind (`tokenizer`: the tokenizer's files alone), or on a shared filesystem nothing, model.path
    itself. `ancient`: the key in their path names the files they hold, so a copy uploaded again
    (`--forcerun stage_model`) is the same model and reruns no shard."""
    return {
        name: ancient(MODEL_COPIES[kind])
        for name, kind in copies.items()
        if kind in MODEL_COPIES
    }


def outputs(paths):
    """A rule's outputs from the layout, those that are folders flagged as such."""
    return {
        key: directory(path) if key in LAYOUT.folders else path
        for key, path in paths.items()
    }


def optional_reports():
    """The report items this run's settings add (shardinfer.snakefile.report_items.OPTIONAL_REPORTS), as outputs."""
    return {
        item.name: report(
            item.path,
            caption=item.caption,
            category=item.category,
            subcategory=item.subcategory,
            labels=LAYOUT.report_labels(item.label),
        )
        for item in LAYOUT.report_items
    }


def every_input(patterns):
    """The paths of `patterns` (a rule's output) for every input, in the config's order."""
    return LAYOUT.every_input([as_configured(pattern) for pattern in patterns])


def as_configured(pattern):
    """A rule's output path as its rule names it (`results/{name}/summary.json`). Without a shared
    filesystem Snakemake hands out the local copy's path, flagged with its object in storage, which
    expand() refuses; a plain path is mapped to storage again where it is used, as every path is.
    """
    stored = getattr(pattern, "flags", {}).get("storage_object")
    return pattern if stored is None else LAYOUT.unstored(stored.query)


def print_run_summary():
    """After a successful run, a few lines on the terminal for each input, from the summary gather
    wrote in this run; a summary from an earlier run (this run's target did not include that
    input's gather) is not shown.
    """
    lines = []
    tables = LAYOUT.every_input([LAYOUT.written])
    summaries = LAYOUT.every_input([LAYOUT.gathered["summary"]])
    for name, table, written in zip(INPUTS, tables, summaries):
        local = written_in_this_run(written)
        if local is None:
            continue
        logs = LAYOUT.path("logs/infer/<shard>.log").format(name=name)
        with open(local) as handle:
            summary = json.load(handle)
        where = LAYOUT.stored_at(table), LAYOUT.stored_at(written)
        lines += summary_lines(summary, *where, logs, report=False, since=STARTED)
    if lines:
        lines.append("shardinfer: figures and tables: snakemake --report report.zip")
        logger.info("\n".join(lines))
