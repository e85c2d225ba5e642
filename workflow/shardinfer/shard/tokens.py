"""Token ids: made inside the shard job (in a background thread), or ahead by the tokenize rule.

The tokenize rule writes one file per shard under results/tokens/<tokenizer digest>/ holding
each row's ids, unpadded, and whether the text was cut at max_length. Its metadata names the
plan, range and tokenizer it was made under; a shard job reading it checks all three, so token
ids from another plan or another tokenizer are refused rather than silently used. Its pages carry
checksums (`atomic_parquet_writer`), verified when it is read: ids damaged on disk are an error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.atomic import atomic_parquet_writer
from shardinfer.config import Settings
from shardinfer.errors import UserError
from shardinfer.plan import Plan, read_plan
from shardinfer.proof.shard_file import INDEX_COLUMN
from shardinfer.input.scan import text_values, windows

log = logging.getLogger(__name__)
TOKENS_KEY = b"shardinfer.tokens"  # token file metadata: plan, range and tokenizer


class Encoder:
    """Tokenizes without padding; finds the texts cut at max_length."""

    def __init__(self, tokenizer, max_length: int) -> None:
        special = tokenizer.num_special_tokens_to_add()  # config checks this at load where tokenizer.json is
        if max_length <= special:
            raise UserError(f"model.max_length {max_length} leaves no room for text: the tokenizer adds {special} "
                            f"special token(s) to every text; use at least {special + 1}")
        self.tokenizer = tokenizer
        self.max_length = max_length

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        """Each text's ids (special tokens included) and the positions of texts that were cut."""
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length, add_special_tokens=True)["input_ids"]
        at_limit = [i for i, row in enumerate(ids) if len(row) >= self.max_length]
        truncated = []
        if at_limit:
            # Counting the full length only: verbose=False keeps transformers' "Token indices sequence
            # length is longer than ... indexing errors" warning, false here, out of the shard log.
            full = self.tokenizer([texts[i] for i in at_limit], add_special_tokens=True, verbose=False)["input_ids"]
            truncated = [i for i, row in zip(at_limit, full) if len(row) > self.max_length]
        return ids, truncated


@dataclass(frozen=True)
class TokenWindow:
    first: int
    ids: list  # one sequence of ids per row
    truncated: list[int]  # window positions of texts cut at max_length


def tokenize_window(encoder: Encoder, first: int, table: pa.Table, null_as_empty: bool) -> TokenWindow:
    """A window's texts (its first column) as token ids: the one path both tokenize-in-job and the
    tokenize rule take, so their ids are the same."""
    return TokenWindow(first, *encoder.encode(text_values(table.column(0).combine_chunks(), null_as_empty)))


def token_identity(plan: Plan, shard: int, tokenizer_key: str) -> dict:
    start, end = plan.ranges[shard]
    return {"plan_id": plan.plan_id, "shard": shard, "start": start, "end": end, "tokenizer": tokenizer_key}


def tokens_schema(identity: dict) -> pa.Schema:
    fields = [pa.field(INDEX_COLUMN, pa.int64()), pa.field("input_ids", pa.list_(pa.int32())),
              pa.field("truncated", pa.bool_())]
    return pa.schema(fields, metadata={TOKENS_KEY: json.dumps(identity).encode()})


def tokens_table(window: TokenWindow, schema: pa.Schema) -> pa.Table:
    rows = len(window.ids)
    index = pa.array(np.arange(window.first, window.first + rows, dtype=np.int64))
    cut = np.zeros(rows, dtype=bool)
    cut[window.truncated] = True
    return pa.Table.from_arrays([index, pa.array(window.ids, type=pa.list_(pa.int32())), pa.array(cut)], schema=schema)


@dataclass(frozen=True)
class TokenizeJob:
    settings: Settings
    plan_path: str
    shard: int
    output: str
    tokenizer_key: str
    threads: int = 1


def run_tokenize(job: TokenizeJob) -> int:
    """The tokenize rule: the shard's rows into token ids, streamed window by window, atomically."""
    from shardinfer.shard.models import load_tokenizer

    plan = read_plan(job.plan_path)
    plan.check_input_unchanged()
    settings = job.settings
    os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))  # the fast tokenizer's thread pool
    encoder = Encoder(load_tokenizer(settings.model), settings.model.max_length)
    schema = tokens_schema(token_identity(plan, job.shard, job.tokenizer_key))
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


def check_token_file(path: str, expected: dict) -> None:
    """Refuse a token file made for another plan, shard or tokenizer, or holding other rows."""
    try:
        handle = pq.ParquetFile(path, page_checksum_verification=True)
        found = json.loads((handle.schema_arrow.metadata or {}).get(TOKENS_KEY, b"null"))
        rows = handle.metadata.num_rows
    except (OSError, pa.ArrowInvalid, ValueError) as error:
        raise UserError(f"token file `{path}` cannot be read ({error}); delete it and rerun") from error
    if found != expected:
        raise UserError(f"token file `{path}` was made for {found}, not {expected}; delete it and rerun")
    if rows != expected["end"] - expected["start"]:
        raise UserError(f"token file `{path}` holds {rows} rows, not the shard's {expected['end'] - expected['start']}; "
                        "delete it and rerun")


class TokenReader:
    """The tokenize rule's file read in step with the input: each call takes the next rows, so the
    token windows line up with whatever windows the shard job reads."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.batches = pq.ParquetFile(path, page_checksum_verification=True).iter_batches(batch_size=8192)
        self.pending = tokens_schema({}).remove_metadata().empty_table()

    def take(self, first: int, rows: int) -> TokenWindow:
        """Rows [first, first + rows) of the file; refused when the file holds other rows there."""
        while self.pending.num_rows < rows and (batch := next(self.batches, None)) is not None:
            self.pending = pa.concat_tables([self.pending, pa.Table.from_batches([batch]).cast(self.pending.schema)])
        table, self.pending = self.pending.slice(0, rows), self.pending.slice(rows)
        if table.num_rows != rows or table.column(INDEX_COLUMN)[0].as_py() != first:
            raise UserError(f"token file `{self.path}` does not line up with the input at row {first}; "
                            "delete it and rerun")
        ids = table.column("input_ids").combine_chunks()
        offsets, values = ids.offsets.to_numpy(), ids.values.to_numpy()
        truncated = np.flatnonzero(table.column("truncated").to_numpy(zero_copy_only=False)).tolist()
        return TokenWindow(first, [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])], truncated)
