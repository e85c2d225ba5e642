"""Embeddings: token states pooled per row (mean under the mask, the first token or the last real
one), optionally L2-normalised. Settings: the `embed:` section (pooling, normalize, engine).

The transformers and vLLM engines pool as the settings say (vLLM's pooling runner is handed the same
pooling type, and returns the pooled state unnormalised); a server pools as it was started
(`shardinfer.engines.server.embed`). Every engine normalises here (`from_pooled`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shardinfer.tasks.base import matrix_to_list_array
from shardinfer.tasks.text import TextTask


def pool(hidden, mask, pooling: str):
    """One vector per row: `mean` averages the unmasked positions, `cls` takes the first real one,
    `last` the last real one (left or right padding alike)."""
    import torch

    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if pooling == "cls":
        return hidden[rows, mask.argmax(dim=1)]
    if pooling == "last":
        return hidden[rows, mask.shape[1] - 1 - mask.flip(1).argmax(dim=1)]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class Embed(TextTask):
    name = "embed"
    one_pass = True
    auto_class = "AutoModel"
    outputs = {"embedding": "list<float32>"}
    engines = ("transformers", "vllm", "server")

    def predict(self, batch: dict) -> dict:
        inputs = self.on_device(batch)
        hidden = self.model(**inputs).last_hidden_state.float()
        return self.from_pooled(pool(hidden, inputs["attention_mask"], self.settings.task_settings.pooling))

    def from_pooled(self, vectors) -> dict:
        """The rows' pooled states (float32, rows first) as the task's results: L2-normalised with
        `embed.normalize`. Each engine pools; this is the one place that normalises."""
        import torch

        if self.settings.task_settings.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return {"embedding": vectors}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        return [matrix_to_list_array(results["embedding"])]
