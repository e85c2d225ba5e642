"""Task generate on vLLM's engine (`shardinfer.engines.vllm` says what it keeps of the transformers
engine and what the engine gets): the task (`Generate`, without a transformers model) prepares
the prompts and writes the columns; the shard's windows are fed to one engine loop, a request per
row (`shardinfer.engines.vllm.feeder`), one seed per row, every output checked against its row
(`shardinfer.engines.vllm.matching`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from shardinfer.core.errors import UserError, first_line
from shardinfer.engines.vllm.checks import (
    SPANS_SETTING,
    Span,
    check_generation_settings,
    check_one_device,
    generation_config_of,
    generation_to_vllm,
)
from shardinfer.engines.vllm.fed import FedVllm
from shardinfer.engines.vllm.matching import engine_refused, rows_results
from shardinfer.tasks.base import LoadContext, Window
from shardinfer.tasks.generate.chat_content import vllm_content_format
from shardinfer.tasks.generate.params import PromptRows, RowParams, row_seed
from shardinfer.tasks.generate.task import Generate

log = logging.getLogger(__name__)


class VllmGenerate(FedVllm):
    """vLLM's offline engine in the shard job (`generate.vllm`: its `LLM` arguments): continuous
    batching, a paged KV cache and prefix caching, fed every window's prompts by one loop that keeps
    it full across windows; it may span several GPUs (tensor x pipeline parallel)."""

    devices_setting = SPANS_SETTING

    def __init__(self, llm, task: Generate, context: LoadContext, generation_config: dict, start_s: float = 0.0
                 ) -> None:
        super().__init__(llm, task, context, start_s)
        self.sampling_defaults = generation_to_vllm(generation_config, context.settings.model.path)
        if "min_tokens" in self.sampling_defaults:  # model.generate's min_new_tokens never outlasts max_new_tokens
            self.sampling_defaults["min_tokens"] = min(int(self.sampling_defaults["min_tokens"]), task.max_new_tokens)
        check_structured(task.options.structured)

    @classmethod
    def check_settings(cls, settings) -> None:
        """Installed, and what it is handed it can take."""
        check_generation_settings(settings.model.path, settings.model.adapter, settings.task_settings)

    @classmethod
    def check_unused(cls, settings) -> None:
        """Parallel sizes with another engine, which runs a model on one device."""
        check_one_device(settings.task_settings)

    @classmethod
    def devices(cls, section) -> int:
        """tensor_parallel_size x pipeline_parallel_size: the engine's workers, one per device."""
        return Span.of(section).workers

    @classmethod
    def load(cls, task_class: type[Generate], context: LoadContext) -> VllmGenerate:
        """The task without a transformers model (its tokenizer makes the prompts), and vLLM's engine."""
        model = context.settings.model
        tokenizer = cls.checked_tokenizer(context)
        config = generation_config_of(model.path)
        # vLLM's own detection of a chat template's content format: what `LLM.chat` would pass.
        task = task_class(None, tokenizer, tokenizer.pad_token_id or 0, context, config.get("eos_token_id"),
                          detect=vllm_content_format)
        llm, seconds = cls.start(context)
        return cls(llm, task, context, config, seconds)

    def collate(self, window: Window, positions: np.ndarray) -> dict:
        """The rows' prompt ids (an empty prompt as the pad token alone, as the transformers engine
        runs it: vLLM refuses an empty prompt), global indices, parameters, their images (None for a
        row without) and the refused rows' reasons (by position)."""
        rows: PromptRows = window.data
        pad_id = self.task.pad_id
        return {"ids": [rows.ids[p] if len(rows.ids[p]) else [pad_id] for p in positions],
                "index": (window.first + np.asarray(positions, dtype=np.int64)).tolist(),
                "params": [rows.params[p] for p in positions],
                "images": [rows.images[p] if rows.images is not None else None for p in positions],
                "refused": {k: rows.refused[p] for k, p in enumerate(positions) if p in rows.refused}}

    def sampling_params(self, params: RowParams, index: int):
        """A row's SamplingParams: its n samples seeded row_seed + j (vLLM seeds sample j so), its
        log-probabilities (flat: a few lists per completion, not a dict and objects per position;
        `matching.sample_logprobs`), structured output, penalties and logit_bias as asked."""
        from vllm import SamplingParams

        sampled = {"temperature": params.temperature, "top_p": params.top_p, "seed": row_seed(params.seed, index)}
        return SamplingParams(max_tokens=params.max_new_tokens, stop_token_ids=list(self.task.eos_ids),
                              stop=list(params.stop) or None, detokenize=bool(params.stop), skip_special_tokens=True,
                              n=params.n, logprobs=params.logprobs, flat_logprobs=True,
                              structured_outputs=structured_params(params.structured),
                              presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
                              logit_bias=dict(params.logit_bias) or None,
                              **(sampled if params.do_sample else {"temperature": 0.0}), **self.sampling_defaults)

    def request(self, batch: dict, position: int, row: int) -> tuple[dict, Any]:
        """A row's request for the engine loop (`feeder`): its prompt and SamplingParams, one output per
        request (what LLM.generate asks)."""
        from vllm.sampling_params import RequestOutputKind

        sampling = self.sampling_params(batch["params"][position], row)
        sampling.output_kind = RequestOutputKind.FINAL_ONLY
        return engine_prompt(batch["ids"][position], batch["images"][position]), sampling

    @staticmethod
    def refused(output) -> str | None:
        """Why the engine failed a finished row itself (None: it did not)."""
        return "vLLM ended the row with finish_reason 'error'" if engine_refused(output) else None

    def results(self, outputs: list, batch: dict, positions: list[int]) -> dict:
        """The task's results of a window's rows that did not fail (`positions`), each checked (`matching`)."""
        return rows_results(outputs, [batch["ids"][p] for p in positions], [batch["index"][p] for p in positions],
                            self.task.eos_ids, [batch["params"][p] for p in positions])

    def health_request(self) -> tuple[dict, Any]:
        """A request that shows the engine still runs a row: one greedy token after the pad token."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return ({"prompt_token_ids": [self.task.pad_id]},
                SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.FINAL_ONLY))


def engine_prompt(ids: list[int], images) -> dict:
    """A row's prompt for the engine: its ids, or with images (`generate_images.ImageRow`) the ids
    with one image token per image and the images, which vLLM expands itself (the row's `ids`, as
    the processor expanded them, are what its output must show it ran)."""
    if images is None:
        return {"prompt_token_ids": list(map(int, ids))}
    return {"prompt_token_ids": list(map(int, images.placeholder_ids)), "multi_modal_data": {"image": images.pictures}}


def structured_params(spec: dict | None):
    """`generate.structured` as vLLM's StructuredOutputsParams (json, regex or choice; whitespace is
    the engine's, `engine.engine_arguments`)."""
    if not spec:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    kind = next(kind for kind in ("json", "regex", "choice") if kind in spec)
    return StructuredOutputsParams(**{kind: spec[kind]})


def check_structured(spec: dict | None) -> None:
    """vLLM's own check of a spec against its xgrammar backend, before any row: a spec it refuses
    would fail every window's engine call."""
    if not spec:
        return
    from vllm import SamplingParams
    from vllm.exceptions import VLLMError
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    kind = next(iter(spec))
    try:
        validate_xgrammar_grammar(SamplingParams(structured_outputs=structured_params(spec)))
    except (VLLMError, ValueError, RuntimeError) as error:
        raise UserError(f"generate.structured.{kind}: vLLM's xgrammar backend refuses it ({first_line(error)})"
                        ) from None
