import json
import os
import sys
import time
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate


def package_root() -> str:
    """The folder holding the shardinfer package, found from this file (not the main Snakefile
    or the working directory), so the workflow also loads as a module of a user's Snakefile.
    """
    here = workflow.current_basedir
    root = Path(here.get_path_or_uri(secret_free=True)).parent
    if not (root / "shardinfer" / "__init__.py").is_file():
        raise WorkflowError(
            f"ERROR: shardinfer is loaded from {here}, where its Python package is missing "
            "(Snakemake fetches the Snakefiles from a remote or git source, not the package); "
            "clone the repository and give `snakefile:` the clone's Snakefile path"
        )
    return str(root)


sys.path.insert(0, package_root())

from shardinfer.checks import check_settings, schema_errors
from shardinfer.config import settings_from_config
from shardinfer.digests import output_digest, tokenizer_digest
from shardinfer.errors import UserError
from shardinfer.identity import gather_trigger, plan_trigger
from shardinfer.shardcount import shard_count_note
from shardinfer.tasks import may_write_files
from shardinfer.terminal import summary_lines


def load_settings(config):
    """Validate the config (filling defaults) and check it against the file system, once."""
    try:
        schema_errors(config, workflow.source_path("../schemas/config.schema.yaml"))
        validate(config, "../schemas/config.schema.yaml")
        settings = settings_from_config(config)
        check_settings(settings)
    except UserError as error:
        raise WorkflowError(f"ERROR: {error}") from None
    note = shard_count_note(settings.shards)
    if note and workflow.is_main_process:  # not again in each job of a cluster run
        logger.warning(note)
    return settings


SETTINGS = load_settings(config)
DIGEST = output_digest(SETTINGS)
# The input's files: input.path itself, or the parts of a directory or glob, in row order.
INPUT_FILES = list(SETTINGS.input.files)
# The input's identity as params of plan and gather (README, "When things go wrong"). A part
# added, removed or renamed, or another size or mtime, older too, replans; another ctime or
# inode reruns gather, which checks each part's content digest.
INPUT_VERSION = plan_trigger(SETTINGS.input.files)
INPUT_IDENTITY = gather_trigger(SETTINGS.input.files)
# The settings infer and gather jobs get as a param: without the list of parts, which they read
# from the plan, so that thousands of parts are not stored again in every shard job's metadata.
JOB_SETTINGS = SETTINGS.to_dict()
JOB_SETTINGS["input"]["parts"] = []


wildcard_constraints:
    shard=r"\d+",


SHARD_FILE = "results/shards/{shard}.parquet"
# A task that may write a file per row (custom) gets a folder per shard, declared as the infer
# job's output beside its table (README, "Your own model").
FILES_DIR = "results/files/{shard}"
SHARD_FILES_OUTPUT = (
    {"files": directory(FILES_DIR)} if may_write_files(SETTINGS.model.task) else {}
)
TOKENIZER_KEY = tokenizer_digest(SETTINGS) if SETTINGS.tokenize_ahead else None
TOKENS_FILE = f"results/tokens/{TOKENIZER_KEY}/{{shard}}.parquet"
# The infer job's token file when tokenizing ahead: a pattern, not an input function, which
# Snakemake would call (and inspect) once per shard job.
TOKENS_INPUT = {"tokens": TOKENS_FILE} if SETTINGS.tokenize_ahead else {}


def shard_files(wildcards=None):
    """Every planned shard file, in shard order."""
    return expand(SHARD_FILE, shard=range(SETTINGS.shards))


def files_folders(wildcards=None):
    """Every planned shard's files folder, when the task may write files; nothing otherwise."""
    if not SHARD_FILES_OUTPUT:
        return []
    return expand(FILES_DIR, shard=range(SETTINGS.shards))


STARTED = time.time()  # when this Snakemake run loaded the workflow


def print_run_summary(predictions, summary):
    """After a successful run, a few lines on the terminal from the summary gather wrote in this
    run; a summary from an earlier run (this run's target did not include gather) is not shown.
    """
    if not os.path.isfile(summary) or os.path.getmtime(summary) < STARTED:
        return
    with open(summary) as handle:
        lines = summary_lines(json.load(handle), predictions, summary)
    logger.info("\n".join(lines))
