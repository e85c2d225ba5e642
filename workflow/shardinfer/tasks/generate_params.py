"""What decides a row's completions, per row: `RowParams`.

Today every row gets the config's (`generate:` and `model.max_new_tokens`: `RowParams.of`). The
engines read them per row all the same: vLLM makes one SamplingParams per row, and the
transformers engine batches only rows with equal parameters together (`batch_key`), so an input
that carries its own parameters per row (an OpenAI batch file's `max_tokens`, `temperature`, `n`,
`logprobs`, `response_format`, ...) fills `PromptRows.params` row by row and needs no engine change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from shardinfer.config import Settings


@dataclass(frozen=True)
class RowParams:
    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0  # with the row's global index, the key of its random streams
    n: int = 1  # completions of the row
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; k: the chosen token's and the top k per position
    structured: dict | None = None  # `shardinfer.sections.structured_spec`'s form, or None

    @classmethod
    def of(cls, settings: Settings) -> RowParams:
        """The config's parameters, every row's today."""
        o = settings.task_settings
        return cls(max_new_tokens=int(settings.model.max_new_tokens), do_sample=o.do_sample, temperature=o.temperature,
                   top_p=o.top_p, seed=o.seed, n=o.n, stop=tuple(o.stop), logprobs=o.logprobs, structured=o.structured)

    @property
    def batch_key(self) -> str:
        """Equal for rows that a transformers batch may hold together (all their parameters equal)."""
        return json.dumps([self.max_new_tokens, self.do_sample, self.temperature, self.top_p, self.seed, self.n,
                           self.stop, self.logprobs, self.structured], sort_keys=True)


@dataclass(frozen=True)
class PromptRows:
    """A window's prompts as the engines get them: token ids, each row's parameters, and the rows
    refused before any engine saw them (window position -> why: a malformed conversation under
    row_errors: record; predicting a batch that holds one fails it, and the runner narrows the
    failure down to that row)."""

    ids: list[list[int]]
    params: list[RowParams]
    refused: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)
