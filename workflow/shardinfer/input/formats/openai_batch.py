"""The OpenAI batch file (`input.format: openai_batch`): JSONL lines `{"custom_id", "method": "POST",
"url": "/v1/chat/completions", "body": {model, messages, max_tokens, temperature, ...}}`, as the
OpenAI Batch API and `vllm run-batch` take them. Named in `input.format` (its files end in .jsonl,
which is `jsonl`'s extension).

Each line gives the columns
- `custom_id` (string, unique in the file: a duplicate is refused naming both lines),
- `model` (`body.model` as the line gives it: recorded for the output file, never used to pick a
  model: `model.path` is the model),
- `messages` (the conversation, list<struct<role, content>>, each content its text parts
  (list<struct<type, text>>; a string is one text part, as vLLM's `LLM.chat` takes it): the chat
  template gets them as parts or joined by a line break, as the template takes its contents,
  `shardinfer.tasks.generate.chat_content`),
- `request` (the line's own parameters as JSON, in the generate task's words: `max_tokens`,
  `temperature`, `top_p`, `n`, `stop`, `seed`, `logprobs` (k: `top_logprobs`, 0 when only
  `logprobs: true`), `structured` (`response_format`) and, with `generate.engine: vllm`,
  `presence_penalty`, `frequency_penalty` and `logit_bias`, only those the line sets),
and the line's keys beside custom_id, method, url and body, typed as JSONL types them (a gold
label for `evaluate:`, say). Everything is checked as the plan scans the file, before any job: a
key that would change the output and that the run's engine cannot follow per row, a value out of
its range (max_tokens above model.max_new_tokens, a logit_bias id beyond the model's vocabulary),
another url or method, is refused in one line naming the file's line, the custom_id and the key
(`request_of`, against `InputSettings.request_limits`). Messages that a chat template refuses (a
role it does not know, a content that is not text) are the row's problem, not the file's: the
shard fails on them, or with `row_errors.mode: record` the row is an error line of the output file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.input.formats.base import Position, Span, select
from shardinfer.input.formats.jsonl import START, FieldConflict, merge_fields, parse_block
from shardinfer.input.formats.text_blocks import Reader, TextFormat, blocks, line_cut, position
from shardinfer.settings.config import InputSettings

NAME = "openai_batch"
URL = "/v1/chat/completions"
TEXT_PART = pa.struct([("type", pa.string()), ("text", pa.string())])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.list_(TEXT_PART))])
FIXED = pa.schema([("custom_id", pa.string()), ("model", pa.string()), ("messages", pa.list_(MESSAGE)),
                   ("request", pa.string())])
LINE_KEYS = ("custom_id", "method", "url", "body")
# The body's keys each line may set, and what they become (`request_of`).
PARAMETERS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs",
              "top_logprobs", "response_format")
# Keys that change no output: recorded (model) or passed over (the others).
NEUTRAL_KEYS = ("model", "messages", "user", "metadata", "store", "service_tier")
# Keys that only vLLM's engine varies per row (SamplingParams); taken at their neutral value on both.
VLLM_PARAMETERS = {"presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None), "logit_bias": ({}, None)}
# Keys taken only at the value that changes nothing.
NEUTRAL_VALUES = {"stream": (False, None), "parallel_tool_calls": (None,), "tools": ([], None),
                  "tool_choice": (None, "none")}
MAX_STOPS, MAX_TOP_LOGPROBS, MAX_PENALTY, MAX_BIAS = 4, 20, 2.0, 100.0


class LineError(Exception):
    """A line's problem, without the file and line (added by the reader)."""


def _integer(value: Any, key: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
        raise LineError(f"body.{key} must be {allowed}; got {value!r}")
    return value


def _number(value: Any, key: str, low: float, high: float, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or value < low or (low_open and value == low):
        allowed = f"a number {'above' if low_open else 'from'} {low} {'and at most' if low_open else 'to'} {high}"
        raise LineError(f"body.{key} must be {allowed}; got {value!r}")
    return float(value)


def _stops(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 0 < len(stops) <= MAX_STOPS or not all(isinstance(s, str) and s
                                                                                   for s in stops):
        raise LineError(f"body.stop must be a non-empty string or a list of 1 to {MAX_STOPS} of them; got {value!r}")
    return stops


def structured_of(value: Any) -> dict | None:
    """`response_format` as `generate.structured`'s form (None: free text)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json": {"type": "object"}, "whitespace": "any"}
    if kind == "json_schema" and isinstance(value.get("json_schema"), dict):
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        schema = value["json_schema"].get("schema")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as error:
            raise LineError(f"body.response_format.json_schema.schema is not a JSON schema ({error.message})"
                            ) from None
        if not isinstance(schema, dict):
            raise LineError("body.response_format.json_schema.schema must be a JSON schema object")
        return {"json": schema, "whitespace": "any"}
    raise LineError("body.response_format must be {type: text}, {type: json_object} or {type: json_schema, "
                    f"json_schema: {{name, schema}}}}; got {json.dumps(value)[:200]}")


def _refused_key(body: dict) -> str | None:
    for key, value in body.items():
        if key in PARAMETERS or key in NEUTRAL_KEYS or key in VLLM_PARAMETERS:
            continue
        if key in NEUTRAL_VALUES and value in NEUTRAL_VALUES[key]:
            continue
        return key
    return None


def request_of(body: dict, limits: dict) -> dict:
    """A body's parameters in the generate task's words (`shardinfer.tasks.generate.params`), checked,
    against the run's `limits` too (`InputSettings.request_limits`: max_tokens, vocab_size, engine)."""
    refused = _refused_key(body)
    if refused is not None:
        raise LineError(f"body.{refused} {json.dumps(body[refused])[:80]} is not supported: it would change the "
                        f"output and no engine here can vary it per row; supported: {', '.join(PARAMETERS)}, "
                        f"with generate.engine vllm {', '.join(VLLM_PARAMETERS)} (and {', '.join(NEUTRAL_KEYS)}, "
                        "which change nothing)")
    request: dict[str, Any] = _max_tokens(body, limits.get("max_tokens"))
    if body.get("temperature") is not None:
        request["temperature"] = _number(body["temperature"], "temperature", 0.0, 2.0)
    if body.get("top_p") is not None:
        request["top_p"] = _number(body["top_p"], "top_p", 0.0, 1.0, low_open=True)
    if body.get("n") is not None:
        request["n"] = _integer(body["n"], "n", 1, 128)
        if request["n"] > 1 and request.get("temperature", 1.0) == 0:
            raise LineError(f"body.n {request['n']} with temperature 0 would give {request['n']} equal completions "
                            "(greedy); give n 1 or a temperature above 0")
    if body.get("stop") is not None:
        request["stop"] = _stops(body["stop"])
    if body.get("seed") is not None:
        request["seed"] = _integer(body["seed"], "seed", 0, 2**63 - 1)
    request.update(_logprobs(body))
    request.update(_vllm_parameters(body, limits))
    if body.get("response_format") is not None and (spec := structured_of(body["response_format"])):
        request["structured"] = spec
    return request


def _max_tokens(body: dict, limit: int | None) -> dict:
    """The line's max_tokens (or max_completion_tokens), at most `limit`: model.max_new_tokens sizes
    every shard's engine (vLLM's max_model_len, the KV cache) and the plan's cost, before any line is
    read, so a line cannot raise it; refused here, at the plan, not by a shard hours in."""
    tokens = {key: _integer(body[key], key, 1) for key in ("max_tokens", "max_completion_tokens")
              if body.get(key) is not None}
    if len(set(tokens.values())) > 1:
        raise LineError(f"body.max_tokens {tokens['max_tokens']} and body.max_completion_tokens "
                        f"{tokens['max_completion_tokens']} differ; give one")
    if not tokens:
        return {}
    key, value = next(iter(tokens.items()))
    if limit is not None and value > limit:
        raise LineError(f"body.{key} {value} is above model.max_new_tokens {limit}, the most tokens any line is "
                        f"given; set model.max_new_tokens to {value} or more, or lower the line's")
    return {"max_tokens": value}


def _vllm_parameters(body: dict, limits: dict) -> dict:
    """presence_penalty, frequency_penalty (-2 to 2) and logit_bias ({token id as a string: -100 to
    100}, ids below the model's vocab_size), as OpenAI defines them; only vLLM's engine varies them
    per row (`limits["engine"]`). At their neutral values they are left out, as if not given."""
    asked = {key: body[key] for key, neutral in VLLM_PARAMETERS.items() if body.get(key) not in neutral}
    if asked and limits.get("engine") != "vllm":
        key = next(iter(asked))
        raise LineError(f"body.{key} {json.dumps(asked[key])[:80]} is varied per row by generate.engine vllm only; "
                        f"set generate.engine: vllm, or leave body.{key} out")
    request = {key: _number(asked[key], key, -MAX_PENALTY, MAX_PENALTY) for key in asked if key != "logit_bias"}
    if "logit_bias" in asked:
        request["logit_bias"] = _logit_bias(asked["logit_bias"], limits.get("vocab_size"))
    return request


def _logit_bias(value: Any, vocab_size: int | None) -> dict[str, float]:
    """{token id: bias}, the ids as decimal strings below `vocab_size` (None: unknown, unchecked)."""
    if not isinstance(value, dict):
        raise LineError(f"body.logit_bias must be an object of token ids to biases; got {json.dumps(value)[:80]}")
    bias = {}
    for key, number in value.items():
        known = isinstance(key, str) and key.isdigit() and key.isascii()
        if not known or (vocab_size is not None and int(key) >= vocab_size):
            below = f" below the model's vocab_size {vocab_size}" if vocab_size is not None else ""
            raise LineError(f"body.logit_bias key {key!r} is not a token id; allowed: an integer{below}, as a string")
        bias[str(int(key))] = _number(number, f"logit_bias[{key!r}]", -MAX_BIAS, MAX_BIAS)
    return dict(sorted(bias.items(), key=lambda item: int(item[0])))


def _logprobs(body: dict) -> dict:
    asked = body.get("logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise LineError(f"body.logprobs must be true or false; got {asked!r}")
    top = body.get("top_logprobs")
    if top is not None:
        _integer(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if not asked:
            raise LineError("body.top_logprobs needs body.logprobs: true")
    return {"logprobs": top or 0} if asked else {}


def message_of(message: Any) -> dict:
    """A message as {role, content}, the content its text parts (a string: one); a value that is not
    text kept out (null), so that the row is refused naming it, as any malformed conversation is."""
    if not isinstance(message, dict):
        return {"role": None, "content": None}
    other = sorted(set(message) - {"role", "content", "name"})
    if other or message.get("name") is not None:
        key = other[0] if other else "name"
        raise LineError(f"a message's `{key}` is not supported (only role and content are read: the chat template "
                        "would not see it)")
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    elif isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        if not all(isinstance(part.get("text"), str) for part in content):
            raise LineError("a message's text part has no string `text`")
        content = [{"type": "text", "text": part["text"]} for part in content]
    elif isinstance(content, list):
        kinds = sorted({str(p.get("type")) if isinstance(p, dict) else type(p).__name__ for p in content} - {"text"})
        raise LineError(f"a message's content holds {', '.join(kinds)} parts; only text parts are read")
    role = message.get("role")
    return {"role": role if isinstance(role, str) else None, "content": content if isinstance(content, list) else None}


def line_of(text: bytes, limits: dict) -> tuple[dict, dict]:
    """One line as its fixed columns and its own other keys (`limits`: `request_of`'s); raises LineError."""
    try:
        line = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise LineError(f"not JSON ({getattr(error, 'msg', error)})") from None
    if not isinstance(line, dict):
        raise LineError("not a JSON object")
    if not isinstance(line.get("custom_id"), str) or not line["custom_id"]:
        raise LineError(f"custom_id must be a non-empty string; got {line.get('custom_id')!r}")
    if line.get("url") != URL or line.get("method", "POST") != "POST":
        raise LineError(f"url {line.get('url')!r} (method {line.get('method')!r}) is not supported; allowed: "
                        f"POST {URL}")
    body = line.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise LineError("body.messages must be a non-empty list of {role, content}")
    extra = {key: value for key, value in line.items() if key not in LINE_KEYS}
    clash = sorted(set(extra) & set(FIXED.names))
    if clash:
        raise LineError(f"key `{clash[0]}` beside body is refused: the format's own column has that name")
    model = body.get("model")
    try:
        request = {"custom_id": line["custom_id"], **request_of(body, limits)}
    except LineError as error:
        raise LineError(f"custom_id {line['custom_id']!r}: {error}") from None
    fixed = {"custom_id": line["custom_id"], "model": model if isinstance(model, str) else None,
             "messages": [message_of(m) for m in body["messages"]],
             "request": json.dumps(request, sort_keys=True, ensure_ascii=False)}
    return fixed, extra


def parsed_block(path: str, first_line: int, block: bytes, extra: pa.Schema | None, seen: dict | None,
                 limits: dict) -> pa.Table:
    """A block's lines as the fixed columns, then the lines' own keys in `extra`'s types (None:
    typed by this block alone); `seen`: custom_id -> line, across the blocks of one whole read;
    `limits`: the run's (`request_of`)."""
    fixed, extras = [], []
    for offset, text in enumerate(block.split(b"\n")):
        if not text.strip():
            continue
        number = first_line + offset
        try:
            row, own = line_of(text, limits)
        except LineError as error:
            raise UserError(f"input `{path}`: line {number}: {error}") from None
        if seen is not None:
            if row["custom_id"] in seen:
                raise UserError(f"input `{path}`: line {number}: custom_id {row['custom_id']!r} is also line "
                                f"{seen[row['custom_id']]}'s; each request needs its own")
            seen[row["custom_id"]] = number
        fixed.append(row)
        extras.append(own)
    table = pa.Table.from_pylist(fixed, schema=FIXED)
    if extra is not None and not len(extra):
        return table
    own = parse_block(path, first_line, "\n".join(json.dumps(e) for e in extras).encode() + b"\n", extra)
    for name in own.column_names:
        table = table.append_column(name, own.column(name))
    return table


class OpenAiBatch(TextFormat):
    """The OpenAI batch file of chat completion requests, as the OpenAI Batch API and `vllm run-batch`
    take it (task generate): each line's `body.messages` is its prompt and its own max_tokens,
    temperature, top_p, n, stop, seed, logprobs, top_logprobs and response_format drive its row; gather
    also writes OpenAI's output and error files, `results/batch_output.jsonl` and
    `results/batch_errors.jsonl` (docs/tasks/openai-batch.md)."""

    name = NAME
    named_only = True  # .jsonl is jsonl's
    always_kept = ("custom_id", "model")  # the output files' lines are made of them
    tasks = ("generate",)

    def fields(self, inp: InputSettings) -> pa.Schema:
        """The fixed columns, then the lines' own keys over every part, one type each."""
        extra = pa.schema([])
        for path in inp.files:
            for _, line, block in blocks(path, line_cut, START, None):
                try:
                    own = parsed_block(path, line, block, None, None, inp.request_limits)
                    extra = merge_fields(extra, pa.schema([f for f in own.schema if f.name not in FIXED.names]))
                except FieldConflict as conflict:
                    raise UserError(f"input `{path}`: key `{conflict.column}` holds {conflict.before} before line "
                                    f"{line} and {conflict.after} from there on; give it one type") from None
        return pa.schema([*FIXED, *extra])

    def column_names(self, inp: InputSettings, fields: pa.Schema | None = None) -> list[str]:
        return (fields if fields is not None else self.fields(inp)).names

    def reader(self, inp: InputSettings, fields: pa.Schema | None, seen: dict | None = None) -> Reader:
        fields = fields if fields is not None else self.fields(inp)
        extra = pa.schema([f for f in fields if f.name not in FIXED.names])
        return line_cut, lambda line, block: parsed_block(inp.path, line, block, extra, seen, inp.request_limits), START

    def batches(self, inp: InputSettings, span: Span | None = None, fields: pa.Schema | None = None
                ) -> Iterator[tuple[Position, pa.RecordBatch]]:
        """As TextFormat's; a whole read (the plan's scan, gather's count) also refuses a custom_id
        given twice."""
        with self.reading(inp.path):
            seen = {} if span is None else None
            cut, parse, rows_begin = self.reader(inp, fields if fields is not None else span and span.fields, seen)
            at, stop = (span.at, span.stop and span.stop["byte"]) if span else (rows_begin, None)
            for byte, line, block in blocks(inp.path, cut, at, stop, self.blank):
                for batch in parse(line, block).to_batches():
                    yield position(line, byte), select(batch, inp.read_columns)

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        """Each row a request line (custom_id `row-<k>`, its text columns' first as the user's message),
        its values as the line's own keys."""
        text = next(name for name, kind in zip(table.schema.names, table.schema.types) if pa.types.is_string(kind))
        with open(path, "w", encoding="utf-8") as sink:
            for k, row in enumerate(table.to_pylist()):
                body = {"model": "sample", "messages": [{"role": "user", "content": row[text]}]}
                line = {"custom_id": f"row-{k}", "method": "POST", "url": URL, "body": body, **row}
                sink.write(json.dumps(line, ensure_ascii=False) + "\n")


FORMATS = (OpenAiBatch(),)
