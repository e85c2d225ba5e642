"""Task generate on an OpenAI-compatible server (`generate.engine: server`): the task (`Generate`,
without a transformers model) makes the prompts and writes the columns, as for vLLM's in-process
engine; each row is a /v1/completions request (`replies.request_body`), sent by one loop over the
shard's windows (`feeder`), at most `concurrency` at once (`requests`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from shardinfer.engines.base import Engine
from shardinfer.engines.server.checks import check_server_settings, check_server_unused
from shardinfer.engines.server.endpoint import Served, ServerOptions, served
from shardinfer.engines.server.feeder import ServerFeeder
from shardinfer.engines.server.replies import Replies, request_body
from shardinfer.tasks.base import LoadContext, Window
from shardinfer.tasks.generate.params import PromptRows, RowParams
from shardinfer.tasks.generate.task import Generate


class ServerGenerate(Engine):
    """Rows as requests to a server that runs the model (vLLM, SGLang, TGI, llama.cpp, a hosted API):
    the shard job holds no device; the server batches the rows in flight continuously."""

    name = "server"
    options_key = "server"
    own_batches = True
    feeds = True

    def __init__(self, task: Generate, options: ServerOptions, found: Served, sampling_defaults: dict) -> None:
        super().__init__(task)
        from shardinfer.engines.server.requests import Requests

        self.options, self.served, self.sampling_defaults = options, found, sampling_defaults
        self.replies = Replies(found.dialect, task.eos_ids, task.tokenizer)
        self.requests = Requests(options)

    @classmethod
    def check_settings(cls, settings) -> None:
        """A server that answers, serves the model and can take what the settings ask."""
        check_server_settings(settings)

    @classmethod
    def check_unused(cls, settings) -> None:
        check_server_unused(settings)

    @classmethod
    def devices(cls, section) -> int:
        """None of the job's: the server holds the model."""
        return 0

    @classmethod
    def identity(cls, settings) -> dict:
        """What the server says of itself (model, version, fingerprint): another model behind the same
        URL gives other rows, so it reruns the shards."""
        options = ServerOptions.of(settings.task_settings)
        return served(options).identity(options)

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

    def finish(self) -> dict:
        """Beside the task's (generated_tokens): the server's model and build, and the requests sent."""
        build = self.served.fingerprint or "no fingerprint"
        return {**super().finish(), "engine": f"server {self.served.model} ({build})",
                "requests": self.requests.sent, "request_retries": self.requests.retried}

    def batches(self, window: Window, batch) -> list[np.ndarray]:
        """The whole window at once: the server schedules its rows continuously."""
        return [np.arange(window.rows)]

    def padded_tokens(self, window: Window, batches: list[np.ndarray]) -> int:
        return int(window.real.sum())

    def collate(self, window: Window, positions: np.ndarray) -> dict:
        """The rows' prompt ids (an empty prompt as the pad token alone, as the other engines run it),
        global indices, parameters and the refused rows' reasons (by position)."""
        rows: PromptRows = window.data
        pad_id = self.task.pad_id
        return {"ids": [rows.ids[p] if len(rows.ids[p]) else [pad_id] for p in positions],
                "index": (window.first + np.asarray(positions, dtype=np.int64)).tolist(),
                "params": [rows.params[p] for p in positions],
                "refused": {k: rows.refused[p] for k, p in enumerate(positions) if p in rows.refused}}

    def prompt(self, ids: list[int]):
        """The prompt as sent: its token ids, or their text (`generate.server.prompt: text`)."""
        ids = list(map(int, ids))
        if self.options.prompt == "tokens":
            return ids
        bos = self.task.tokenizer.bos_token_id
        if self.served.dialect != "vllm" and bos is not None and ids[:1] == [bos]:
            ids = ids[1:]  # the server adds its own (vLLM's dialect is told not to: add_special_tokens false)
        return self.task.tokenizer.decode(ids, skip_special_tokens=False)

    def sent_ids(self, ids: list[int]) -> list[int] | None:
        """The prompt ids the server must say it ran: those sent, when sent as ids."""
        return list(map(int, ids)) if self.options.prompt == "tokens" else None

    def post(self, ids: list[int], params: RowParams, index: int):
        """A row's request, sent: its reply's future."""
        body = request_body(self.served.model, self.prompt(ids), params, index, self.served.dialect,
                            self.task.eos_ids, self.sampling_defaults)
        return self.requests.post("/completions", body, index)

    def feed(self, take: Callable[[bool], Any], record: bool) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        """The shard's windows through one loop of requests (`feeder`), kept full across windows."""
        return ServerFeeder(self, record).run(take)

    def run(self, rows: dict) -> dict:
        """One window's rows alone, all answered before it returns."""
        count = len(rows["ids"])
        window = Window(int(rows["index"][0]) if count else 0, np.zeros(count, dtype=np.int64), None)
        items = iter([((), window, [(np.arange(count), rows)])])
        (_, results, _), = ServerFeeder(self, record=False).run(lambda wait: next(items, None))
        return results
