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

from shardinfer.config import (
    check_settings,
    output_digest,
    schema_errors,
    settings_from_config,
    tokenizer_digest,
)
from shardinfer.errors import UserError
from shardinfer.identity import gather_trigger, plan_trigger
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
    return settings


SETTINGS = load_settings(config)
DIGEST = output_digest(SETTINGS)
# The input's identity as params of plan and gather (README, "When things go wrong"). Another
# size or mtime, older too, replans; another ctime or inode reruns gather, which checks the
# input's content digest.
INPUT_VERSION = plan_trigger(SETTINGS.input.path)
INPUT_IDENTITY = gather_trigger(SETTINGS.input.path)


wildcard_constraints:
    shard=r"\d+",


SHARD_FILE = "results/shards/{shard}.parquet"
TOKENIZER_KEY = tokenizer_digest(SETTINGS) if SETTINGS.tokenize_ahead else None
TOKENS_FILE = f"results/tokens/{TOKENIZER_KEY}/{{shard}}.parquet"


def shard_files(wildcards=None):
    """Every planned shard file, in shard order."""
    return expand(SHARD_FILE, shard=range(SETTINGS.shards))


def token_file(wildcards):
    """The tokenize rule's file for the shard when tokenizing ahead; nothing otherwise."""
    return TOKENS_FILE.format(shard=wildcards.shard) if SETTINGS.tokenize_ahead else []


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
