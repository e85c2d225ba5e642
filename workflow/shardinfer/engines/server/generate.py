"""Task generate on an OpenAI-compatible server (`generate.engine: server`): the task (`Generate`,
without a transformers model) makes the prompts and writes the columns, as for vLLM's in-process
engine; each row is a /v1/completions request (`replies.request_body`), sent by one loop over the
shard's windows (`feeder`), at most `concurrency` at once (`requests`).
"""

from __future__ import annotations

import numpy as np

from shardinfer.engines.server.checks import check_server_settings
from shardinfer.engines.server.endpoint import Served, ServerOptions
from shardinfer.engines.server.engine import ServerEngine
from shardinfer.engines.server.replies import Replies, request_body
from shardinfer.tasks.base import LoadContext, Window
from shardinfer.tasks.generate.params import PromptRows
from shardinfer.tasks.generate.task import Generate


class ServerGenerate(ServerEngine):
    """Completions from a server that runs the model (vLLM, SGLang, TGI, llama.cpp, a hosted API)."""

    def __init__(self, task: Generate, options: ServerOptions, found: Served, sampling_defaults: dict) -> None:
        super().__init__(task, options, found)
        self.sampling_defaults = sampling_defaults
        self.replies = Replies(found.dialect, task.eos_ids, task.tokenizer)

    @classmethod
    def load(cls, task_class: type[Generate], context: LoadContext) -> ServerGenerate:
        """The task without a transformers model (its tokenizer makes the prompts), and the server
        asked again what it serves."""
        from shardinfer.engines.vllm.checks import generation_config_of, generation_to_vllm
        from shardinfer.hf.models import load_tokenizer

        settings = context.settings
        found = check_server_settings(settings)
        tokenizer = load_tokenizer(settings.model)
        config = generation_config_of(settings.model.path)
        task = task_class(None, tokenizer, tokenizer.pad_token_id or 0, context, config.get("eos_token_id"))
        defaults = generation_to_vllm(config, settings.model.path) if found.dialect == "vllm" else {}
        if "min_tokens" in defaults:  # as the in-process engine: never more than max_new_tokens
            defaults["min_tokens"] = min(int(defaults["min_tokens"]), task.max_new_tokens)
        return cls(task, ServerOptions.of(settings.task_settings), found, defaults)

    def collate(self, window: Window, positions: np.ndarray) -> dict:
        """The rows' prompt ids (an empty prompt as the pad token alone, as the other engines run it),
        global indices, parameters and the refused rows' reasons (by position)."""
        rows: PromptRows = window.data
        pad_id = self.task.pad_id
        return {"ids": [rows.ids[p] if len(rows.ids[p]) else [pad_id] for p in positions],
                "index": (window.first + np.asarray(positions, dtype=np.int64)).tolist(),
                "params": [rows.params[p] for p in positions],
                "refused": {k: rows.refused[p] for k, p in enumerate(positions) if p in rows.refused}}

    def body(self, batch: dict, position: int, row: int) -> dict:
        """A row's /v1/completions body (`replies.request_body`)."""
        return request_body(self.served.model, self.prompt(batch["ids"][position]), batch["params"][position], row,
                            self.served.dialect, self.task.eos_ids, self.sampling_defaults)

    def refused(self, answer: dict) -> str | None:
        return self.replies.refused(answer)

    def results(self, answers: list[dict], batch: dict, positions: list[int]) -> dict:
        """Each answer as its row's completions, checked (`replies.completions`)."""
        ids, params, index = batch["ids"], batch["params"], batch["index"]
        completions = [self.replies.completions(answer, self.sent_ids(ids[p]), params[p], int(index[p]))
                       for answer, p in zip(answers, positions)]
        return {"n_prompt_tokens": np.fromiter((len(ids[p]) for p in positions), dtype=np.int32, count=len(positions)),
                "completions": completions, "params": [params[p] for p in positions]}
