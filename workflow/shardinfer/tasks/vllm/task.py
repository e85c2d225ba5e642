"""Task generate on vLLM's engine (`shardinfer.tasks.vllm` says what it keeps of the transformers
engine and what the engine gets): the shard's windows fed to one engine loop, a request per row
(`shardinfer.tasks.vllm.feeder`), one seed per row, every output checked against its row
(`shardinfer.tasks.vllm.matching`).
"""

from __future__ import annotations

import gc
import hashlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardinfer.core.errors import UserError, first_line
from shardinfer.tasks.base import LoadContext, Window
from shardinfer.tasks.generate.chat_content import vllm_content_format
from shardinfer.tasks.generate.params import PromptRows, RowParams
from shardinfer.tasks.generate.task import Generate
from shardinfer.tasks.vllm.checks import (
    SPANS_SETTING,
    Span,
    check_vllm_settings,
    engine_identity,
    generation_config_of,
    generation_to_vllm,
    vllm_version,
)
from shardinfer.tasks.vllm.engine import start_engine
from shardinfer.tasks.vllm.feeder import Feeder

log = logging.getLogger(__name__)


def row_seed(seed: int, index: int) -> int:
    """A row's own 63-bit sampling seed from (generate.seed, its global row index)."""
    digest = hashlib.sha256(f"shardinfer/{int(seed)}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class VllmGenerate(Generate):
    """Generate with the prompts of the transformers engine, run by vLLM's engine."""

    own_batches = True
    devices_setting = SPANS_SETTING
    feeds_engine = True

    def __init__(self, engine, tokenizer, context: LoadContext, generation_config: dict, start_s: float = 0.0) -> None:
        super().__init__(None, tokenizer, tokenizer.pad_token_id or 0, context, generation_config.get("eos_token_id"))
        self.engine, self.start_s, self.context = engine, start_s, context
        self.restarts = 0
        self.sampling_defaults = generation_to_vllm(generation_config, context.settings.model.path)
        if "min_tokens" in self.sampling_defaults:  # model.generate's min_new_tokens never outlasts max_new_tokens
            self.sampling_defaults["min_tokens"] = min(int(self.sampling_defaults["min_tokens"]), self.max_new_tokens)
        self.lora = self.lora_request(context.settings.model.adapter)
        check_structured(self.options.structured)

    @classmethod
    def check_settings(cls, settings) -> None:
        """Task generate's checks, then the engine's: installed, and what it is handed it can take."""
        super().check_settings(settings)
        check_vllm_settings(settings.model.path, settings.model.adapter, settings.task_settings)

    @staticmethod
    def content_format(template: str | None) -> str:
        """vLLM's own detection of the chat template's content format: what `LLM.chat` would pass."""
        return vllm_content_format(template)

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
        return {**super().finish(), "engine_start_s": round(self.start_s, 3), "engine": vllm_version(),
                "engine_restarts": self.restarts}

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
        runs it: vLLM refuses an empty prompt), global indices, parameters, their images (None for a
        row without) and the refused rows' reasons (by position)."""
        rows: PromptRows = window.data
        return {"ids": [rows.ids[p] if len(rows.ids[p]) else [self.pad_id] for p in positions],
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
        return SamplingParams(max_tokens=params.max_new_tokens, stop_token_ids=list(self.eos_ids),
                              stop=list(params.stop) or None, detokenize=bool(params.stop), skip_special_tokens=True,
                              n=params.n, logprobs=params.logprobs, flat_logprobs=True,
                              structured_outputs=structured_params(params.structured),
                              presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
                              logit_bias=dict(params.logit_bias) or None,
                              **(sampled if params.do_sample else {"temperature": 0.0}), **self.sampling_defaults)

    def feed(self, take: Callable[[bool], Any], record: bool) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        """The shard's windows through one engine loop (`feeder`), kept full across windows."""
        return Feeder(self, record).run(take)

    def predict(self, batch: dict) -> dict:
        """One window alone in the engine, drained before it returns (no window fed beside it)."""
        rows = len(batch["ids"])
        window = Window(int(batch["index"][0]) if rows else 0, np.zeros(rows, dtype=np.int64), None)
        items = iter([((), window, [(np.arange(rows), batch)])])
        (_, results, _), = Feeder(self, record=False).run(lambda wait: next(items, None))
        return results

    def restart_engine(self) -> None:
        """A new engine in place of one that died: the old one shut down and released first."""
        old, self.engine = self.engine, None
        try:
            old.llm_engine.engine_core.shutdown()
        except Exception as error:  # noqa: BLE001 - a dead engine may fail to shut down cleanly
            log.warning("shutting the dead engine down failed (%s: %s)", type(error).__name__, first_line(error))
        del old
        gc.collect()
        self.engine, seconds = start_engine(self.context)
        self.start_s += seconds
        self.restarts += 1


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
