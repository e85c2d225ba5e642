"""What every server engine does the same way, whatever its task (`generate`: completions; `embed`:
embeddings): no device of the job's, the server's identity in the shard digest, the rows as token
ids (or their text), every window whole, one loop of requests over the shard's windows (`feeder`),
at most `concurrency` in flight (`requests`), and the requests counted in the shard's summary. A
subclass says what a row's request is (`body`) and what its answers become (`results`,
`refused`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from shardinfer.engines.base import Engine
from shardinfer.engines.server.checks import check_server_settings, check_server_unused
from shardinfer.engines.server.endpoint import Served, ServerOptions, served
from shardinfer.engines.server.feeder import ServerFeeder
from shardinfer.tasks.base import Task, Window


class ServerEngine(Engine):
    """Rows as requests to a server that runs the model: the shard job holds no device; the server
    batches the rows in flight continuously. Subclasses implement `load`, `body` and `results`."""

    name = "server"
    options_key = "server"
    own_batches = True
    feeds = True

    def __init__(self, task: Task, options: ServerOptions, found: Served) -> None:
        super().__init__(task)
        from shardinfer.engines.server.requests import Requests

        self.options, self.served = options, found
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
        options = ServerOptions.of(settings.task_settings, settings.model.task)
        return served(options).identity(options)

    def finish(self) -> dict:
        """Beside the task's: the server's model and build, and the requests sent."""
        build = self.served.fingerprint or "no fingerprint"
        return {**super().finish(), "engine": f"server {self.served.model} ({build})",
                "requests": self.requests.sent, "request_retries": self.requests.retried}

    def batches(self, window: Window, batch) -> list[np.ndarray]:
        """The whole window at once: the server schedules its rows continuously."""
        return [np.arange(window.rows)]

    def padded_tokens(self, window: Window, batches: list[np.ndarray]) -> int:
        return int(window.real.sum())

    def prompt(self, ids: list[int]):
        """The prompt as sent: its token ids, or their text (`<task>.server.prompt: text`)."""
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

    def body(self, batch: dict, position: int, row: int) -> dict:
        """A row's request body."""
        raise NotImplementedError

    def post(self, batch: dict, position: int, row: int):
        """A row's request, sent: its reply's future."""
        return self.requests.post(self.options.endpoint, self.body(batch, position, row), row)

    def refused(self, answer: dict) -> str | None:
        """Why the server failed a row it answered (None: it did not)."""
        return None

    def results(self, answers: list[dict], batch: dict, positions: list[int]) -> dict:
        """The task's results of a window's rows that did not fail (`positions`), from their answers."""
        raise NotImplementedError

    def feed(self, take: Callable[[bool], Any], record: bool) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        """The shard's windows through one loop of requests (`feeder`), kept full across windows."""
        return ServerFeeder(self, record).run(take)

