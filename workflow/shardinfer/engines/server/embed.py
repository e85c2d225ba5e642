"""Task embed on an OpenAI-compatible server's `/v1/embeddings` (`embed.engine: server`): vLLM's
(`vllm serve <model> --runner pooling`), SGLang's, TEI's or a hosted embeddings API. The task
(`Embed`, without a transformers model) makes each row's token ids as on the other engines
(truncation at model.max_length) and writes the column; each row is one request
(`endpoint.embedding_body`: its ids, or their text, the vector asked as float32 in base64), sent by
the loop the generate engine's rows go through (`feeder`).

- **A vLLM server** is asked for the pooled state raw (`use_activation: false`), which the task
  normalises with `embed.normalize` (`Embed.from_pooled`), as on the transformers and in-process vLLM
  engines: the same vectors, where the server pools as `embed.pooling` says (vLLM: `--pooler-config`;
  the pooling is the server's, fixed when it starts, so `embed.pooling` other than its default is
  refused with this engine, `checks.check_pooling`).
- **Another server** gives its own vectors (most normalise them); `embed.normalize: true` scales
  them to unit length again.
- **Checked**: one vector per answer, of one width across the shard, and where the prompt went as
  token ids, the server's count of prompt tokens (`usage.prompt_tokens`) equal to those sent.
"""

from __future__ import annotations

import base64

import numpy as np

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import model_config, vocab_size
from shardinfer.engines.server.checks import check_server_settings
from shardinfer.engines.server.endpoint import Served, ServerOptions, embedding_body
from shardinfer.engines.server.engine import ServerEngine
from shardinfer.hf.tokens import outside_vocabulary
from shardinfer.tasks.base import LoadContext, Task, Window


class ServerEmbed(ServerEngine):
    """Embeddings from a server that runs the model; its vectors normalised as `embed.normalize` says."""

    def __init__(self, task: Task, options: ServerOptions, found: Served) -> None:
        super().__init__(task, options, found)
        self.vocab_size = vocab_size(task.settings.model.path)
        self.width: int | None = None  # the vectors' width, fixed by the first answer

    @classmethod
    def load(cls, task_class: type[Task], context: LoadContext) -> ServerEmbed:
        """The task without a transformers model (its tokenizer makes the rows' ids), and the server
        asked again what it serves."""
        from shardinfer.hf.models import load_tokenizer, pad_id_of

        settings = context.settings
        found = check_server_settings(settings)
        tokenizer = load_tokenizer(settings.model)
        task = task_class(None, tokenizer, pad_id_of(tokenizer, model_config(settings.model.path).get("pad_token_id")),
                          context)
        return cls(task, ServerOptions.of(settings.task_settings, "embed"), found)

    def collate(self, window: Window, positions: np.ndarray) -> dict:
        """The rows' token ids (an empty row as the pad token alone, as the other engines run it),
        global indices and the rows refused before sending (a token id the model has no embedding for)."""
        ids = [list(map(int, window.data[p])) or [self.task.pad_id] for p in positions]
        return {"ids": ids, "index": (window.first + np.asarray(positions, dtype=np.int64)).tolist(),
                "refused": {k: f"row {window.first + p}: {why}" for k, (p, row) in enumerate(zip(positions, ids))
                            if (why := outside_vocabulary(row, self.vocab_size))}}

    def body(self, batch: dict, position: int, row: int) -> dict:
        """A row's /v1/embeddings body (`endpoint.embedding_body`)."""
        return embedding_body(self.served.model, self.prompt(batch["ids"][position]), self.served.dialect)

    def vector(self, answer: dict, sent: list[int] | None, row: int) -> np.ndarray:
        """An answer's one vector, checked against the row (its prompt tokens, where sent as ids) and the
        shard's width."""
        data = answer.get("data") if isinstance(answer, dict) else None
        if not (isinstance(data, list) and len(data) == 1 and isinstance(data[0].get("embedding"), str)):
            raise UserError(f"row {row}: the server's answer holds no one base64 embedding; embed.engine server "
                            "needs an OpenAI-compatible /v1/embeddings")
        vector = np.frombuffer(base64.b64decode(data[0]["embedding"]), dtype="<f4")
        self.width = self.width or len(vector)
        if len(vector) != self.width or not len(vector):
            raise UserError(f"row {row}: the server's embedding has {len(vector)} values where the shard's others "
                            f"have {self.width}")
        counted = (answer.get("usage") or {}).get("prompt_tokens")
        if sent is not None and counted is not None and counted != len(sent):
            raise UserError(f"row {row}: the server counted {counted} prompt tokens where {len(sent)} were sent")
        return vector

    def results(self, answers: list[dict], batch: dict, positions: list[int]) -> dict:
        """The rows' vectors, normalised as on the other engines (`Embed.from_pooled`)."""
        import torch

        vectors = [self.vector(answer, self.sent_ids(batch["ids"][p]), int(batch["index"][p]))
                   for answer, p in zip(answers, positions)]
        if not vectors:
            return {}
        pooled = torch.from_numpy(np.stack(vectors).astype(np.float32))
        return {name: value.numpy() for name, value in self.task.from_pooled(pooled).items()}
