"""Token ids: made inside the shard job (in a background thread), or ahead by the tokenize rule
(`shardinfer.shard.tokenize_job`), the same way.

A row is one text, or a pair of texts (task score) tokenized as one sequence. The tokenize rule
writes one file per shard under results/tokens/<tokenizer digest>/ holding each row's ids,
unpadded, whether the text was cut at max_length, and the token data the task declares beside
the ids (`TextTask.token_data`: token_type_ids for pairs). Its metadata names the
plan, range and tokenizer it was made under; a shard job reading it checks all three, so token
ids from another plan or another tokenizer are refused rather than silently used. Its pages carry
checksums (`atomic_parquet_writer`), verified when it is read: ids damaged on disk are an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardinfer.contract.shard_file import INDEX_COLUMN
from shardinfer.core.errors import UserError
from shardinfer.input.scan import text_values
from shardinfer.plan.plan_file import Plan

TOKENS_KEY = b"shardinfer.tokens"  # token file metadata: plan, range and tokenizer
# What a task may take from the tokenizer beside the ids (`TextTask.token_data`), by the argument that asks for it.
RETURNS = {"token_type_ids": "return_token_type_ids", "offset_mapping": "return_offsets_mapping",
           "special_tokens_mask": "return_special_tokens_mask"}


class Encoder:
    """Tokenizes texts, or text pairs, without padding; finds the rows cut at max_length. `data`:
    what the task takes from the tokenizer beside the ids (token_type_ids), per row."""

    def __init__(self, tokenizer, max_length: int, pair: bool = False, data: tuple[str, ...] = ()) -> None:
        # the config checks this at load where tokenizer.json is; a pair's special tokens are more
        special = tokenizer.num_special_tokens_to_add(pair=True) if pair else tokenizer.num_special_tokens_to_add()
        if max_length <= special:
            raise UserError(f"model.max_length {max_length} leaves no room for text: the tokenizer adds {special} "
                            f"special token(s) to every text{' pair' if pair else ''}; use at least {special + 1}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pair = pair
        self.data = data

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> tuple[list[list[int]], list[int], dict]:
        """Each row's ids (special tokens included), the positions of rows that were cut (a pair:
        longest first, so the longer text loses tokens first) and the token data per row."""
        columns = [texts] if pairs is None else [texts, pairs]
        asked = {RETURNS[name]: True for name in self.data}
        encoded = self.tokenizer(*columns, truncation="longest_first", max_length=self.max_length,
                                 add_special_tokens=True, **asked)
        ids = encoded["input_ids"]
        at_limit = [i for i, row in enumerate(ids) if len(row) >= self.max_length]
        truncated = []
        if at_limit:
            # Counting the full length only: verbose=False keeps transformers' "Token indices sequence
            # length is longer than ... indexing errors" warning, false here, out of the shard log.
            full = self.tokenizer(*([column[i] for i in at_limit] for column in columns), add_special_tokens=True,
                                  verbose=False)["input_ids"]
            truncated = [i for i, row in zip(at_limit, full) if len(row) > self.max_length]
        return ids, truncated, {name: encoded[name] for name in self.data}


@dataclass(frozen=True)
class TokenWindow:
    first: int
    ids: list  # one sequence of ids per row
    truncated: list[int]  # window positions of rows cut at max_length
    token_data: dict = field(default_factory=dict)  # name -> one sequence per row (token_type_ids), as the ids


def outside_vocabulary(ids: list[int], vocab_size: int | None, where: str = "position") -> str | None:
    """Why a row's ids cannot go to a model, or None: a token id it has no embedding for (a tokenizer
    that knows more tokens than the model's table: a padding row of an engine's table would be read
    silently). `where`: what a position is called in the message (a prompt's, for generate)."""
    if vocab_size is None or not ids or (0 <= min(ids) and max(ids) < vocab_size):
        return None
    position, token = next((k, t) for k, t in enumerate(ids) if not 0 <= t < vocab_size)
    return (f"token id {token} ({where} {position}) is outside the model's vocabulary (its config's vocab_size "
            f"{vocab_size}: ids 0..{vocab_size - 1}); the tokenizer knows tokens the model cannot embed")


def tokenize_window(encoder: Encoder, first: int, table: pa.Table, null_as_empty: bool) -> TokenWindow:
    """A window's texts (its first column; a pair: its first two) as token ids: the one path both
    tokenize-in-job and the tokenize rule take, so their ids are the same."""
    columns = [text_values(table.column(i).combine_chunks(), null_as_empty) for i in range(2 if encoder.pair else 1)]
    return TokenWindow(first, *encoder.encode(*columns))


def token_identity(plan: Plan, shard: int, tokenizer_key: str) -> dict:
    start, end = plan.ranges[shard]
    return {"plan_id": plan.plan_id, "shard": shard, "start": start, "end": end, "tokenizer": tokenizer_key}


def tokens_schema(identity: dict, data: tuple[str, ...] = ()) -> pa.Schema:
    """index, input_ids and truncated, then a column per name of the task's token data."""
    fields = [pa.field(INDEX_COLUMN, pa.int64()), pa.field("input_ids", pa.list_(pa.int32())),
              pa.field("truncated", pa.bool_()), *(pa.field(name, pa.list_(pa.int32())) for name in data)]
    return pa.schema(fields, metadata={TOKENS_KEY: json.dumps(identity).encode()})


def tokens_table(window: TokenWindow, schema: pa.Schema) -> pa.Table:
    rows = len(window.ids)
    index = pa.array(np.arange(window.first, window.first + rows, dtype=np.int64))
    cut = np.zeros(rows, dtype=bool)
    cut[window.truncated] = True
    data = [pa.array(window.token_data[name], type=pa.list_(pa.int32())) for name in schema.names[3:]]
    return pa.Table.from_arrays([index, pa.array(window.ids, type=pa.list_(pa.int32())), pa.array(cut), *data],
                                schema=schema)


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
        raise UserError(f"token file `{path}` holds {rows} rows, not the shard's "
                        f"{expected['end'] - expected['start']}; "
                        "delete it and rerun")


class TokenReader:
    """The tokenize rule's file read in step with the input: each call takes the next rows, so the
    token windows line up with whatever windows the shard job reads. `data`: the token data the
    task needs beside the ids; a file without it (made for another task) is refused."""

    def __init__(self, path: str, data: tuple[str, ...] = ()) -> None:
        self.path = path
        handle = pq.ParquetFile(path, page_checksum_verification=True)
        missing = [name for name in data if name not in handle.schema_arrow.names]
        if missing:
            raise UserError(f"token file `{path}` holds no {', '.join(missing)} (made for another task?); "
                            "delete it and rerun")
        self.data = data
        self.batches = handle.iter_batches(batch_size=8192, columns=tokens_schema({}, data).names)
        self.pending = tokens_schema({}, data).remove_metadata().empty_table()

    def take(self, first: int, rows: int) -> TokenWindow:
        """Rows [first, first + rows) of the file; refused when the file holds other rows there.
        Rows before `first` are passed over (a resumed shard's kept rows)."""
        self._pass_over(first)
        while self.pending.num_rows < rows and (batch := next(self.batches, None)) is not None:
            self.pending = pa.concat_tables([self.pending, pa.Table.from_batches([batch]).cast(self.pending.schema)])
        table, self.pending = self.pending.slice(0, rows), self.pending.slice(rows)
        if table.num_rows != rows or table.column(INDEX_COLUMN)[0].as_py() != first:
            raise UserError(f"token file `{self.path}` does not line up with the input at row {first}; "
                            "delete it and rerun")
        truncated = np.flatnonzero(table.column("truncated").to_numpy(zero_copy_only=False)).tolist()
        data = {name: list_rows(table.column(name)) for name in self.data}
        return TokenWindow(first, list_rows(table.column("input_ids")), truncated, data)


    def _pass_over(self, first: int) -> None:
        while True:
            if self.pending.num_rows == 0:
                batch = next(self.batches, None)
                if batch is None:
                    return
                self.pending = pa.Table.from_batches([batch]).cast(self.pending.schema)
            lead = first - self.pending.column(INDEX_COLUMN)[0].as_py()
            if lead <= 0:
                return
            self.pending = self.pending.slice(min(lead, self.pending.num_rows))


def list_rows(column: pa.ChunkedArray) -> list[np.ndarray]:
    """A list<int32> column as one array per row (views into its values, no copy)."""
    flat = column.combine_chunks()
    offsets, values = flat.offsets.to_numpy(), flat.values.to_numpy()
    return [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
