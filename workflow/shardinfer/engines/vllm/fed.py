"""What every vLLM engine of the workflow does the same way, whatever it runs (generation,
`generate`; the pooling runner, `pooling`): one `LLM` in the shard job, fed the shard's windows by
one loop (`feeder`) that keeps it full across windows, a window handed to it whole, started again
in place when it dies, and the start-up and build in the shard's summary. A subclass says how the
engine starts (`arguments`: its `LLM(...)` keyword arguments) and what a row's request and result
are (`request`, `results`, `refused`, `health_request`: what `feeder.Feeder` calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from shardinfer.engines.base import Engine
from shardinfer.engines.vllm.checks import engine_identity, vllm_version
from shardinfer.engines.vllm.engine import lora_request, start_engine, stop_engine
from shardinfer.engines.vllm.feeder import Feeder
from shardinfer.tasks.base import LoadContext, Task, Window


class FedVllm(Engine):
    """A vLLM engine in the shard job, fed every window by one loop; subclasses implement `load`,
    `collate`, `request`, `results`, `refused` and `health_request`."""

    name = "vllm"
    options_key = "vllm"
    own_batches = True
    feeds = True

    def __init__(self, llm, task: Task, context: LoadContext, start_s: float = 0.0) -> None:
        super().__init__(task)
        self.llm, self.context, self.start_s, self.restarts = llm, context, start_s, 0
        self.lora = lora_request(context.settings.model.adapter)

    @classmethod
    def arguments(cls, context: LoadContext) -> dict | None:
        """Its `LLM(...)` keyword arguments; None: generation's (`engine.engine_arguments`)."""
        return None

    @classmethod
    def start(cls, context: LoadContext):
        """The engine started for the context: (the LLM, seconds its start took)."""
        return start_engine(context, cls.arguments(context))

    @staticmethod
    def checked_tokenizer(context: LoadContext):
        """The model's tokenizer, its weight files (and the adapter's) checked first: vLLM would load
        pickle weights too."""
        from shardinfer.hf.models import check_weight_files, load_tokenizer

        model = context.settings.model
        check_weight_files(model.path, model.allow_pickle, "model.path")
        if model.adapter is not None:
            check_weight_files(model.adapter, model.allow_pickle, "model.adapter")
        return load_tokenizer(model)

    @classmethod
    def identity(cls, settings) -> dict:
        """The engine's build and version: another version may give other rows."""
        return engine_identity(settings.task_settings)

    def finish(self) -> dict:
        """Beside the task's: the engine's start-up, its restarts and the build this job ran (the
        digest has the one where Snakemake loaded the workflow)."""
        return {**super().finish(), "engine_start_s": round(self.start_s, 3), "engine": vllm_version(),
                "engine_restarts": self.restarts}

    def batches(self, window: Window, batch) -> list[np.ndarray]:
        """The whole window in one call: the engine schedules its rows continuously."""
        return [np.arange(window.rows)]

    def padded_tokens(self, window: Window, batches: list[np.ndarray]) -> int:
        """None: the KV cache is paged, each row holds its own tokens only."""
        return int(window.real.sum())

    def feed(self, take: Callable[[bool], Any], record: bool) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        """The shard's windows through one engine loop (`feeder`), kept full across windows."""
        return Feeder(self, record).run(take)


    def restart(self) -> None:
        """A new engine in place of one that died: the old one shut down and released first."""
        old, self.llm = self.llm, None
        stop_engine(old)
        self.llm, seconds = self.start(self.context)
        self.start_s += seconds
        self.restarts += 1
