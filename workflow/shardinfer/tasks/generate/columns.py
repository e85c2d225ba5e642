"""Task generate's output columns, the same for both engines: which ones the settings give
(`output_fields`, torch-free), and a window's completions as those columns (`Columns`).

With `generate.n: 1` (the default) a row's columns hold one value each, as they always have:
`generated`, `n_prompt_tokens`, `n_generated_tokens`, `finish_reason`. With n > 1 each of them but
`n_prompt_tokens` holds a list of n values, sample 0 first: one output row per input row still, so
the proof counts input rows. `logprobs` (`generate.logprobs`) and, with `generate.structured`,
`valid`, `invalid_reason` and for a JSON schema `parsed` follow the same rule.

- **finish_reason**: `eos` when the row generated an end-of-sequence token, `stop` when its text
  reached one of `generate.stop`, else `length`. `n_generated_tokens` counts the tokens up to and
  including the one that ended it.
- **generated**: the text decoded without special tokens and, for `stop`, cut before the stop string
  (as the OpenAI API and vLLM return it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from shardinfer.contract.shard_file import OutputType
from shardinfer.core.errors import UserError
from shardinfer.settings.config import Settings
from shardinfer.tasks.generate.logprobs import LOGPROBS, SampleLogprobs, TokenTexts, logprobs_array, offsets
from shardinfer.tasks.generate.params import RowParams, lines_carry_parameters
from shardinfer.tasks.generate.structured import Judge, parsed_type

FINISH = ("length", "eos", "stop")  # finish codes 0, 1, 2
# The columns at the section's defaults (n: 1, no logprobs, free text): `Generate.outputs`, the docs'
# task table. With n > 1 all but n_prompt_tokens become lists (SAMPLED).
COLUMNS: dict[str, OutputType] = {"generated": pa.string(), "n_prompt_tokens": pa.int32(),
                                  "n_generated_tokens": pa.int32(), "finish_reason": pa.string()}
SAMPLED = ("generated", "n_generated_tokens", "finish_reason")


def output_fields(settings: Settings) -> dict[str, OutputType]:
    """The columns these settings give, in order."""
    options, per_line = settings.task_settings, lines_carry_parameters(settings)
    each = pa.list_ if options.n > 1 or per_line else (lambda kind: kind)
    fields = {name: each(kind) if name in SAMPLED else kind for name, kind in COLUMNS.items()}
    if options.logprobs is not None or per_line:
        fields["logprobs"] = each(LOGPROBS)
    if options.structured and not per_line:
        if "json" in options.structured:
            fields["parsed"] = each(parsed_type(options.structured["json"]))
        fields.update(valid=each(pa.bool_()), invalid_reason=each(pa.string()))
    return fields


@dataclass(frozen=True)
class Completion:
    """One sample of a row, as an engine returns it: its tokens (up to the one that ended it), how
    it ended (a FINISH code) and, when asked, its log-probabilities."""

    tokens: np.ndarray
    finish: int
    logprobs: SampleLogprobs | None = None


def finish_code(reason: str | None, stop_reason, eos_ids: list[int], stops, row: int, engine: str) -> int:
    """An engine's ending of a completion as ours, in the words vLLM and OpenAI's API give it:
    `stop` by an eos token (stop_reason None: the tokenizer's, or an eos id) is eos, by one of
    `stops` (stop_reason: the string) is stop; `length` is length; any other fails the row's shard,
    naming the row and the `engine`."""
    if reason == "length":
        return FINISH.index("length")
    if reason == "stop" and (stop_reason is None or stop_reason in eos_ids):
        return FINISH.index("eos")
    if reason == "stop" and stop_reason in stops:
        return FINISH.index("stop")
    raise UserError(f"row {row}: {engine} ended it with finish_reason {reason!r} (stop_reason {stop_reason!r}); "
                    "only eos, length and stop are results")


def cut_at_stop(text: str, stops) -> str:
    """The text before the stop string that ends first (the one that stopped the row)."""
    found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    return text[: min(found)[1]] if found else text


class Columns:
    """A window's completions (per row: its params and its n completions) as the output columns."""

    def __init__(self, tokenizer, settings: Settings) -> None:
        self.tokenizer, self.fields = tokenizer, output_fields(settings)
        self.many = settings.task_settings.n > 1 or lines_carry_parameters(settings)
        self.texts = TokenTexts(tokenizer)
        self.judges: dict[str, Judge] = {}

    def arrays(self, results: dict[str, Any]) -> tuple[list[pa.Array], int]:
        """The columns, in `output_fields`' order, and the tokens the completions generated."""
        rows: list[list[Completion]] = results["completions"]
        params: list[RowParams] = results["params"]
        flat = [c for row in rows for c in row]
        stops = [p.stop for p, row in zip(params, rows) for _ in row]
        texts = self.tokenizer.batch_decode([c.tokens.tolist() for c in flat], skip_special_tokens=True)
        finish = [FINISH[c.finish] for c in flat]
        texts = [cut_at_stop(t, s) if f == "stop" else t for t, s, f in zip(texts, stops, finish)]
        counts = np.fromiter((len(c.tokens) for c in flat), dtype=np.int32, count=len(flat))
        values = {"generated": pa.array(texts, pa.string()), "n_generated_tokens": pa.array(counts),
                  "finish_reason": pa.array(finish, pa.string())}
        if "logprobs" in self.fields:
            values["logprobs"] = logprobs_array([c.tokens for c in flat], [c.logprobs for c in flat], self.texts)
        if "valid" in self.fields:
            values.update(self.judged(texts, finish, [p.structured for p, row in zip(params, rows) for _ in row]))
        per_row = offsets([len(row) for row in rows])
        columns = []
        for name in self.fields:
            if name == "n_prompt_tokens":
                columns.append(pa.array(np.asarray(results["n_prompt_tokens"], dtype=np.int32)))
            else:
                columns.append(pa.ListArray.from_arrays(pa.array(per_row), values[name]) if self.many else values[name])
        return columns, int(counts.sum())

    def judged(self, texts: list[str], finish: list[str], specs: list[dict | None]) -> dict[str, pa.Array]:
        """valid, invalid_reason and (json) parsed, per sample, each judged against its row's spec."""
        verdicts = [self.judge(spec)(text, why) for text, why, spec in zip(texts, finish, specs)]
        columns = {"valid": pa.array([v for v, _, _ in verdicts], pa.bool_()),
                   "invalid_reason": pa.array([r for _, r, _ in verdicts], pa.string())}
        if "parsed" in self.fields:
            kind = self.fields["parsed"].value_type if self.many else self.fields["parsed"]
            columns["parsed"] = pa.array([p for _, _, p in verdicts], kind)
        return columns

    def judge(self, spec: dict) -> Judge:
        key = repr(spec)
        if key not in self.judges:
            self.judges[key] = Judge(spec)
        return self.judges[key]
