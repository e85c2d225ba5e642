"""The transformers engine of task generate: one batch of rows with equal parameters through
`model.generate`, n completions per row (`shardinfer.tasks.generate.task` describes the task).

- Several samples: the prompts' KV cache is computed once and repeated n times (`HfEngine.prefill`),
  so the prompt costs what one sample costs; each sequence then draws with its row's index and its
  sample number (`shardinfer.tasks.generate.sampling`). A model whose cache cannot be repeated this way runs
  the prompts n times instead (logged once).
- Processors in vLLM's order: the grammar mask (`generate_structured.GrammarMask`), the
  log-probability recorder (`generate_logprobs.LogprobRecorder`), the sampler.
"""

from __future__ import annotations

import logging

import numpy as np

from shardinfer.core.errors import UserError
from shardinfer.settings.config import Settings
from shardinfer.tasks.generate.columns import FINISH, Completion
from shardinfer.tasks.generate.logprobs import LogprobRecorder
from shardinfer.tasks.generate.params import RowParams

log = logging.getLogger(__name__)

# generation_config entries whose processors transformers runs before any of ours: with them the
# recorded log-probabilities would not be vLLM's raw ones (vLLM applies them after reading those).
SCORE_CHANGING = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
                  "min_new_tokens": None, "min_length": 0, "bad_words_ids": None, "sequence_bias": None,
                  "suppress_tokens": None, "begin_suppress_tokens": None}


class FinishRecorder:
    """A stopping criterion that records, per row, the step and the reason it finished; it also
    stops rows on the stop strings (eos is transformers' own criterion). Rows already finished keep
    their first record: transformers pads them afterwards, possibly with the eos id."""

    def __init__(self, rows: int, prompt_width: int, eos, stop, device) -> None:
        import torch

        self.prompt_width, self.eos, self.stop = prompt_width, eos, stop
        self.steps = torch.zeros(rows, dtype=torch.int64, device=device)  # 0: not finished
        self.reason = torch.zeros(rows, dtype=torch.int8, device=device)

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        fresh = self.steps == 0
        eos = torch.isin(input_ids[:, -1], self.eos) & fresh if self.eos is not None else torch.zeros_like(fresh)
        stop = self.stop(input_ids, scores) & fresh & ~eos if self.stop is not None else torch.zeros_like(fresh)
        self.reason[eos] = FINISH.index("eos")
        self.reason[stop] = FINISH.index("stop")
        self.steps[eos | stop] = input_ids.shape[1] - self.prompt_width
        return self.steps > 0

    def finished(self):
        return (self.steps > 0).tolist()


def completions_of(tokens: np.ndarray, steps: np.ndarray, reasons: np.ndarray, n: int, logprobs=None
                   ) -> list[list[Completion]]:
    """A batch's sequences (rows x n of them, a row's samples together) as each row's completions."""
    counts = np.where(steps > 0, steps, tokens.shape[1])
    flat = [Completion(tokens[r, : counts[r]], int(reasons[r]), logprobs[r] if logprobs else None)
            for r in range(tokens.shape[0])]
    return [flat[r: r + n] for r in range(0, len(flat), n)]


class HfEngine:
    """`model.generate` for one batch of rows sharing their parameters."""

    def __init__(self, model, tokenizer, settings: Settings, eos_ids: list[int], pad_id: int, device) -> None:
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.eos_ids, self.pad_id, self.device = eos_ids, pad_id, device
        self.stop_criteria: dict[tuple[str, ...], object] = {}
        self.shared_prefill = True
        self.grammars_made = None
        if settings.task_settings.structured:  # compiled now: a spec xgrammar refuses fails before any row
            self.grammars.compile(settings.task_settings.structured)
        if settings.task_settings.logprobs is not None:
            self.refuse_score_changing()

    @property
    def grammars(self):
        """xgrammar over the model's vocabulary, made when a row first asks for structured output."""
        if self.grammars_made is None:
            from shardinfer.tasks.generate.structured import Grammars

            vocab = self.model.config.get_text_config().vocab_size
            self.grammars_made = Grammars(self.tokenizer, vocab, self.eos_ids)
        return self.grammars_made

    def refuse_score_changing(self) -> None:
        config = getattr(self.model, "generation_config", None)
        changing = [key for key, neutral in SCORE_CHANGING.items()
                    if getattr(config, key, neutral) not in (neutral, None, [])]
        if changing:
            raise UserError(f"generate.logprobs (or a batch file line's logprobs) on the transformers engine: "
                            f"model.path `{self.settings.model.path}`'s "
                            f"generation_config sets {', '.join(changing)}, which transformers applies before the "
                            "log-probabilities are read (vLLM: after); use generate.engine vllm, or remove it there")

    def stops(self, strings: tuple[str, ...]):
        """transformers' matcher of these stop strings, built once per job (None: no stop strings)."""
        if not strings:
            return None
        if strings not in self.stop_criteria:
            from transformers import StopStringCriteria

            try:
                self.stop_criteria[strings] = StopStringCriteria(tokenizer=self.tokenizer, stop_strings=list(strings))
            except (ValueError, KeyError, TypeError) as error:
                why = next(iter(str(error).splitlines()), type(error).__name__)
                raise UserError(f"generate.stop: transformers cannot match stop strings with the tokenizer of "
                                f"model.path `{self.settings.model.path}` ({why}); leave generate.stop empty"
                                ) from error
        return self.stop_criteria[strings]

    def run(self, inputs: dict, params: RowParams) -> list[list]:
        """The batch's completions: per row, its n samples in order."""
        import torch

        if params.logprobs is not None:  # a batch file's line may ask where the config does not
            self.refuse_score_changing()
        ids, mask, index = inputs["input_ids"], inputs["attention_mask"], inputs["index"]
        extra = {name: t for name, t in inputs.items() if name not in ("input_ids", "attention_mask", "index")}
        rows, width = ids.shape
        n = params.n
        sample = torch.arange(n, device=ids.device).repeat(rows) if n > 1 else None
        cache = self.prefill(ids, mask, n) if n > 1 and not extra else None
        if n > 1:
            ids, mask, index = (t.repeat_interleave(n, dim=0) for t in (ids, mask, index))
            extra = {name: t.repeat_interleave(n, dim=0) for name, t in extra.items()}
        eos = torch.tensor(self.eos_ids, device=self.device) if self.eos_ids else None
        recorder = FinishRecorder(rows * n, width, eos, self.stops(params.stop), self.device)
        recording = LogprobRecorder(params.logprobs) if params.logprobs is not None else None
        processors = self.processors(params, index, sample, width, rows * n, recorder, recording)
        out = self.model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, **extra,
                                  max_new_tokens=params.max_new_tokens, do_sample=False, num_beams=1,
                                  num_return_sequences=1, pad_token_id=self.pad_id, eos_token_id=self.eos_ids or None,
                                  logits_processor=processors, stopping_criteria=[recorder])
        if out.shape[0] != rows * n:  # one sequence per prompt, whatever the model's generation_config says
            raise UserError(f"model.path `{self.settings.model.path}`: generate returned {out.shape[0]} sequences "
                            f"for {rows * n} prompts")
        tokens = out[:, width:].cpu().numpy()
        steps = recorder.steps.cpu().numpy()
        counts = np.where(steps > 0, steps, tokens.shape[1])
        logprobs = recording.samples(out, counts) if recording is not None else None
        return completions_of(tokens, steps, recorder.reason.cpu().numpy(), n, logprobs)

    def processors(self, params: RowParams, index, sample, width: int, rows: int, recorder, recording) -> list:
        """The grammar mask, the log-probability recorder and the sampler, in that order (vLLM's)."""
        from shardinfer.tasks.generate.sampling import GumbelSampler

        chain = []
        if params.structured:
            from shardinfer.tasks.generate.structured import GrammarMask

            matchers = self.grammars.matchers(params.structured, rows)
            chain.append(GrammarMask(matchers, self.grammars.vocab_size, width, recorder.finished))
        if recording is not None:
            chain.append(recording)
        if params.do_sample:
            chain.append(GumbelSampler(params.seed, index, width, params.temperature, params.top_p, sample))
        return chain

    def prefill(self, ids, mask, n: int):
        """The KV cache of every prompt token but the last, computed once and repeated n times per
        row (generate computes the last and goes on); None where the model's cache cannot be
        repeated, and then generate runs the prompts n times."""
        import torch
        from transformers import DynamicCache

        if not self.shared_prefill or ids.shape[1] < 2:
            return None
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        try:
            cache = DynamicCache(config=self.model.config)
            with torch.inference_mode():
                self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1],
                           past_key_values=cache, use_cache=True)
            cache.batch_repeat_interleave(n)
            return cache
        except (TypeError, ValueError, AttributeError, NotImplementedError) as error:
            self.shared_prefill = False
            log.warning("this model's KV cache cannot be repeated (%s): each of the n samples computes its prompt",
                        error)
            return None
