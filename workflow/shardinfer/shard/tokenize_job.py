"""The tokenize rule's job (`tokenize.ahead`): a shard's rows into token ids on a CPU, streamed
window by window into a token file (`shardinfer.hf.tokens`: its schema, and the reader a shard job
checks it with), atomically, before the shard's GPU job starts. The ids are the shard job's own:
the task's encoder and `tokenize_window`, the one path both take.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

from shardinfer.core.atomic import atomic_parquet_writer
from shardinfer.hf.models import load_tokenizer
from shardinfer.hf.tokens import token_identity, tokenize_window, tokens_schema, tokens_table
from shardinfer.hf.transformers_import import hide_sklearn_from_transformers
from shardinfer.input.parts import windows
from shardinfer.plan.plan_file import read_plan
from shardinfer.settings.config import Settings
from shardinfer.tasks import task_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizeJob:
    settings: Settings
    plan_path: str
    shard: int
    output: str
    tokenizer_key: str
    threads: int = 1
    cut: str | None = None  # the shard's cut, read instead of the input without a shared filesystem (input.shard_cuts)


def run_tokenize(job: TokenizeJob) -> int:
    """The tokenize rule: the shard's rows into token ids, streamed window by window, atomically."""
    hide_sklearn_from_transformers()
    plan = read_plan(job.plan_path).for_shard(job.shard, job.cut)
    settings = job.settings
    os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))  # the fast tokenizer's thread pool
    # as the shard job's
    encoder = task_class(settings.model.task).encoder_for(load_tokenizer(settings.model), settings)
    schema = tokens_schema(token_identity(plan, job.shard, job.tokenizer_key), encoder.data)
    rows, tokens, truncated, started = 0, 0, 0, time.perf_counter()
    with atomic_parquet_writer(job.output, schema) as writer:
        text_only = dataclasses.replace(settings.input, keep_columns=())  # keep columns are the shard job's
        for first, table in windows(plan.shard_rows(text_only, job.shard), settings.batch.sort_window):
            window = tokenize_window(encoder, first, table, settings.input.null_text == "empty")
            writer.write_table(tokens_table(window, schema))
            rows, tokens = rows + len(window.ids), tokens + sum(map(len, window.ids))
            truncated += len(window.truncated)
    seconds = time.perf_counter() - started
    log.info("tokenized shard %d: %d rows, %d tokens (%d texts cut at max_length=%d) in %.1f s, %.0f tokens/s",
             job.shard, rows, tokens, truncated, settings.model.max_length, seconds, tokens / max(seconds, 1e-9))
    return rows
