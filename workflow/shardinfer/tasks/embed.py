"""Embeddings: token states pooled per row (mean under the mask, or the first token), optionally
L2-normalised. Settings: the `embed:` section (pooling, normalize)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shardinfer.tasks.base import matrix_to_list_array
from shardinfer.tasks.text import TextTask


def pool(hidden, mask, pooling: str):
    """One vector per row: `mean` averages the unmasked positions, `cls` takes the first real one."""
    import torch

    if pooling == "cls":
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), mask.argmax(dim=1)]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class Embed(TextTask):
    name = "embed"
    one_pass = True
    auto_class = "AutoModel"
    outputs = {"embedding": "list<float32>"}

    def predict(self, batch: dict) -> dict:
        import torch

        inputs = self.on_device(batch)
        hidden = self.model(**inputs).last_hidden_state.float()
        options = self.settings.task_settings
        vectors = pool(hidden, inputs["attention_mask"], options.pooling)
        if options.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return {"embedding": vectors}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        return [matrix_to_list_array(results["embedding"])]
