"""Sequence classification: the label, its id and every class's probability."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from transformers import AutoModelForSequenceClassification

from shardinfer.errors import UserError
from shardinfer.models import LoadedModel
from shardinfer.tasks.base import Task as BaseTask
from shardinfer.tasks.base import matrix_to_list_array


def untrained_head(loaded: LoadedModel) -> list[str]:
    """Head weights missing from the checkpoint and not supplied by the adapter either.

    Such weights were freshly initialised at random; predictions would be silently random.
    """
    supplied = {key.removeprefix("base_model.model.") for key in loaded.adapter_keys}
    return sorted(key for key in loaded.missing_keys if key not in supplied)


class Task(BaseTask):
    auto_class = AutoModelForSequenceClassification

    def check(self, loaded: LoadedModel) -> None:
        missing = untrained_head(loaded)
        if not missing:
            return
        where = (
            f"the adapter `{self.settings.adapter}` does not carry them either (train it with the classifier in "
            "modules_to_save, e.g. task_type=SEQ_CLS)"
            if self.settings.adapter
            else "it has no trained classification head"
        )
        raise UserError(
            f"model.path `{self.settings.path}`: classifier weights {', '.join(missing)} are missing from the checkpoint "
            f"and {where}; predictions would be random"
        )

    @property
    def labels(self) -> list[str]:
        config = self.model.config
        return [str(config.id2label.get(i, i)) for i in range(config.num_labels)]

    def output_schema(self) -> pa.Schema:
        return pa.schema([("label", pa.string()), ("label_id", pa.int64()), ("probs", pa.list_(pa.float32()))])

    def predict(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = self.model(**inputs).logits.float()
        probs = torch.softmax(logits, dim=-1)
        return {"label_id": probs.argmax(dim=-1), "probs": probs}

    def to_arrow(self, results: dict[str, np.ndarray]) -> list[pa.Array]:
        ids = results["label_id"].astype(np.int64)
        names = np.asarray(self.labels, dtype=object)[ids]
        return [pa.array(names, type=pa.string()), pa.array(ids), matrix_to_list_array(results["probs"])]
