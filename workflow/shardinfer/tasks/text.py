"""What the Hugging Face text tasks share: their checks when the Snakefile loads (a model folder,
max_length, an adapter, no labels but classify's), tokenizer and model loading, token ids per
window (tokenized here or read from the tokenize rule's file), and padding a batch to its longest
row."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import max_positions, tokenizer_max_length
from shardinfer.hf.batching import pad_batch
from shardinfer.hf.tokens import Encoder, TokenReader, TokenWindow, tokenize_window
from shardinfer.settings.config import ModelSettings, Settings
from shardinfer.tasks.base import LoadContext, Task, Window


class TextTask(Task):
    """A task over `input.text_column` with a transformers model class (`auto_class`, by name)."""

    auto_class: ClassVar[str]
    tokenizes_ahead: ClassVar[bool] = True  # the tokenize rule can make its token ids (`tokenize.ahead`)
    token_data: ClassVar[tuple[str, ...]] = ()  # what a row takes from the tokenizer beside its ids (token files too)
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
        self.encoder = self.encoder_for(tokenizer, context.settings)
        self.tokens = TokenReader(context.tokens, self.token_data) if context.tokens else None
        self.prepare_stage = "read tokens" if self.tokens else "tokenize"
        self.null_as_empty = context.settings.input.null_text == "empty"
        if loaded is not None:  # what is checked of a loaded transformers model (an engine of its own checks its own)
            self.check()
            if self.one_pass and context.device.type == "cpu":
                from shardinfer.hf.cpu_linear import pack_cpu_linears

                pack_cpu_linears(self.model, self.probe_batch())

    @classmethod
    def load(cls, context: LoadContext) -> TextTask:
        from shardinfer.hf.models import load_text_model

        tokenizer, loaded, pad_id = load_text_model(context.settings.model, cls.model_class(context.settings),
                                                    context.dtype, context.device)
        return cls(loaded, tokenizer, pad_id, context)

    @classmethod
    def model_class(cls, settings: Settings) -> str:
        """The transformers Auto class (by name) that loads the model for these settings."""
        return cls.auto_class

    @classmethod
    def encoder_for(cls, tokenizer, settings: Settings) -> Encoder:
        """How the task's text columns become token ids: the same for the shard job and the tokenize rule."""
        return Encoder(tokenizer, settings.model.max_length, reads_pairs(settings), cls.token_data)

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """A Hugging Face model (and adapter) that can run the task over `input.text_column`."""
        inp, model = settings.input, settings.model
        if inp.columns:
            raise UserError(f"input.columns is for task custom; task {model.task} reads input.text_column "
                            f"(`{inp.text_column}`), so leave input.columns out")
        if model.path is None:
            raise UserError(f"model.path is required for task {model.task}: a Hugging Face model directory")
        if not (Path(model.path) / "config.json").is_file():
            raise UserError(f"model.path `{model.path}` is not a Hugging Face model directory (no config.json there)")
        check_max_length(model, reads_pairs(settings))
        if model.adapter is not None and not (Path(model.adapter) / "adapter_config.json").is_file():
            raise UserError(f"model.adapter `{model.adapter}` is not a PEFT adapter directory (no adapter_config.json "
                            "there)")
        cls.check_labels(model)

    @classmethod
    def check_labels(cls, model: ModelSettings) -> None:
        """`model.labels` names a classifier's labels: only classify has them (it checks their count)."""
        if model.labels is not None:
            raise UserError(f"model.labels names the labels of task classify; task {model.task} has none, so leave it "
                            "out")

    def check(self) -> None:
        """Refuse a loaded transformers model that would give meaningless outputs for this task."""

    def probe_batch(self) -> dict[str, Any]:
        """Two rows of the model's inputs, one padded (one where `batch.max_rows` is 1): what checks
        the model's packed linear layers once it is loaded (`shardinfer.hf.cpu_linear`)."""
        ids = self.tokenizer("Check the model on a short text.")["input_ids"][: self.settings.model.max_length]
        rows = [ids, ids[: max(len(ids) // 2, 1)]][: self.settings.batch.max_rows]
        lengths = np.array([len(row) for row in rows])
        return TextTask.collate(self, Window(0, lengths, rows), np.arange(len(rows)))

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
        return Window(first, self.costs(lengths), tokens.ids, lengths, tokens.truncated, tokens.token_data)

    def collate(self, window: Window, positions: np.ndarray) -> dict[str, Any]:
        """Padded input_ids and attention_mask (and token types where the model takes them), pinned
        when bound for a GPU so the copy overlaps the device's work."""
        import torch

        ids = [window.data[p] if len(window.data[p]) else [self.pad_id] for p in positions]
        input_ids, mask = pad_batch(ids, self.pad_id, self.left)
        inputs = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
        if self.with_token_types:
            inputs["token_type_ids"] = torch.from_numpy(self.token_types(window, positions, input_ids))
        return {name: t.pin_memory() for name, t in inputs.items()} if self.pin else inputs

    def token_types(self, window: Window, positions: np.ndarray, input_ids: np.ndarray) -> np.ndarray:
        """The rows' token types padded as their ids (pads 0); all 0 (one segment) unless the task
        carries the tokenizer's (a pair's second text is segment 1)."""
        types = window.token_data.get("token_type_ids")
        if types is None:
            return np.zeros_like(input_ids)
        return pad_batch([types[p] if len(types[p]) else [0] for p in positions], 0, self.left)[0]

    def on_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {name: t.to(self.device, non_blocking=True) for name, t in batch.items()}


def reads_pairs(settings: Settings) -> bool:
    """Whether a row is a pair of texts (the task declares two text columns: score), tokenized as
    one sequence with the tokenizer's pair template."""
    return len(settings.input.text_columns) == 2


def check_max_length(model: ModelSettings, pair: bool = False) -> None:
    """max_length leaves room for at least one text token beside the tokenizer's special tokens (a
    shorter one fails inside the model and counts every text as cut) and is within the model's limit."""
    limit = model_length_limit(model.path)
    lowest = special_tokens(model.path, pair) + 1
    if model.max_length < lowest:
        allowed = f"use {lowest}..{limit}" if limit else f"use at least {lowest}"
        raise UserError(f"model.max_length {model.max_length} leaves no room for text: the tokenizer adds "
                        f"{lowest - 1} special token(s) to every text{' pair' if pair else ''}; {allowed}")
    if limit is not None and model.max_length > limit:
        raise UserError(f"model.max_length {model.max_length} is above the model's limit of {limit} tokens; "
                        f"use {lowest}..{limit}")


def special_tokens(path: str, pair: bool = False) -> int:
    """Special tokens the tokenizer adds to one text ([CLS] and [SEP]: 2) or a pair ([CLS] a [SEP]
    b [SEP]: 3), read from its tokenizer.json's post-processor by the `tokenizers` library: tens of
    ms, no torch or transformers import. 0 without a tokenizer.json (the shard job checks those:
    tokens.Encoder)."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return 0
    from tokenizers import Tokenizer

    try:
        processor = Tokenizer.from_file(str(file)).post_processor
    except Exception as error:  # tokenizers raises a bare Exception on a malformed file
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"model.path `{path}`: cannot read its tokenizer.json ({reason})") from None
    return processor.num_special_tokens_to_add(pair) if processor is not None else 0


def model_length_limit(path: str) -> int | None:
    """The longest input the model takes: its tokenizer's model_max_length or its (text model's)
    position table, whichever is smaller; a vision-language model's is in its nested text config.
    A model_max_length of 1e6 or more is the tokenizer's "no limit" (VERY_LARGE_INTEGER)."""
    limits = [value for value in (tokenizer_max_length(path), max_positions(path))
              if value is not None and 0 < value < 1_000_000]
    return min(limits) if limits else None
