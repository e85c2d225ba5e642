"""Scoring text pairs with a cross-encoder: one float per row. Settings: the `score:` section
(pair_column, sigmoid).

A row is `input.text_column` and `score.pair_column` (a query and a passage, say), tokenized as
one sequence with the tokenizer's pair template (`[CLS] a [SEP] b [SEP]`, its token types 0 then
1) and cut longest first to `model.max_length`, the pair's special tokens included. The model is
an `AutoModelForSequenceClassification` with exactly one label; its logit is the score, or its
sigmoid with `score.sigmoid: true`. Rows tokenize in the shard job or ahead (`tokenize.ahead`):
the token files carry the token types beside the ids (`token_data`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.hf.labels import adapter_head, label_names
from shardinfer.settings.config import ModelSettings, Settings
from shardinfer.tasks.base import TaskInputs
from shardinfer.tasks.classify import refuse_untrained_head
from shardinfer.tasks.text import TextTask


def refuse_label_count(model: ModelSettings, count: int) -> None:
    """A score is one logit: a head with another number of labels is refused in one line."""
    if count == 1:
        return
    where = f"model.adapter `{model.adapter}`" if adapter_head(model.adapter) else f"model.path `{model.path}`"
    raise UserError(f"{where}: its classifier has {count} labels; task score needs a cross-encoder with exactly one "
                    "(num_labels 1), whose logit is the score")


class Score(TextTask):
    name = "score"
    one_pass = True
    auto_class = "AutoModelForSequenceClassification"
    outputs = {"score": "float32"}
    token_data = ("token_type_ids",)  # a pair's segments: what tells the model which text is which
    engines = ("transformers", "vllm")

    @classmethod
    def inputs(cls, inp: dict, section: dict) -> TaskInputs:
        """The text column and the pair column, both text (measured, null only as input.null_text says)."""
        pair = section.get("pair_column")
        if not pair:  # refused by check_settings, naming score.pair_column
            return super().inputs(inp, section)
        columns = (inp["text_column"], pair)
        return TaskInputs(columns, ("input.text_column", "score.pair_column"), columns)

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """A pair column beside the text column, and a model folder holding a one-label classifier."""
        pair, text = settings.task_settings.pair_column, settings.input.text_column
        if not pair:
            raise UserError("score.pair_column is required for task score: the input column whose text is paired "
                            f"with input.text_column's (`{text}`), e.g. a passage for each query")
        if pair == text:
            raise UserError(f"score.pair_column `{pair}` is input.text_column too; a pair needs two columns")
        super().check_settings(settings)
        model = settings.model
        refuse_label_count(model, len(label_names(model.path, model.adapter, None)))

    def check(self) -> None:
        refuse_untrained_head(self.loaded, self.settings.model)
        refuse_label_count(self.settings.model, self.model.config.num_labels)

    def predict(self, batch: dict) -> dict:
        return self.from_pooled(self.model(**self.on_device(batch)).logits.float())

    def from_pooled(self, logits) -> dict:
        """The rows' logits (float32, rows x 1) as the task's results: the logit, or its sigmoid with
        `score.sigmoid`, whichever engine ran the model."""
        import torch

        logits = logits[:, 0]
        return {"score": torch.sigmoid(logits) if self.settings.task_settings.sigmoid else logits}

    def to_arrow(self, results: dict, index: np.ndarray) -> list[pa.Array]:
        return [pa.array(np.asarray(results["score"], dtype=np.float32))]
