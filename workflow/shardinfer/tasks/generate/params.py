"""What decides a row's completions, per row: `RowParams`.

Every row gets the config's (`generate:` and `model.max_new_tokens`: `RowParams.of`), except the
rows of an OpenAI batch file, which carry their own (`RowParams.of_request`: each line's
`max_tokens`, `temperature`, `top_p`, `n`, `stop`, `seed`, `logprobs`, `response_format`, and with
the vLLM engine `presence_penalty`, `frequency_penalty` and `logit_bias`, as
`shardinfer.input.formats.openai_batch` checked them against `batch_limits` when the plan read the
file). The engines read them per row: vLLM makes one SamplingParams per row, and the transformers
engine batches only rows with equal parameters together (`batch_key`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from shardinfer.core.model_folder import vocab_size
from shardinfer.input.formats.openai_batch import NAME as BATCH_FORMAT
from shardinfer.settings.config import ModelSettings, Settings
from shardinfer.settings.schema import defaults


def row_seed(seed: int, index: int) -> int:
    """A row's own 63-bit sampling seed from (generate.seed, its global row index), for an engine
    that takes one seed per request (vLLM): a row's samples then depend on its prompt, the seed and
    its index, not on the rows beside it."""
    digest = hashlib.sha256(f"shardinfer/{int(seed)}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def lines_carry_parameters(settings: Settings) -> bool:
    """Whether each row brings its own parameters (an OpenAI batch file): then any row may ask for
    several completions and log-probabilities, so the output columns are those of n > 1 with logprobs."""
    return settings.input.format == BATCH_FORMAT


def batch_limits(model: ModelSettings, section: dict) -> dict:
    """What a batch file's line may ask (`InputSettings.request_limits`, which the format checks at
    the plan): at most model.max_new_tokens tokens, logit_bias ids below the model config's
    vocab_size (the logits' width: `model_folder.vocab_size`; None when the config gives none),
    penalties and logit_bias on the engine that varies them per row."""
    return {"max_tokens": model.max_new_tokens, "vocab_size": vocab_size(model.path),
            "engine": section.get("engine", defaults("generate")["engine"])}


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
    structured: dict | None = None  # `shardinfer.settings.sections.structured_spec`'s form, or None
    # a batch file's line's, with the vLLM engine only (the config sets none)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), by id

    @classmethod
    def of(cls, settings: Settings) -> RowParams:
        """The config's parameters, every row's today."""
        o = settings.task_settings
        return cls(max_new_tokens=int(settings.model.max_new_tokens), do_sample=o.do_sample, temperature=o.temperature,
                   top_p=o.top_p, seed=o.seed, n=o.n, stop=tuple(o.stop), logprobs=o.logprobs, structured=o.structured)

    def of_request(self, request: dict) -> RowParams:
        """A batch file line's parameters (`request`: the format's `request` column), the config's
        (self) where the line sets none: as OpenAI where it has a default (temperature 1, top_p 1,
        n 1, no stop, no log-probabilities, free text, no penalties), the config's max_new_tokens and
        seed else. The plan refused any line asking more than model.max_new_tokens (`batch_limits`)."""
        tokens = request.get("max_tokens", self.max_new_tokens)
        temperature = float(request.get("temperature", 1.0))
        logprobs = request.get("logprobs")
        return RowParams(max_new_tokens=int(tokens), do_sample=temperature > 0, temperature=temperature or 1.0,
                         top_p=float(request.get("top_p", 1.0)), seed=int(request.get("seed", self.seed)),
                         n=int(request.get("n", 1)), stop=tuple(request.get("stop", ())),
                         logprobs=None if logprobs is None else int(logprobs), structured=request.get("structured"),
                         presence_penalty=float(request.get("presence_penalty", 0.0)),
                         frequency_penalty=float(request.get("frequency_penalty", 0.0)),
                         logit_bias=tuple((int(k), float(v)) for k, v in request.get("logit_bias", {}).items()))

    @property
    def batch_key(self) -> str:
        """Equal for rows that a transformers batch may hold together (all their parameters equal)."""
        return json.dumps([self.max_new_tokens, self.do_sample, self.temperature, self.top_p, self.seed, self.n,
                           self.stop, self.logprobs, self.structured, self.presence_penalty, self.frequency_penalty,
                           self.logit_bias], sort_keys=True)


@dataclass(frozen=True)
class PromptRows:
    """A window's prompts as the engines get them: token ids, each row's parameters, and the rows
    refused before any engine saw them (window position -> why: a malformed conversation under
    row_errors: record; predicting a batch that holds one fails it, and the runner narrows the
    failure down to that row)."""

    ids: list[list[int]]
    params: list[RowParams]
    refused: dict[int, str] = field(default_factory=dict)
    # per row, its images and the ids vLLM gets (generate_images.ImageRow), None for a row without;
    # None: no row has images. `ids` hold the prompts as the processor expanded them.
    images: list | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def has_images(self, position: int) -> bool:
        return self.images is not None and self.images[position] is not None
