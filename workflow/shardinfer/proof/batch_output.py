"""The OpenAI batch output file, written by gather beside the table for an input of
`input.format: openai_batch` (`results/batch_output.jsonl`): one line per input line, in input
order, as the OpenAI Batch API writes them:

    {"id": "batch_req_<key>-<row>", "custom_id": ..., "error": null,
     "response": {"status_code": 200, "request_id": "req_<key>-<row>", "body": <chat.completion>}}

and for a row that failed (`row_errors.mode: record`) `"response": null` with `"error": {"code":
"row_error", "message": <why>}`. The body is a `chat.completion`: id `chatcmpl-<key>-<row>`,
`created` 0, `model` the line's body.model (else the model folder's name), a choice per completion
({index, message {role: assistant, content}, finish_reason: `stop` for eos and stop strings,
`length`; logprobs {content: [{token, bytes, logprob, top_logprobs}]} when the line asked}) and
usage {prompt_tokens, completion_tokens (over all choices), total_tokens}. Ids and `created` come
from what decides the output, not a clock or a random draw: `<key>` is a digest of the settings'
digest and the input's content (`request_key`), `<row>` the line's row; the same input and
settings give the same file, byte for byte, under any shard count.

It is written from the proven shards as their row groups pass the proof, in the same pass and
under the same rule as the table (`shardinfer.proof.gather.write_predictions`): any check that
fails leaves neither file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from shardinfer.contract.shard_file import ERROR_COLUMN, INDEX_COLUMN

OUTPUT_NAME = "batch_output"  # gather's output key; results/batch_output.jsonl
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def request_key(plan, digest: str) -> str:
    """What the output ids start with: the settings' digest and the input parts' content digests
    (not the plan id, which holds the shard ranges)."""
    body = json.dumps([digest, [part.digest for part in plan.parts]])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def token_entry(entry: dict) -> dict:
    """A token's {token, bytes, logprob}: bytes null for a token that is part of a character (its
    text is the replacement character, not its bytes)."""
    text = entry["token"]
    known = "\ufffd" not in text
    return {"token": text, "bytes": list(text.encode("utf-8")) if known else None, "logprob": entry["logprob"]}


def choice_logprobs(tokens: list[dict] | None) -> dict | None:
    """A choice's logprobs as OpenAI gives them (None: the line asked for none)."""
    if tokens is None:
        return None
    return {"content": [{**token_entry(t), "top_logprobs": [token_entry(top) for top in t["top_logprobs"]]}
                        for t in tokens], "refusal": None}


def completion_body(row: dict, ids: str, model: str) -> dict:
    """A row's `chat.completion`, its choices from the row's list columns (sample j is choice j)."""
    choices = [{"index": j, "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": FINISH[row["finish_reason"][j]], "logprobs": choice_logprobs(row["logprobs"][j])}
               for j, text in enumerate(row["generated"])]
    completion = sum(row["n_generated_tokens"])
    return {"id": f"chatcmpl-{ids}", "object": "chat.completion", "created": 0, "model": model, "choices": choices,
            "usage": {"prompt_tokens": row["n_prompt_tokens"], "completion_tokens": completion,
                      "total_tokens": row["n_prompt_tokens"] + completion}}


def output_line(row: dict, key: str, model_path: str) -> dict:
    """One input line's output line."""
    ids = f"{key}-{row[INDEX_COLUMN]}"
    line = {"id": f"batch_req_{ids}", "custom_id": row["custom_id"]}
    if row.get(ERROR_COLUMN) is not None:
        return {**line, "response": None, "error": {"code": "row_error", "message": row[ERROR_COLUMN]}}
    model = row.get("model") or Path(model_path).name
    body = completion_body(row, ids, model)
    return {**line, "response": {"status_code": 200, "request_id": f"req_{ids}", "body": body}, "error": None}


def output_lines(table: pa.Table, key: str, model_path: str) -> Iterator[str]:
    """A proven row group's lines, in its rows' order."""
    for row in table.to_pylist():
        yield json.dumps(output_line(row, key, model_path), ensure_ascii=False) + "\n"
