"""Embeddings: token states pooled per row (mean under the mask, or the first token), optionally L2-normalised."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from transformers import AutoModel

from shardinfer.tasks.base import Task as BaseTask
from shardinfer.tasks.base import matrix_to_list_array


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per row: `mean` averages the unmasked positions, `cls` takes the first real one."""
    if pooling == "cls":
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), mask.argmax(dim=1)]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class Task(BaseTask):
    auto_class = AutoModel

    def output_schema(self) -> pa.Schema:
        return pa.schema([("embedding", pa.list_(pa.float32()))])

    def predict(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.model(**inputs).last_hidden_state.float()
        vectors = pool(hidden, inputs["attention_mask"], self.settings.pooling)
        if self.settings.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return {"embedding": vectors}

    def to_arrow(self, results: dict[str, np.ndarray]) -> list[pa.Array]:
        return [matrix_to_list_array(results["embedding"])]
