"""Task generate on vLLM's engine (`shardinfer.tasks.vllm` says what it keeps of the transformers
engine and what the engine gets): whole windows in one enqueue, one seed per row, every output
matched to its row (`shardinfer.tasks.vllm.matching`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from shardinfer.errors import UserError, first_line
from shardinfer.tasks.base import LoadContext, Window
from shardinfer.tasks.generate import Generate
from shardinfer.tasks.generate_params import PromptRows, RowParams
from shardinfer.tasks.vllm.checks import (
    SPANS_SETTING,
    Span,
    check_vllm_settings,
    engine_identity,
    generation_config_of,
    generation_to_vllm,
    vllm_version,
)
from shardinfer.tasks.vllm.engine import EngineProgress, start_engine
from shardinfer.tasks.vllm.matching import matched_results


def row_seed(seed: int, index: int) -> int:
    """A row's own 63-bit sampling seed from (generate.seed, its global row index)."""
    digest = hashlib.sha256(f"shardinfer/{int(seed)}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class VllmGenerate(Generate):
    """Generate with the prompts of the transformers engine, run by vLLM's engine."""

    own_batches = True
    devices_setting = SPANS_SETTING

    def __init__(self, engine, tokenizer, context: LoadContext, generation_config: dict, start_s: float = 0.0) -> None:
        super().__init__(None, tokenizer, tokenizer.pad_token_id or 0, context, generation_config.get("eos_token_id"))
        self.engine, self.start_s = engine, start_s
        self.sampling_defaults = generation_to_vllm(generation_config, context.settings.model.path)
        if "min_tokens" in self.sampling_defaults:  # model.generate's min_new_tokens never outlasts max_new_tokens
            self.sampling_defaults["min_tokens"] = min(int(self.sampling_defaults["min_tokens"]), self.max_new_tokens)
        self.lora = self.lora_request(context.settings.model.adapter)
        check_structured(self.options.structured)

    @classmethod
    def check_settings(cls, settings) -> None:
        """Task generate's checks, then the engine's: installed, and what it is handed it can take."""
        super().check_settings(settings)
        if settings.row_errors.record:
            raise UserError("row_errors.mode: record is not supported with generate.engine: vllm, whose engine "
                            "takes a window of rows whole; use row_errors.mode: fail or generate.engine: transformers")
        check_vllm_settings(settings.model.path, settings.model.adapter, settings.task_settings)

    @classmethod
    def devices(cls, section: dict) -> int:
        """tensor_parallel_size x pipeline_parallel_size: the engine's workers, one per device."""
        return Span.of(section).workers

    @classmethod
    def identity(cls, settings) -> dict:
        """The engine's build and version: another version may give other text."""
        return engine_identity(settings.task_settings)

    @classmethod
    def load(cls, context: LoadContext) -> VllmGenerate:
        from shardinfer.hf.models import check_weight_files, load_tokenizer

        model = context.settings.model
        check_weight_files(model.path, model.allow_pickle, "model.path")  # vLLM would load pickle weights too
        if model.adapter is not None:
            check_weight_files(model.adapter, model.allow_pickle, "model.adapter")
        tokenizer = load_tokenizer(model)
        config = generation_config_of(model.path)
        engine, seconds = start_engine(context)
        return cls(engine, tokenizer, context, config, seconds)

    def finish(self) -> dict:
        """Beside generated_tokens: the engine's start-up and the build this job ran (the digest has
        the one where Snakemake loaded the workflow)."""
        return {**super().finish(), "engine_start_s": round(self.start_s, 3), "engine": vllm_version()}

    def check(self) -> None:
        """vLLM refuses what it cannot load (an architecture it lacks, missing weights) when it starts."""

    @staticmethod
    def lora_request(adapter: str | None):
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest("adapter", 1, str(Path(adapter).resolve()))

    def batches(self, window: Window, batch) -> list[np.ndarray]:
        """The whole window in one call: the engine schedules its rows continuously."""
        return [np.arange(window.rows)]

    def padded_tokens(self, window: Window, batches: list[np.ndarray]) -> int:
        """None: the KV cache is paged, each row holds its own tokens only."""
        return int(window.real.sum())

    def collate(self, window: Window, positions: np.ndarray) -> dict:
        """The rows' prompt ids (an empty prompt as the pad token alone, as the transformers engine
        runs it: vLLM refuses an empty prompt), global indices and parameters, and their images
        (None for a row without)."""
        rows: PromptRows = window.data
        return {"ids": [rows.ids[p] if len(rows.ids[p]) else [self.pad_id] for p in positions],
                "index": (window.first + np.asarray(positions, dtype=np.int64)).tolist(),
                "params": [rows.params[p] for p in positions],
                "images": [rows.images[p] if rows.images is not None else None for p in positions]}

    def sampling_params(self, params: RowParams, index: int):
        """A row's SamplingParams: its n samples seeded row_seed + j (vLLM seeds sample j so), its
        log-probabilities and structured output as asked."""
        from vllm import SamplingParams

        sampled = {"temperature": params.temperature, "top_p": params.top_p, "seed": row_seed(params.seed, index)}
        return SamplingParams(max_tokens=params.max_new_tokens, stop_token_ids=list(self.eos_ids),
                              stop=list(params.stop) or None, detokenize=bool(params.stop), skip_special_tokens=True,
                              n=params.n, logprobs=params.logprobs,
                              structured_outputs=structured_params(params.structured),
                              **(sampled if params.do_sample else {"temperature": 0.0}), **self.sampling_defaults)

    def predict(self, batch: dict) -> dict:
        """One enqueue of the batch's prompts; every output matched to its row by request id."""
        ids, index, params = batch["ids"], batch["index"], batch["params"]
        prompts = [engine_prompt(row, images) for row, images in zip(ids, batch["images"])]
        from vllm import RequestOutput
        from vllm.exceptions import VLLMError

        try:
            sampling = [self.sampling_params(p, i) for p, i in zip(params, index)]
            request_ids = self.engine.enqueue(prompts, sampling, lora_request=self.lora, use_tqdm=False)
            outputs = self.engine.wait_for_completion(RequestOutput, use_tqdm=EngineProgress)
        except (VLLMError, RuntimeError, ValueError, IndexError, KeyError, TypeError) as error:
            raise UserError(f"vLLM failed on rows {index[0]}..{index[-1]} ({type(error).__name__}: "
                            f"{first_line(error)}); the shard's table was not written") from error
        return matched_results(request_ids, outputs, ids, index, self.eos_ids, params)


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
