"""Sequence classification: the label, its id and every class's probability."""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.hf.labels import label_names
from shardinfer.settings.config import ModelSettings
from shardinfer.tasks.base import matrix_to_list_array
from shardinfer.tasks.text import TextTask
from shardinfer.tasks.traits import Reporting


def untrained_head(loaded) -> list[str]:
    """Head weights missing from the checkpoint and not supplied by the adapter either.

    Such weights were freshly initialised at random; predictions would be silently random.
    """
    supplied = {key.removeprefix("base_model.model.") for key in loaded.adapter_keys}
    return sorted(key for key in loaded.missing_keys if key not in supplied)


def refuse_untrained_head(loaded, model: ModelSettings) -> None:
    """A classifier head that neither the checkpoint nor the adapter carries: refused in one line."""
    missing = untrained_head(loaded)
    if not missing:
        return
    where = (
        f"the adapter `{model.adapter}` does not carry them either (train it with the classifier in "
        "modules_to_save, e.g. task_type=SEQ_CLS)"
        if model.adapter
        else "it has no trained classification head"
    )
    raise UserError(
        f"model.path `{model.path}`: classifier weights {', '.join(missing)} are missing from the checkpoint "
        f"and {where}; predictions would be random"
    )


class LabelledTask(TextTask):
    """A text task whose model's head scores each of its labels (classify, token-classify): the labels
    `model.labels` names or the model's config, checked before any job runs, and a head the
    checkpoint or adapter must carry (one drawn at random would label at random)."""

    @classmethod
    def check_labels(cls, model: ModelSettings) -> None:
        """`model.labels`: as many names as the head has, checked before any job runs."""
        if model.labels is not None:
            label_names(model.path, model.adapter, model.labels)

    def check(self) -> None:
        refuse_untrained_head(self.loaded, self.settings.model)

    @cached_property
    def labels(self) -> list[str]:
        """The head's labels: the loaded model's (named as `model.labels` says), or without one (an
        engine of its own runs the model) as the model folder and `model.labels` name them."""
        if self.model is None:
            model = self.settings.model
            return label_names(model.path, model.adapter, model.labels)
        config = self.model.config
        return [str(config.id2label.get(i, i)) for i in range(config.num_labels)]


class Classify(LabelledTask):
    name = "classify"
    one_pass = True
    auto_class = "AutoModelForSequenceClassification"
    outputs = {"label": "string", "label_id": "int64", "probs": "list<float32>"}
    # evaluate: accuracy, F1 and the confusion matrix (shardinfer.scores.metrics); integer gold values
    # compared with the ids, strings with the names
    reporting = Reporting(scored_as="labels", compared={"ids": "label_id", "names": "label"})
    engines = ("transformers", "vllm")

    def predict(self, batch: dict) -> dict:
        return self.from_pooled(self.model(**self.on_device(batch)).logits.float())

    def from_pooled(self, logits) -> dict:
        """The rows' logits (float32, rows first) as the task's results: every class's probability
        (softmax) and the likeliest class, whichever engine ran the model."""
        import torch

        probs = torch.softmax(logits, dim=-1)
        return {"label_id": probs.argmax(dim=-1), "probs": probs}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        ids = results["label_id"].astype(np.int64)
        names = np.asarray(self.labels, dtype=object)[ids]
        return [pa.array(names, type=pa.string()), pa.array(ids), matrix_to_list_array(results["probs"])]
