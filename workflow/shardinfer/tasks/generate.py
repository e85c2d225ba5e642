"""Text generation with a causal language model: greedy, or sampled reproducibly per row.

Settings: `model.max_new_tokens` and the `generate:` section (chat_template, system_prompt,
do_sample, temperature, top_p, seed, stop, engine, vllm). This module is the transformers engine
and what both engines share (prompts, eos ids, decoding, columns); `generate.engine: vllm` runs
the same task on vLLM's engine (`shardinfer.tasks.vllm`).

- **Prompts** are the text column, optionally wrapped as a user message (after an optional system
  message) in the tokenizer's chat template with its generation prompt. They are tokenized without
  padding. A prompt longer than `model.max_length` loses its **beginning**: the end is kept, where
  the instruction and the template's generation prompt are (a leading BOS token stays in front).
  With a chat template a long text may so lose the system message. Cut prompts are counted as
  truncated, as for the other tasks.
- **Batches** are left-padded; a row costs its prompt tokens plus `max_new_tokens` (the KV cache
  grows with both). transformers' own `generate` loop runs a batch until all its rows are done.
- **Greedy** is plain argmax; **sampling** is greedy over scores plus per-row Gumbel noise
  (`shardinfer.tasks.sampling`), so a row's output depends only on its prompt, the seed and its global
  index. The model's own generation_config processors (e.g. a repetition penalty) apply as in
  `model.generate`; its sampling settings do not, the `generate:` section's do.
- **Finish**: `eos` when the row generated an end-of-sequence token (the tokenizer's and the
  generation_config's), `stop` when its text reached one of `generate.stop` (transformers'
  StopStringCriteria; a stop string may end inside the token that completes it), else `length`.
  `n_generated_tokens` counts the tokens up to and including the one that ended the row.
  `generated` is the text decoded without special tokens and, for `stop`, cut **before** the stop
  string (as the OpenAI API and vLLM return it).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from shardinfer.config import ModelSettings, Settings
from shardinfer.errors import UserError
from shardinfer.hf.tokens import TokenWindow
from shardinfer.input.scan import text_values
from shardinfer.schema import defaults
from shardinfer.tasks.base import Window, tokenize_ahead_refused
from shardinfer.tasks.classify import untrained_head
from shardinfer.tasks.text import TextTask, model_length_limit
from shardinfer.tasks.vllm.checks import check_one_device

FINISH = ("length", "eos", "stop")  # finish codes 0, 1, 2
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "WithLMHead", "ForConditionalGeneration",
                   "GenerationDecoder")  # class names with a generation head


def names_a_generator(architectures: list[str], known: Collection[str] = ()) -> bool:
    """Whether a model config's `architectures` name one with a generation head: by the suffixes of
    such class names (when the config is checked, without transformers), or by name in `known`
    (at load: transformers' causal LM classes). A config that names none is not refused here."""
    return not architectures or any(name in known or name.endswith(CAUSAL_SUFFIXES) for name in architectures)


def check_positions(model: ModelSettings) -> None:
    """A prompt of max_length and max_new_tokens generated after it fit the model's positions."""
    limit = model_length_limit(model.path)
    if limit is not None and model.max_new_tokens >= limit:  # no max_length would help: say what would
        room = ""
        if model.max_length < limit:
            room = f"; use at most {limit - model.max_length} with max_length {model.max_length}"
        raise UserError(f"model.max_new_tokens {model.max_new_tokens} leaves no room for a prompt within the model's "
                        f"limit of {limit} positions{room}")
    if limit is not None and model.max_length + model.max_new_tokens > limit:
        raise UserError(f"model.max_length {model.max_length} + model.max_new_tokens {model.max_new_tokens} is above "
                        f"the model's limit of {limit} positions; lower max_length to {limit - model.max_new_tokens} "
                        f"or less, or max_new_tokens to {limit - model.max_length} or less")


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


def generation_options(task_settings: dict) -> dict:
    """The `generate:` section with the schema's defaults under it (a validated config has them all;
    a task built by hand may give only some), stop strings as a list."""
    options = {**defaults("generate"), **{k: v for k, v in task_settings.items() if v is not None}}
    options["stop"] = list(options["stop"] or [])
    return options


def eos_token_ids(tokenizer, configured) -> list[int]:
    """The tokenizer's eos and the generation_config's (`configured`: an id or a list; chat models
    often add a turn end)."""
    configured = [configured] if isinstance(configured, int) else list(configured or [])
    ids = [tokenizer.eos_token_id, *configured]
    return sorted({int(i) for i in ids if i is not None})


def cut_at_stop(text: str, stops: list[str]) -> str:
    """The text before the stop string that ends first (the one that stopped the row)."""
    found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    return text[: min(found)[1]] if found else text


def prompt_token_ids(tokenizer, prompts: list[str], max_length: int, chat_template: bool
                     ) -> tuple[list[list[int]], list[int]]:
    """Token ids per prompt, cut from the left to max_length (a leading BOS kept), and the cut
    positions: what both engines are given."""
    special = not chat_template  # a chat template writes its own special tokens
    ids = tokenizer(prompts, add_special_tokens=special, truncation=False, verbose=False)["input_ids"]
    bos = tokenizer.bos_token_id
    truncated = [i for i, row in enumerate(ids) if len(row) > max_length]
    for i in truncated:
        keep = 1 if bos is not None and ids[i][0] == bos and max_length > 1 else 0
        ids[i] = ids[i][:keep] + ids[i][len(ids[i]) - (max_length - keep):]
    return ids, truncated


def not_a_generator(loaded) -> str | None:
    """Why the loaded model cannot generate text, or None. An encoder folder (BertModel,
    BertForMaskedLM) loads as BertLMHeadModel, with a random head or bidirectional attention."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    named = list(getattr(loaded.model.config, "architectures", None) or [])
    if not names_a_generator(named, set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())):
        return f"it holds {', '.join(named)}, not a causal language model (…ForCausalLM) with a generation head"
    missing = untrained_head(loaded)
    if missing:
        more = " …" if len(missing) > 4 else ""
        return f"weights {', '.join(missing[:4])}{more} are missing from it (they would be random)"
    return None


class Generate(TextTask):
    name = "generate"
    auto_class = "AutoModelForCausalLM"
    padding_side = "left"
    tokenizes_ahead = False  # prompts go through the chat template and are cut from the left, in the shard job
    outputs = {"generated": "string", "n_prompt_tokens": "int32", "n_generated_tokens": "int32",
               "finish_reason": "string"}
    scored_as = "texts"  # evaluate: exact match of `generated` with the reference (shardinfer.metrics)
    compared = {"texts": "generated"}
    totals = {"generated_tokens": "generated tokens/s"}

    def __init__(self, loaded, tokenizer, pad_id: int, context, configured_eos=None) -> None:
        """`configured_eos`: the generation_config's eos id(s) when there is no loaded model to ask."""
        super().__init__(loaded, tokenizer, pad_id, context)
        self.options = generation_options(context.settings.task_settings)
        self.max_new_tokens = int(context.settings.model.max_new_tokens)
        if loaded is not None:
            configured_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        self.eos_ids = eos_token_ids(tokenizer, configured_eos)
        self.stop_criteria = self.stop_strings_criteria() if loaded is not None else None
        self.generated_tokens = 0

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """A model folder with a generation head, a token count to generate, and room for both."""
        super().check_settings(settings)
        model = settings.model
        if model.max_new_tokens is None or model.max_new_tokens < 1:
            raise UserError(f"model.max_new_tokens must be an integer >= 1 for task generate (tokens to generate at "
                            f"most per row); got {model.max_new_tokens!r}")
        if settings.tokenize_ahead:
            raise tokenize_ahead_refused(cls.name, "tokenizes its prompts in the shard job (set tokenize.ahead: false)")
        named = json.loads((Path(model.path) / "config.json").read_text()).get("architectures") or []
        if not names_a_generator(named):
            raise UserError(f"model.path `{model.path}` holds {', '.join(named)}, not a causal language model "
                            "(…ForCausalLM) with a generation head; task generate needs one")
        check_positions(model)
        check_one_device(settings.task_settings)  # several devices: the vLLM engine's (generate.vllm)

    @classmethod
    def plan_overhead(cls, settings) -> int:
        """Each row may add max_new_tokens to its prompt in the KV cache: the plan counts them too."""
        return int(settings.model.max_new_tokens or 0)

    def check(self) -> None:
        reason = not_a_generator(self.loaded)
        if reason:
            raise UserError(f"model.path `{self.settings.model.path}` cannot generate text for task generate: {reason}")

    def stop_strings_criteria(self):
        """transformers' matcher of stop strings against token ids, built once per job."""
        if not self.options["stop"]:
            return None
        from transformers import StopStringCriteria

        try:
            return StopStringCriteria(tokenizer=self.tokenizer, stop_strings=self.options["stop"])
        except (ValueError, KeyError, TypeError) as error:
            why = next(iter(str(error).splitlines()), type(error).__name__)
            raise UserError(f"generate.stop: transformers cannot match stop strings with the tokenizer of model.path "
                            f"`{self.settings.model.path}` ({why}); leave generate.stop empty") from error

    def prompts(self, table: pa.Table) -> list[str]:
        texts = text_values(table.column(0).combine_chunks(), self.null_as_empty)
        if not self.options["chat_template"]:
            return texts
        system = self.options["system_prompt"]
        head = [{"role": "system", "content": system}] if system else []
        return [self.tokenizer.apply_chat_template([*head, {"role": "user", "content": text}], tokenize=False,
                                                   add_generation_prompt=True) for text in texts]

    def encode(self, prompts: list[str]) -> tuple[list[list[int]], list[int]]:
        return prompt_token_ids(self.tokenizer, prompts, self.settings.model.max_length, self.options["chat_template"])

    def token_ids(self, first: int, table: pa.Table) -> TokenWindow:
        return TokenWindow(first, *self.encode(self.prompts(table)))

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """Prompt plus the tokens it may generate: the KV cache grows with both."""
        return lengths + self.max_new_tokens

    def collate(self, window: Window, positions: np.ndarray) -> dict[str, Any]:
        """The padded prompts plus each row's global index (the key of its random stream)."""
        import torch

        inputs = super().collate(window, positions)
        index = torch.from_numpy(window.first + np.asarray(positions, dtype=np.int64))
        return {**inputs, "index": index.pin_memory() if self.pin else index}

    def processors(self, index, prompt_width: int) -> list:
        if not self.options["do_sample"]:
            return []
        from shardinfer.tasks.sampling import GumbelSampler

        o = self.options
        return [GumbelSampler(o["seed"], index, prompt_width, o["temperature"], o["top_p"])]

    def predict(self, batch: dict) -> dict:
        import torch

        inputs = self.on_device(batch)
        index = inputs.pop("index")
        rows, width = inputs["input_ids"].shape
        eos = torch.tensor(self.eos_ids, device=self.device) if self.eos_ids else None
        recorder = FinishRecorder(rows, width, eos, self.stop_criteria, self.device)
        out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1,
                                  num_return_sequences=1, pad_token_id=self.pad_id, eos_token_id=self.eos_ids or None,
                                  logits_processor=self.processors(index, width), stopping_criteria=[recorder])
        if out.shape[0] != rows:  # one sequence per prompt, whatever the model's generation_config says
            raise UserError(f"model.path `{self.settings.model.path}`: generate returned {out.shape[0]} sequences "
                            f"for {rows} prompts")
        generated = out[:, width:].cpu().numpy()
        steps = recorder.steps.cpu().numpy()
        counts = np.where(steps > 0, steps, generated.shape[1])
        return {"tokens": [generated[r, : counts[r]] for r in range(rows)],
                "n_prompt_tokens": inputs["attention_mask"].sum(dim=1).to(torch.int32),
                "finish": recorder.reason}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        tokens = results["tokens"]
        texts = self.tokenizer.batch_decode([row.tolist() for row in tokens], skip_special_tokens=True)
        finish = np.asarray(results["finish"]).astype(np.int64)
        stop = FINISH.index("stop")
        texts = [cut_at_stop(text, self.options["stop"]) if code == stop else text for text, code in zip(texts, finish)]
        counts = np.fromiter((len(row) for row in tokens), dtype=np.int32, count=len(tokens))
        self.generated_tokens += int(counts.sum())
        reasons = np.asarray(FINISH, dtype=object)[finish]
        return [pa.array(texts, type=pa.string()), pa.array(np.asarray(results["n_prompt_tokens"], dtype=np.int32)),
                pa.array(counts), pa.array(reasons, type=pa.string())]

    def finish(self) -> dict:
        return {"generated_tokens": self.generated_tokens}
