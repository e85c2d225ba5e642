import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from shardinfer.config import (
    check_settings,
    output_digest,
    schema_errors,
    settings_from_config,
    tokenizer_digest,
)
from shardinfer.errors import UserError


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
