"""Structured output (`generate.structured`): what the columns hold and how a row is judged, for
both engines; and the transformers engine's constraint, built as vLLM's xgrammar backend builds it.

- **One grammar library.** vLLM is started with its xgrammar backend pinned (no silent fallback to
  another library, `shardinfer.engines.vllm.engine`); the transformers engine compiles the same
  grammars with xgrammar (`Grammars`: a json schema with vLLM's whitespace settings, a regex, a
  choice as vLLM's EBNF) once per shard job, and masks each batch row with a matcher of its own
  (`GrammarMask`). Greedy rows are token for token vLLM's.
- **A row is valid** only when it ended on eos and its text matches: for json, strict JSON
  (`json.loads`: no raw control characters) that validates against the schema (jsonschema) and
  fits the `parsed` column's type; for regex, a full match; for choice, one of the choices. A row
  cut by max_new_tokens or a stop string is never valid, whatever its text. `invalid_reason` says
  why, `parsed` holds the value of a valid json row (an Arrow struct, list or scalar when the
  schema maps to one, else its JSON text).
- xgrammar 0.2.8 compiles a string with `maxLength`/`minLength` to a character class that admits
  raw control characters, so such rows can fail strict parsing (and each of those tokens costs a
  slow mask): prefer schemas without string length bounds (docs/tasks/generate.md).

Torch-free at import: the Snakefile reads the columns' types (`parsed_type`) without xgrammar.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from shardinfer.core.errors import UserError, first_line

SCALARS = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
UNMAPPED = ("anyOf", "oneOf", "allOf", "$ref", "not", "if", "patternProperties", "prefixItems")
INT64 = (-(2**63), 2**63 - 1)


def parsed_type(schema: dict) -> pa.DataType:
    """The `parsed` column's type for a JSON schema: its Arrow shape where it maps cleanly (an object
    with properties: a struct of nullable fields; an array of one item schema: a list; string, an
    enum of strings, integer, number, boolean; `[T, "null"]`: T), else the JSON text."""
    return schema_type(schema) or pa.string()


def schema_type(schema: Any) -> pa.DataType | None:
    if not isinstance(schema, dict) or any(key in schema for key in UNMAPPED):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None and schema.get("enum") and all(isinstance(v, str) for v in schema["enum"]):
        return pa.string()
    if kind in SCALARS:
        return SCALARS[kind]
    if kind == "array":
        inner = schema_type(schema.get("items"))
        return None if inner is None else pa.list_(inner)
    if kind == "object" and schema.get("properties") and schema.get("additionalProperties") in (None, False):
        fields = [(name, schema_type(sub)) for name, sub in schema["properties"].items()]
        return None if any(kind is None for _, kind in fields) else pa.struct(fields)
    return None


def fits(value: Any, kind: pa.DataType) -> bool:
    """Whether a parsed value converts to `kind` without a key dropped or a number cut (pyarrow
    would silently drop a struct's unknown keys)."""
    if value is None:
        return True
    if pa.types.is_struct(kind):
        names = {kind.field(i).name: kind.field(i).type for i in range(kind.num_fields)}
        return isinstance(value, dict) and set(value) <= set(names) and all(fits(v, names[k]) for k, v in value.items())
    if pa.types.is_list(kind):
        return isinstance(value, list) and all(fits(item, kind.value_type) for item in value)
    if pa.types.is_int64(kind):
        return isinstance(value, int) and not isinstance(value, bool) and INT64[0] <= value <= INT64[1]
    if pa.types.is_float64(kind):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if pa.types.is_boolean(kind):
        return isinstance(value, bool)
    return isinstance(value, str)


class Judge:
    """Judges generated texts against the structured spec, one row (or sample) at a time."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.kind = next(kind for kind in ("json", "regex", "choice") if kind in spec)
        if self.kind == "json":
            from jsonschema import Draft202012Validator

            self.validator = Draft202012Validator(spec["json"])
            self.type = parsed_type(spec["json"])
        self.choices = set(spec.get("choice") or ())

    def __call__(self, text: str, finish: str) -> tuple[bool, str | None, Any]:
        """(valid, why not, the parsed value for json)."""
        if finish != "eos":
            return False, f"ended by {finish}, not eos" if finish == "stop" else "cut by max_new_tokens", None
        if self.kind == "regex":
            matched = re.fullmatch(self.spec["regex"], text) is not None
            return matched, None if matched else "does not match the regex", None
        if self.kind == "choice":
            return text in self.choices, None if text in self.choices else "not one of the choices", None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            return False, f"not JSON: {error.msg} at character {error.pos}", None
        problem = next(iter(self.validator.iter_errors(value)), None)
        if problem is not None:
            return False, f"schema: {first_line(problem.message)[:200]}", None
        if not pa.types.is_string(self.type) and not fits(value, self.type):
            return False, f"does not fit the parsed column's type {self.type}", None
        return True, None, value if not pa.types.is_string(self.type) else json.dumps(value, ensure_ascii=False)


def choice_as_grammar(choices: list[str]) -> str:
    """vLLM 0.32's EBNF for a choice (vllm/v1/structured_output/utils.py, `choice_as_grammar`),
    copied so that the transformers engine compiles the very grammar vLLM compiles."""
    escapes = {"\\": r"\\", '"': r"\"", "\n": r"\n", "\r": r"\r", "\t": r"\t"}

    def escaped(char: str) -> str:
        if char in escapes:
            return escapes[char]
        return f"\\u{ord(char):04x}" if ord(char) < 0x20 or ord(char) == 0x7F else char

    return "root ::= " + " | ".join('"' + "".join(map(escaped, choice)) + '"' for choice in choices)


class Grammars:
    """xgrammar over the model's vocabulary, built once per shard job (the transformers engine):
    compiles a spec as vLLM's backend does and makes a matcher per batch row."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=eos_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        self.vocab_size, self.eos_ids = vocab_size, list(eos_ids)
        self.compiled: dict[str, Any] = {}

    def compile(self, spec: dict):
        """The spec's grammar, compiled once per job; a spec xgrammar refuses is a one-line UserError."""
        key = json.dumps(spec, sort_keys=True)
        if key not in self.compiled:
            try:
                self.compiled[key] = self._compile(spec)
            except RuntimeError as error:
                kind = next(iter(spec))
                raise UserError(f"generate.structured.{kind}: xgrammar cannot compile it "
                                f"({first_line(error).split('] ')[-1]})") from None
        return self.compiled[key]

    def _compile(self, spec: dict):
        if "json" in spec:
            compact = spec.get("whitespace") == "compact"
            return self.compiler.compile_json_schema(json.dumps(spec["json"]), any_whitespace=not compact,
                                                     separators=(",", ":") if compact else None)
        if "regex" in spec:
            return self.compiler.compile_regex(spec["regex"])
        return self.compiler.compile_grammar(choice_as_grammar(spec["choice"]))

    def matchers(self, spec: dict | None, rows: int) -> list:
        """A matcher per batch row, stopping on the model's eos ids (vLLM: all stop token ids)."""
        import xgrammar as xgr

        compiled = self.compile(spec) if spec else None
        return [xgr.GrammarMatcher(compiled, override_stop_tokens=self.eos_ids) if compiled else None
                for _ in range(rows)]


class GrammarMask:
    """A logits processor: each constrained row's scores masked to the tokens its grammar allows
    next. It feeds each row's previous token to the row's matcher first, and skips rows already
    finished (`finished`: a bool per row; transformers keeps padding them)."""

    def __init__(self, matchers: list, vocab_size: int, prompt_width: int, finished) -> None:
        import xgrammar as xgr

        self.matchers, self.prompt_width, self.finished = matchers, prompt_width, finished
        self.rows = [r for r, matcher in enumerate(matchers) if matcher is not None]
        self.bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)

    def __call__(self, input_ids, scores):
        import xgrammar as xgr

        step, done = input_ids.shape[1] - self.prompt_width, self.finished()
        live = []
        for r in self.rows:
            matcher = self.matchers[r]
            if done[r] or matcher.is_terminated():
                continue
            if step > 0 and not matcher.accept_token(int(input_ids[r, -1])):
                raise RuntimeError(f"token {int(input_ids[r, -1])} breaks batch row {r}'s grammar at step {step}")
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(self.bitmask, r)
                live.append(r)
        if live:
            bitmask = self.bitmask if scores.device.type == "cpu" else self.bitmask.to(scores.device)
            xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=scores.shape[1], indices=live)
        return scores
