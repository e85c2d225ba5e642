"""Text to text with an encoder-decoder model (T5, BART, Marian, NLLB: translation, summarisation):
each row's text through `model.generate`, greedy or by beam search, into a new text.

Settings: `model.max_new_tokens` (required, as for task generate: `generate.checks.check_max_new_tokens`)
and the `seq2seq:` section (`num_beams`). The row's text is tokenized and cut to `model.max_length` as
every text task's (`TextTask`, so the tokenize rule can make its ids ahead); the encoder reads it
whole, and the decoder starts from the model's own decoder start token.

- **Decoding** is never sampled: `num_beams: 1` is greedy argmax, more is beam search, its best
  hypothesis kept. Otherwise the model's generation_config applies as `model.generate` reads it (a
  length penalty, `no_repeat_ngram_size`, a forced first token), so a row's text is what calling
  `model.generate` on it alone gives.
- **Columns** as task generate's, less the prompt's count (`generate.columns`): `generated`, the
  new tokens decoded without special tokens; `n_generated_tokens`, the tokens up to and including
  the one that ended the row (the decoder start token is not generated, a forced first token is);
  `finish_reason`, `eos` where an eos id (the tokenizer's or the generation_config's) ended the row,
  else `length`.
- **Cost**: a row's input tokens plus `max_new_tokens` x `num_beams` (the decoder's KV cache grows
  with both), for the plan's balance (`Seq2SeqCost.overhead`) and the batches alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import architectures, model_config
from shardinfer.settings.config import Settings
from shardinfer.tasks.classify import untrained_head
from shardinfer.tasks.generate.checks import check_max_new_tokens
from shardinfer.tasks.generate.columns import FINISH
from shardinfer.tasks.generate.task import eos_token_ids
from shardinfer.tasks.text import TextTask
from shardinfer.tasks.traits import PlanCost, Reporting


@dataclass(frozen=True)
class Seq2SeqCost(PlanCost):
    """A row's input tokens, plus the decoder's: max_new_tokens for each beam."""

    def overhead(self, settings: Settings) -> int:
        return int(settings.model.max_new_tokens or 0) * settings.task_settings.num_beams


def encoder_decoder_problem(path: str) -> str | None:
    """Why the model folder holds no encoder-decoder model, read from its config.json (torch-free);
    None for one that does (`is_encoder_decoder: true`, which T5, BART, Marian and M2M100 write)."""
    if model_config(path).get("is_encoder_decoder") is True:
        return None
    named = ", ".join(architectures(path)) or "a model its config.json names no class of"
    return f"it holds {named}, not an encoder-decoder model (its config.json has no is_encoder_decoder: true)"


class Seq2Seq(TextTask):
    name = "seq2seq"
    auto_class = "AutoModelForSeq2SeqLM"
    cost = Seq2SeqCost()
    # evaluate: exact match of `generated` with a reference text, as for generate (shardinfer.scores.metrics)
    reporting = Reporting(scored_as="texts", compared={"texts": "generated"},
                          totals={"generated_tokens": "generated tokens/s"})
    outputs = {"generated": pa.string(), "n_generated_tokens": pa.int32(), "finish_reason": pa.string()}

    def __init__(self, loaded, tokenizer, pad_id: int, context) -> None:
        super().__init__(loaded, tokenizer, pad_id, context)
        self.max_new_tokens = int(context.settings.model.max_new_tokens)
        self.num_beams = int(context.settings.task_settings.num_beams)
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        self.eos_ids = eos_token_ids(tokenizer, configured)
        self.generated_tokens = 0

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """An encoder-decoder model folder and a token count to generate, before any job runs."""
        super().check_settings(settings)
        check_max_new_tokens(settings.model)
        problem = encoder_decoder_problem(settings.model.path)
        if problem:
            raise UserError(f"model.path `{settings.model.path}`: {problem}; task seq2seq needs one (T5, BART, "
                            "Marian, NLLB)")

    def check(self) -> None:
        """Weights the checkpoint lacks would be drawn at random, and so would the texts."""
        missing = untrained_head(self.loaded)
        if missing:
            more = " …" if len(missing) > 4 else ""
            raise UserError(f"model.path `{self.settings.model.path}`: weights {', '.join(missing[:4])}{more} are "
                            "missing from it (they would be random); task seq2seq needs a trained model")

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """A row's input tokens plus what its beams may generate: the batch budget counts the decoder too."""
        return lengths + self.max_new_tokens * self.num_beams

    def predict(self, batch: dict) -> dict:
        """The batch's new tokens (the decoder start token dropped), how many each row generated and
        whether eos ended it, as tensors left on the device (the runner copies them back later)."""
        import torch

        inputs = self.on_device({name: batch[name] for name in ("input_ids", "attention_mask")})
        out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, num_beams=self.num_beams,
                                  do_sample=False, num_return_sequences=1, pad_token_id=self.pad_id,
                                  eos_token_id=self.eos_ids or None)
        rows = inputs["input_ids"].shape[0]
        if out.shape[0] != rows:  # one text per row, whatever the model's generation_config says
            raise UserError(f"model.path `{self.settings.model.path}`: generate returned {out.shape[0]} sequences "
                            f"for {rows} rows")
        tokens = out[:, 1:]
        ended = torch.isin(tokens, torch.tensor(self.eos_ids, dtype=tokens.dtype, device=tokens.device))
        eos = ended.any(dim=1)
        # a row runs to max_new_tokens unless eos ends it; after that, generate pads it
        counts = torch.where(eos, ended.int().argmax(dim=1) + 1, tokens.shape[1])
        return {"tokens": tokens, "counts": counts.to(torch.int32), "eos": eos}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        """Each row's tokens up to its count, decoded without special tokens; its count and finish."""
        counts = np.asarray(results["counts"], dtype=np.int32)
        tokens = [np.asarray(row)[:count].tolist() for row, count in zip(results["tokens"], counts)]
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        codes = np.where(np.asarray(results["eos"], dtype=bool), FINISH.index("eos"), FINISH.index("length"))
        finish = [FINISH[code] for code in codes]  # generate's words for how a row ended
        self.generated_tokens += int(counts.sum())
        return [pa.array(texts, pa.string()), pa.array(counts, pa.int32()), pa.array(finish, pa.string())]

    def finish(self) -> dict:
        """The tokens generated so far: the running total the summary and the terminal report as a rate."""
        return {"generated_tokens": self.generated_tokens}
