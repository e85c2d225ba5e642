"""Token classification (named entities): each row's entities as character spans of its text.

Tokens are labelled by the model and grouped as transformers' token-classification pipeline groups
them with `aggregation_strategy="simple"`, so a user moving from the pipeline gets the same spans:
a token tagged `B-X` starts an entity of type X, a following `I-X` (or a bare `X`) continues it,
and the spans of type `O` are dropped. An entity's score is the mean of its tokens' probabilities.
Only the first `model.max_length` tokens of a text are read (a cut row is counted as truncated).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from shardinfer.tasks.base import Window
from shardinfer.tasks.classify import LabelledTask
from shardinfer.tasks.text import TextTask

ENTITY = pa.struct([("label", pa.string()), ("start", pa.int64()), ("end", pa.int64()), ("score", pa.float32())])
OUTSIDE = "O"  # the tag of tokens outside any entity


def tag_of(label: str) -> tuple[str, str]:
    """(`B` or `I`, the entity type) of a token's label, as the pipeline reads it."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def grouped_entities(tokens: list[tuple[str, float, int, int]]) -> list[dict[str, Any]]:
    """Tokens as (label, probability, start, end), in text order -> entities, `O` left out."""
    groups: list[dict[str, Any]] = []
    last = None
    for label, score, start, end in tokens:
        begins, tag = tag_of(label)
        if groups and tag == last and begins != "B":
            groups[-1]["scores"].append(score)
            groups[-1]["end"] = end
        else:
            groups.append({"label": tag, "scores": [score], "start": start, "end": end})
        last = tag
    return [{"label": g["label"], "start": g["start"], "end": g["end"], "score": float(np.mean(g["scores"]))}
            for g in groups if g["label"] != OUTSIDE]


class TokenClassify(LabelledTask):
    name = "token-classify"
    one_pass = True
    auto_class = "AutoModelForTokenClassification"
    tokenizes_ahead = False  # a token's character offsets are not in the tokenize rule's files
    token_data = ("offset_mapping", "special_tokens_mask")
    outputs = {"entities": pa.list_(ENTITY)}
    engines = ("transformers", "vllm")

    def collate(self, window: Window, positions: np.ndarray) -> dict[str, Any]:
        """The padded batch, and per row its text tokens as (position in the padded row, start, end)."""
        inputs = TextTask.collate(self, window, positions)
        return {"inputs": inputs, "spans": self.spans(window, positions, inputs["input_ids"].shape[1])}

    def spans(self, window: Window, positions: np.ndarray, width: int | None = None) -> list[list[tuple]]:
        """Per row its text tokens as (position in the model's row, start, end): in a batch padded on
        the left to `width`, shifted by the row's padding; unpadded (`width` None: one row each,
        as vLLM runs them), as they come."""
        offsets, special = window.token_data["offset_mapping"], window.token_data["special_tokens_mask"]
        spans = []
        for p in positions:
            shift = width - max(len(window.data[p]), 1) if self.left and width is not None else 0
            spans.append([(shift + t, start, end) for t, ((start, end), is_special)
                          in enumerate(zip(offsets[p], special[p])) if not is_special])
        return spans

    def predict(self, batch: dict) -> dict:
        logits = self.model(**self.on_device(batch["inputs"])).logits.float()
        return {**self.from_pooled(logits), "spans": batch["spans"]}

    @staticmethod
    def from_pooled(logits) -> dict:
        """Per-token logits (float32: rows x tokens x labels, padded, or one row's tokens x labels)
        as each token's likeliest label and its probability, whichever engine ran the model."""
        import torch

        scores, label_ids = torch.softmax(logits, dim=-1).max(dim=-1)
        return {"label_ids": label_ids, "scores": scores}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        labels = self.labels
        rows = [grouped_entities([(labels[ids[t]], float(scores[t]), start, end) for t, start, end in spans])
                for ids, scores, spans in zip(results["label_ids"], results["scores"], results["spans"])]
        return [pa.array(rows, type=pa.list_(ENTITY))]
