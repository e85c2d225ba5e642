"""Text generation with a causal language model: greedy, or sampled reproducibly per row; one or
several completions per row, with log-probabilities and structured output when asked.

Settings: `model.max_new_tokens` and the `generate:` section (`shardinfer.settings.sections.GenerateSettings`).
This module is the task and how the transformers engine runs it (`hf`: `model.generate`'s loop);
what every engine shares lives beside it: what the task refuses (`checks`), the prompts
(`prompts`: texts and conversations, as token ids; `chat_content`: their contents in the shape the
chat template takes), each row's parameters and seed (`params`), the
output columns and finish reasons (`columns`), log-probabilities (`logprobs`), structured output
(`structured`) and images for a vision-language model (`images`: `input.image_column`, through the
model's processor). `generate.engine: vllm` runs the same task on vLLM's engine
(`shardinfer.engines.vllm`), which loads the task without a transformers model.

- **Batches** are left-padded and hold rows with equal parameters only; a row costs its prompt
  tokens plus `max_new_tokens`, times n (the KV cache grows with both). transformers' own
  `generate` loop runs a batch until all its rows are done.
- **Greedy** is plain argmax; **sampling** is greedy over scores plus per-row Gumbel noise
  (`shardinfer.tasks.generate.sampling`), so a sample depends only on its prompt, the seed, its row's global
  index and its number. The model's own generation_config processors (e.g. a repetition penalty)
  apply as in `model.generate`; its sampling settings do not, the `generate:` section's do.
- **Several samples** (n > 1): the batch's prompts are run through the model once, their KV cache
  repeated n times, and generation goes on from there for all n x rows sequences (`prefill_once`).
- Processors run in vLLM's order: the grammar mask, the log-probability recorder, the sampler.
- **Finish**: eos (the tokenizer's and the generation_config's eos ids), a stop string
  (transformers' StopStringCriteria; one may end inside the token that completes it), or length.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from shardinfer.contract.shard_file import IMAGES_READ
from shardinfer.core.errors import RowError, UserError
from shardinfer.core.model_folder import architectures, vocab_size
from shardinfer.hf.batching import length_sorted_batches, pad_batch
from shardinfer.hf.tokens import TokenWindow
from shardinfer.input.formats.openai_batch import NAME as BATCH_FORMAT
from shardinfer.settings.config import BatchSettings, ModelSettings, Settings
from shardinfer.settings.schema import defaults
from shardinfer.tasks.base import TaskInputs, Window, tokenize_ahead_refused
from shardinfer.tasks.generate.chat_content import content_format, template_text
from shardinfer.tasks.generate.checks import (
    check_generate_section,
    check_max_new_tokens,
    check_positions,
    names_a_generator,
    not_a_generator,
)
from shardinfer.tasks.generate.columns import COLUMNS, Columns, output_fields
from shardinfer.tasks.generate.params import (
    PromptRows,
    RowParams,
    batch_limits,
    lines_carry_parameters,
)
from shardinfer.tasks.generate.prompts import (
    Conversations,
    prompt_problem,
    prompt_token_ids,
    refuse_without_template,
    text_prompts,
)
from shardinfer.tasks.text import TextTask
from shardinfer.tasks.traits import PlanCost, Reporting

log = logging.getLogger(__name__)


def warn_short_choices(tokenizer, params: RowParams) -> None:
    """A choice longer than max_new_tokens allows (its tokens and eos) can only end cut, and invalid."""
    choices = (params.structured or {}).get("choice") or []
    longest = max((len(tokenizer(choice, add_special_tokens=False)["input_ids"]) for choice in choices), default=0)
    if longest + 1 > params.max_new_tokens:
        log.warning("WARNING generate.structured.choice: the longest choice takes %d tokens and eos, more than "
                    "model.max_new_tokens %d: rows that pick it end cut, and invalid", longest, params.max_new_tokens)


def eos_token_ids(tokenizer, configured) -> list[int]:
    """The tokenizer's eos and the generation_config's (`configured`: an id or a list; chat models
    often add a turn end)."""
    configured = [configured] if isinstance(configured, int) else list(configured or [])
    ids = [tokenizer.eos_token_id, *configured]
    return sorted({int(i) for i in ids if i is not None})


def vocab_size_of(model: ModelSettings, loaded=None) -> int | None:
    """The token ids the model can embed: its (text) config's vocab_size, from the loaded model or,
    for vLLM's engine, from its folder (`model_folder.vocab_size`). A tokenizer may know more (added tokens)."""
    if loaded is None:
        return vocab_size(model.path)
    size = getattr(loaded.model.config.get_text_config(), "vocab_size", None)
    return int(size) if isinstance(size, int) else None


@dataclass(frozen=True)
class GenerateCost(PlanCost):
    """A row's prompt, plus what it generates and the tokens its images expand into."""

    def overhead(self, settings: Settings) -> int:
        """Each row may add max_new_tokens to its prompt in the KV cache, n times: the plan counts them too."""
        return int(settings.model.max_new_tokens or 0) * settings.task_settings.n

    def image_params(self, settings: Settings) -> dict:
        """An image costs the tokens the model's processor expands it into (estimated from its config)."""
        if not settings.input.image_columns:
            return {}
        from shardinfer.tasks.generate.images import image_token_estimate

        return {"image_cost": image_token_estimate(settings.model.path)}


class Generate(TextTask):
    name = "generate"
    auto_class = "AutoModelForCausalLM"
    padding_side = "left"
    tokenizes_ahead = False  # prompts go through the chat template and are cut from the left, in the shard job
    reads_conversations = True  # input.messages_column
    reads_images = True  # input.image_column (shardinfer.tasks.generate.images)
    cost = GenerateCost()
    # evaluate: exact match of `generated` with the reference (shardinfer.scores.metrics)
    reporting = Reporting(scored_as="texts", compared={"texts": "generated"},
                          totals={"generated_tokens": "generated tokens/s"})
    outputs = COLUMNS  # at the section's defaults; `output_fields` gives the settings' own
    engines = ("transformers", "vllm", "server")  # generate.engine (shardinfer.engines)

    def __init__(self, loaded, tokenizer, pad_id: int, context, configured_eos=None, detect=content_format) -> None:
        """`configured_eos`: the generation_config's eos id(s) when there is no loaded model to ask;
        `detect`: how a chat template's content format is found (`chat_content`: vLLM's rule read here;
        vLLM's engine hands vLLM's own)."""
        super().__init__(loaded, tokenizer, pad_id, context)
        self.detect = detect
        settings = context.settings
        self.options, self.params = settings.task_settings, RowParams.of(settings)
        self.max_new_tokens = int(settings.model.max_new_tokens)
        if loaded is not None:
            configured_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        self.eos_ids = eos_token_ids(tokenizer, configured_eos)
        self.vocab_size = vocab_size_of(settings.model, loaded)
        self.max_model_len = settings.model.max_length + self.max_new_tokens
        # The tokenizer's template's content format (`chat_content`), where a prompt goes through it.
        templated = self.options.chat_template or settings.input.conversation_columns
        self.form = self.detect(template_text(tokenizer) if templated else None)
        self.conversations = self.conversation_renderer(settings)
        self.images = self.image_prompts(settings)
        self.output = Columns(tokenizer, settings)
        warn_short_choices(tokenizer, self.params)
        self.engine = self.transformers_engine() if loaded is not None else None
        self.generated_tokens = 0

    @classmethod
    def output_fields(cls, settings: Settings) -> dict:
        return output_fields(settings)  # `outputs` at the defaults, more or lists as the settings ask

    @classmethod
    def inputs(cls, inp: dict, section: dict) -> TaskInputs:
        """The text column, or instead the conversations of `input.messages_column`, or an OpenAI
        batch file's conversations and each line's parameters (its `messages` and `request`); then the
        images of `input.image_column`, when named."""
        if inp.get("format") == BATCH_FORMAT:
            if (inp.get("messages_column") is not None or inp.get("image_column") is not None
                    or inp["text_column"] != defaults("input")["text_column"]):
                raise UserError(f"input.format {BATCH_FORMAT}: each line's body.messages is the prompt; leave "
                                "input.messages_column, input.text_column and input.image_column out")
            keys = (f"input.format {BATCH_FORMAT}",) * 2
            return TaskInputs(("messages", "request"), keys, (), ("messages",))
        column, images = inp.get("messages_column"), inp.get("image_column")
        if column is None:
            reads = super().inputs(inp, section)
        elif inp["text_column"] != defaults("input")["text_column"]:
            raise UserError(f"input.messages_column `{column}` and input.text_column `{inp['text_column']}` both name "
                            "the prompts; give one (a conversation column replaces the text column)")
        else:
            reads = TaskInputs((column,), ("input.messages_column",), (), (column,))
        if images is None:
            return reads
        if images in reads.columns:
            raise UserError(f"input.image_column `{images}` is the prompts' column too; name the column of images")
        return TaskInputs((*reads.columns, images), (*reads.keys, "input.image_column"), reads.texts,
                          reads.conversations, (images,))

    @classmethod
    def request_limits(cls, inp: dict, model: ModelSettings, section: dict) -> dict:
        return batch_limits(model, section) if inp.get("format") == BATCH_FORMAT else {}

    @classmethod
    def model_class(cls, settings: Settings) -> str:
        """A vision-language model's class when images are read, else a causal language model's."""
        return "AutoModelForImageTextToText" if settings.input.image_columns else cls.auto_class

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """A model folder with a generation head, a token count to generate, and room for both."""
        super().check_settings(settings)
        model = settings.model
        check_max_new_tokens(model)
        if settings.tokenize_ahead:
            raise tokenize_ahead_refused(cls.name, "tokenizes its prompts in the shard job (set tokenize.ahead: false)")
        named = architectures(model.path)
        if not names_a_generator(named):
            raise UserError(f"model.path `{model.path}` holds {', '.join(named)}, not a causal language model "
                            "(…ForCausalLM) with a generation head; task generate needs one")
        check_positions(model)
        check_generate_section(settings)
        if settings.input.image_columns:
            from shardinfer.tasks.generate.images import check_image_settings

            check_image_settings(settings)

    def check(self) -> None:
        """A loaded model that can generate; without one (vLLM's engine loads its own), the engine
        refuses what it cannot load when it starts."""
        if self.loaded is None:
            return
        reason = not_a_generator(self.loaded)
        if reason:
            raise UserError(f"model.path `{self.settings.model.path}` cannot generate text for task generate: {reason}")

    def transformers_engine(self):
        from shardinfer.tasks.generate.hf import HfEngine

        return HfEngine(self.model, self.tokenizer, self.settings, self.eos_ids, self.pad_id, self.device)

    def conversation_renderer(self, settings: Settings) -> Conversations | None:
        if settings.input.conversation_columns:
            refuse_without_template(self.tokenizer, settings.model.path, "input.messages_column")
            column = settings.input.conversation_columns[0]
            where = (f"input.format {BATCH_FORMAT}'s body.messages" if lines_carry_parameters(settings)
                     else f"input.messages_column `{column}`")
            return Conversations(self.tokenizer, settings.model.max_length, self.options.system_prompt, where,
                                 self.form)
        if self.options.chat_template:
            refuse_without_template(self.tokenizer, settings.model.path, "generate.chat_template")
        return None

    def image_prompts(self, settings: Settings):
        """The prompts' renderer with images (`input.image_column`), or None."""
        if not settings.input.image_columns:
            return None
        from shardinfer.tasks.generate.images import ImagePrompts, load_processor

        processor = load_processor(settings)
        return ImagePrompts(processor, settings, self.options.chat_template, self.options.system_prompt,
                            self.detect(template_text(processor)))

    def prompt_rows(self, first: int, table: pa.Table) -> tuple[TokenWindow, dict[int, str]]:
        """The window's prompts as token ids, and the rows refused (position -> why)."""
        values = table.column(0).combine_chunks()
        if self.images is not None:
            return self.images.window(first, values, table.column(1).combine_chunks())
        if self.conversations is not None:
            return self.conversations.window(first, values)
        prompts, lost = text_prompts(self.tokenizer, values, self.null_as_empty, self.options.chat_template,
                                     self.options.system_prompt, self.form)
        key = f"input.text_column `{self.settings.input.text_column}`"
        return (TokenWindow(first, *prompt_token_ids(self.tokenizer, prompts, self.settings.model.max_length,
                                                     self.options.chat_template)),
                {position: f"{key}, row {first + position}: {why}" for position, why in lost.items()})

    def prepare(self, first: int, table: pa.Table) -> Window:
        tokens, refused = self.prompt_rows(first, table)
        params = self.row_params(table)
        refused = {**self.refused_prompts(first, tokens.ids, params, refused), **refused}
        if refused and not self.settings.row_errors.record:
            problem = refused[min(refused)]
            raise UserError(f"{problem} ({len(refused)} such row(s) in this window; fix the input, or set "
                            "row_errors.mode: record to write them as row errors)")
        lengths = np.fromiter((max(len(row), 1) for row in tokens.ids), dtype=np.int64, count=len(tokens.ids))
        costs = np.array([(length + p.max_new_tokens) * p.n for length, p in zip(lengths, params)], dtype=np.int64)
        images = tokens.token_data.get("images")
        return Window(first, costs, PromptRows(tokens.ids, params, refused, images), lengths, tokens.truncated)

    def row_params(self, table: pa.Table) -> list[RowParams]:
        """Each row's parameters: the config's, or an OpenAI batch file's line's own (its `request`)."""
        if not lines_carry_parameters(self.settings):
            return [self.params] * table.num_rows
        requests = table.column(1).to_pylist()
        return [self.params.of_request(json.loads(request)) for request in requests]

    def refused_prompts(self, first: int, ids: list[list[int]], params: list[RowParams], refused: dict[int, str]
                        ) -> dict[int, str]:
        """The rows whose prompt no engine should see (`prompt_problem`), by window position: the
        refused conversations aside, which have no prompt."""
        found = {}
        for position, (row, p) in enumerate(zip(ids, params)):
            if position not in refused:
                problem = prompt_problem(row, p.max_new_tokens, self.max_model_len, self.vocab_size)
                if problem:
                    found[position] = f"row {first + position}: {problem}"
        return found

    def batches(self, window: Window, batch: BatchSettings) -> list[np.ndarray]:
        """Length-sorted batches of rows with equal parameters (and images, or none), n sequences
        counted per row."""
        rows: PromptRows = window.data
        groups: dict[tuple, list[int]] = {}
        for position, params in enumerate(rows.params):
            groups.setdefault((params.batch_key, rows.has_images(position)), []).append(position)
        batches = []
        for positions in groups.values():
            positions = np.asarray(positions, dtype=np.int64)
            most = max(1, batch.max_rows // rows.params[positions[0]].n)
            batches += [positions[b] for b in length_sorted_batches(window.costs[positions], batch.max_tokens, most)]
        return batches

    def collate(self, window: Window, positions: np.ndarray) -> dict[str, Any]:
        """The padded prompts, each row's global index (the key of its random streams), the batch's
        parameters and the refused rows' reasons."""
        import torch

        rows: PromptRows = window.data
        ids = [rows.ids[p] if len(rows.ids[p]) else [self.pad_id] for p in positions]
        index = torch.from_numpy(window.first + np.asarray(positions, dtype=np.int64))
        if rows.has_images(positions[0]):  # the batch's rows all have images (`batches`)
            from shardinfer.tasks.generate.images import processor_batch

            inputs = processor_batch(self.images.processor, [rows.images[p] for p in positions], ids, self.pad_id)
        else:
            input_ids, mask = pad_batch(ids, self.pad_id, self.left)
            inputs = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        inputs["index"] = index
        if self.with_token_types and "pixel_values" not in inputs:  # one segment, for a model that takes them
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        inputs = {name: t.pin_memory() for name, t in inputs.items()} if self.pin else inputs
        return {**inputs, "params": [rows.params[p] for p in positions],
                "refused": [rows.refused[p] for p in positions if p in rows.refused]}

    def predict(self, batch: dict) -> dict:
        if batch["refused"]:  # record: the runner narrows this down to the refused rows alone
            raise RowError(batch["refused"][0])
        params = batch["params"]
        inputs = self.on_device({name: t for name, t in batch.items() if name not in ("params", "refused")})
        completions = self.engine.run(inputs, params[0])
        return {"n_prompt_tokens": inputs["attention_mask"].sum(dim=1).cpu().numpy().astype(np.int32),
                "completions": completions, "params": params}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        columns, generated = self.output.arrays(results)
        self.generated_tokens += generated
        return columns

    def finish(self) -> dict:
        """The generated tokens, and the image files read by path (gather proves them unchanged)."""
        read = self.images.read if self.images is not None else None
        return {"generated_tokens": self.generated_tokens, **({IMAGES_READ: dict(read)} if read else {})}
