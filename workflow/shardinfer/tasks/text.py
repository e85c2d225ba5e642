"""What the Hugging Face text tasks share: tokenizer and model loading, token ids per window
(tokenized here or read from the tokenize rule's file), and padding a batch to its longest row."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from shardinfer.shard.batching import pad_batch
from shardinfer.tasks.base import LoadContext, Task, Window
from shardinfer.shard.tokens import Encoder, TokenReader, TokenWindow, tokenize_window


class TextTask(Task):
    """A task over `input.text_column` with a transformers model class (`auto_class`, by name)."""

    auto_class: ClassVar[str]
    tokenizes: ClassVar[bool] = True  # reads its text through a tokenizer (and can tokenize ahead)
    padding_side: ClassVar[str | None] = None  # None: the tokenizer's own

    def __init__(self, loaded, tokenizer, pad_id: int, context: LoadContext) -> None:
        """`loaded`: the transformers model, or None where an engine of its own runs it (vLLM)."""
        self.model = loaded.model if loaded is not None else None
        self.loaded = loaded
        self.tokenizer = tokenizer
        self.settings = context.settings
        self.device = context.device
        self.pad_id = pad_id
        self.left = (self.padding_side or tokenizer.padding_side) == "left"
        self.with_token_types = "token_type_ids" in tokenizer.model_input_names
        self.pin = context.device.type == "cuda"
        self.encoder = Encoder(tokenizer, context.settings.model.max_length)
        self.tokens = TokenReader(context.tokens) if context.tokens else None
        self.prepare_stage = "read tokens" if self.tokens else "tokenize"
        self.null_as_empty = context.settings.input.null_text == "empty"
        self.check()

    @classmethod
    def load(cls, context: LoadContext) -> TextTask:
        from shardinfer.shard.models import load_text_model

        tokenizer, loaded, pad_id = load_text_model(context.settings.model, cls.auto_class, context.dtype, context.device)
        return cls(loaded, tokenizer, pad_id, context)

    def check(self) -> None:
        """Refuse a model that would give meaningless outputs for this task."""

    def token_ids(self, first: int, table: pa.Table) -> TokenWindow:
        if self.tokens is not None:
            return self.tokens.take(first, table.num_rows)
        return tokenize_window(self.encoder, first, table, self.null_as_empty)

    def costs(self, lengths: np.ndarray) -> np.ndarray:
        """What a row costs a batch: its tokens (generate adds the tokens it may generate)."""
        return lengths

    def prepare(self, first: int, table: pa.Table) -> Window:
        tokens = self.token_ids(first, table)
        lengths = np.fromiter((max(len(row), 1) for row in tokens.ids), dtype=np.int64, count=len(tokens.ids))
        return Window(first, self.costs(lengths), tokens.ids, lengths, tokens.truncated)

    def collate(self, window: Window, positions: np.ndarray) -> dict[str, Any]:
        """Padded input_ids and attention_mask (and token types where the model takes them), pinned
        when bound for a GPU so the copy overlaps the device's work."""
        import torch

        ids = [window.data[p] if len(window.data[p]) else [self.pad_id] for p in positions]
        input_ids, mask = pad_batch(ids, self.pad_id, self.left)
        inputs = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if self.with_token_types:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        return {name: t.pin_memory() for name, t in inputs.items()} if self.pin else inputs

    def on_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {name: t.to(self.device, non_blocking=True) for name, t in batch.items()}
