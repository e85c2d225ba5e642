"""The OpenAI batch output and error files, written by gather for an input of
`input.format: openai_batch` (`results/batch_output.jsonl`, `results/batch_errors.jsonl`): as the
OpenAI Batch API writes them, each request's line in one of the two, in input order.

The output file holds a line per request that succeeded:

    {"id": "batch_req_<key>-<row>", "custom_id": ..., "error": null,
     "response": {"status_code": 200, "request_id": "req_<key>-<row>", "body": <chat.completion>}}

and the error file (OpenAI's `error_file_id`) a line per request whose row failed
(`row_errors.mode: record`), as OpenAI writes a request that failed at the API:

    {"id": "batch_req_<key>-<row>", "custom_id": ..., "error": null,
     "response": {"status_code": 400, "request_id": "req_<key>-<row>",
                  "body": {"error": {"message": <why>, "type": "invalid_request_error",
                                     "param": null, "code": "row_error"}}}}

(400, not 500: the row's own content made it fail, and the same line fails again when run again;
the top-level `error` is, at OpenAI, for a request never run, such as one left when the batch
expired). A consumer written for OpenAI's output file reads `response.body` of every line, so no
failed line is among them. The body of a success is a `chat.completion`: id `chatcmpl-<key>-<row>`,
`created` 0, `model` the line's body.model (else the model folder's name), a choice per completion
({index, message {role: assistant, content}, finish_reason: `stop` for eos and stop strings,
`length`; logprobs {content: [{token, bytes, logprob, top_logprobs}]} when the line asked}) and
usage {prompt_tokens, completion_tokens (over all choices), total_tokens}. Ids and `created` come
from what decides the output, not a clock or a random draw: `<key>` is a digest of the settings'
digest and the input's content (`request_key`), `<row>` the line's row; the same input and
settings give the same files, byte for byte, under any shard count.

Both are written from the proven rows as they pass the proof, in one pass with the other writers
(`shardinfer.output.base`): any check that fails leaves neither file, and every input line is in
exactly one of them (counted against the plan's rows before they take their names). One file each
in either layout: OpenAI's are one file each.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterator
from pathlib import Path

from shardinfer.contract.shard_file import ERROR_COLUMN, INDEX_COLUMN
from shardinfer.core.errors import ProofError
from shardinfer.input.formats.openai_batch import NAME as BATCH_FORMAT
from shardinfer.output.base import Destination, Proven, Writer, one_file_facts, open_text, staged

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


def output_line(row: dict, key: str, model_path: str) -> tuple[dict, bool]:
    """One input line's line, and whether it is a success (False: an error file's line)."""
    ids = f"{key}-{row[INDEX_COLUMN]}"
    line = {"id": f"batch_req_{ids}", "custom_id": row["custom_id"]}
    if row.get(ERROR_COLUMN) is not None:
        error = {"message": row[ERROR_COLUMN], "type": "invalid_request_error", "param": None, "code": "row_error"}
        return {**line, "response": {"status_code": 400, "request_id": f"req_{ids}", "body": {"error": error}},
                "error": None}, False
    model = row.get("model") or Path(model_path).name
    body = completion_body(row, ids, model)
    return {**line, "response": {"status_code": 200, "request_id": f"req_{ids}", "body": body}, "error": None}, True


class OpenAIBatch(Writer):
    """The OpenAI batch output file (successes) and error file (failed rows), for an OpenAI batch file."""

    name = BATCH_FORMAT
    writes = ("OpenAI's batch output file, `batch_output.jsonl` (a line per request that succeeded), and error "
              "file, `batch_errors.jsonl` (a line per failed row), each in input order")
    formats = (BATCH_FORMAT,)
    default_for = (BATCH_FORMAT,)

    def files(self, parts: bool) -> dict[str, str]:
        return {"batch_output": "batch_output.jsonl", "batch_errors": "batch_errors.jsonl"}

    def write(self, proven: Proven, where: Destination) -> dict:
        key, counts = request_key(proven.plan, proven.digest), [0, 0]
        paths = [where.paths["batch_output"], where.paths["batch_errors"]]
        with staged(paths) as temporary, open_text(temporary[0]) as out, open_text(temporary[1]) as errors:
            for table in proven.tables:
                for row in table.to_pylist():
                    line, ok = output_line(row, key, proven.model_path)
                    (out if ok else errors).write(json.dumps(line, ensure_ascii=False) + "\n")
                    counts[not ok] += 1
            if sum(counts) != proven.rows:
                raise ProofError(f"the batch files hold {sum(counts)} lines, the input {proven.rows}")
        return one_file_facts(paths[0], lines=counts[0], errors={"path": paths[1], "lines": counts[1]})

    def read_back(self, where: Destination) -> Iterator[dict]:
        """Each file's lines, merged by their row (each file kept in its own order): the row's
        custom_id, and its completions (`generated`) or its error."""
        files = [read_lines(where.paths["batch_output"]), read_lines(where.paths["batch_errors"])]
        yield from heapq.merge(*files, key=lambda line: line["index"])


def read_lines(path: str) -> Iterator[dict]:
    """A batch file's lines as rows: `index` (from the line's id), `custom_id`, and `generated` (each
    choice's content) or `error` (its message)."""
    with open(path, encoding="utf-8") as lines:
        for line in map(json.loads, lines):
            row = {"index": int(line["id"].rpartition("-")[2]), "custom_id": line["custom_id"]}
            body = line["response"]["body"]
            if "error" in body:
                yield {**row, "error": body["error"]["message"]}
            else:
                yield {**row, "generated": [choice["message"]["content"] for choice in body["choices"]]}


WRITERS = (OpenAIBatch(),)
