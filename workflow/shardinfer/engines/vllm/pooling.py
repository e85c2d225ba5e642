"""Tasks embed, classify, score and token-classify on vLLM's pooling runner (`<task>.engine: vllm`):
`LLM(runner="pooling")` in the shard job, inside the same plan, shards, atomic shard files and proof.

What stays the task's, as on the transformers engine: the token ids (its tokenizer, truncation at
model.max_length, a pair's template and token types; made in the job or read from the tokenize
rule's files), the output columns and their types, and what becomes of the model's pooled output
(`Task.from_pooled`: embed's normalisation, classify's softmax, score's sigmoid, token-classify's
per-token probabilities), so both engines share one home for each. What the engine gets:

- **One request per row**, of token ids (`{"prompt_token_ids": ...}`), with PoolingParams asking
  for raw outputs (`use_activation=False`: pooled states or logits); a pair's token types as vLLM's
  scoring entry point hands them on (`compressed_token_type_ids`: where segment 1 starts). Pooling
  is the one `embed.pooling` names (`pooler_config`), not what the folder's sentence-transformers
  modules say, which the transformers engine does not read either (`pooling_checks`).
- **Fed across windows** by the loop generate's engine is fed by (`feeder`): the next window's rows
  join while the current window's last rows finish, windows come out whole and in order and are
  written and committed one by one (resume unchanged); the pipeline tokenizes and writes around it.
- **A bad row costs its row**: a token id the model has no embedding for is refused before the
  engine (vLLM would read a padding row of its table silently), a request vLLM refuses, or a failure
  inside the engine narrowed to its rows, as for generate (`row_errors`, its cap).
- **Checked**: each output is matched to its row by request id and must show the token ids sent.

One device per engine (no tensor parallel here: an encoder fits one device; run more shards).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import model_config, vocab_size
from shardinfer.engines.vllm.engine import base_arguments, cpu_defaults
from shardinfer.engines.vllm.fed import FedVllm
from shardinfer.engines.vllm.pooling_checks import POOLING_TYPES, check_pooling_settings, long_max_length
from shardinfer.hf.tokens import outside_vocabulary
from shardinfer.tasks.base import LoadContext, Task, Window

# vLLM's pooling task for each workflow task (score's cross-encoder is a one-label classifier)
POOLING_TASKS = {"embed": "embed", "classify": "classify", "score": "classify", "token-classify": "token_classify"}


class VllmPooling(FedVllm):
    """vLLM's pooling runner in the shard job (`LLM(runner="pooling")`; `<task>.vllm`: its `LLM`
    arguments), fed every window's token ids by one loop that keeps it full across windows, one
    request per row; raw pooled outputs, which the task normalises as on the transformers engine."""

    def __init__(self, llm, task: Task, context: LoadContext, start_s: float = 0.0) -> None:
        super().__init__(llm, task, context, start_s)
        self.pooling_task = POOLING_TASKS[task.name]
        self.vocab_size = vocab_size(context.settings.model.path)

    @classmethod
    def check_settings(cls, settings) -> None:
        """Installed, and a model, adapter and settings it runs as the transformers engine does."""
        check_pooling_settings(settings)

    @classmethod
    def arguments(cls, context: LoadContext) -> dict:
        """The pooling runner's `LLM(...)` arguments (`pooling_arguments`)."""
        return pooling_arguments(context)

    @classmethod
    def load(cls, task_class: type[Task], context: LoadContext) -> VllmPooling:
        """The task without a transformers model (its tokenizer makes the rows' ids), and vLLM's runner."""
        from shardinfer.hf.models import pad_id_of

        model = context.settings.model
        tokenizer = cls.checked_tokenizer(context)
        task = task_class(None, tokenizer, pad_id_of(tokenizer, model_config(model.path).get("pad_token_id")), context)
        if long_max_length(model.path, model.max_length):  # the positions hold it (checked when the Snakefile loaded)
            os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
        llm, seconds = cls.start(context)
        return cls(llm, task, context, seconds)

    def collate(self, window: Window, positions: np.ndarray) -> dict:
        """The rows' token ids (an empty row as the pad token alone, as the transformers engine runs
        it), global indices, where a pair's second segment starts (None: one segment), the rows
        refused before the engine (by position: a token id the model has no embedding for, which vLLM,
        checking against the tokenizer only, would read from a padding row of its table) and, for
        token-classify, each row's token spans."""
        pad_id, types = self.task.pad_id, window.token_data.get("token_type_ids")
        ids = [list(map(int, window.data[p])) or [pad_id] for p in positions]
        batch = {"ids": ids, "index": (window.first + np.asarray(positions, dtype=np.int64)).tolist(),
                 "segments": [second_segment(types[p]) if types is not None else None for p in positions],
                 "refused": {k: f"row {window.first + p}: {why}" for k, (p, row) in enumerate(zip(positions, ids))
                             if (why := outside_vocabulary(row, self.vocab_size))}}
        if self.pooling_task == "token_classify":
            batch["spans"] = self.task.spans(window, positions)
        return batch

    def pooling_params(self, segment: int | None = None):
        """Raw outputs (the task normalises), and a pair's second segment as vLLM's scoring passes it."""
        from vllm import PoolingParams

        extra = {"compressed_token_type_ids": segment} if segment is not None else None
        return PoolingParams(task=self.pooling_task, use_activation=False, extra_kwargs=extra)

    def request(self, batch: dict, position: int, row: int) -> tuple[dict, Any]:
        """A row's request for the engine loop (`feeder`): its token ids and PoolingParams."""
        return {"prompt_token_ids": batch["ids"][position]}, self.pooling_params(batch["segments"][position])

    @staticmethod
    def refused(output) -> str | None:
        """Why the engine failed a finished row itself (None: it did not)."""
        error = getattr(output, "error", None)
        return f"vLLM ended the row with an error ({error})" if error is not None else None

    def health_request(self) -> tuple[dict, Any]:
        """A request that shows the engine still runs a row: the pad token alone."""
        return {"prompt_token_ids": [self.task.pad_id]}, self.pooling_params()

    def results(self, outputs: list, batch: dict, positions: list[int]) -> dict:
        """The task's results of a window's rows that did not fail (`positions`), each output checked
        against the ids sent: the task's own reading of the pooled outputs (`from_pooled`), on the host."""
        import torch

        for output, p in zip(outputs, positions):
            if list(output.prompt_token_ids) != batch["ids"][p]:
                raise UserError(f"row {batch['index'][p]}: vLLM ran other token ids than were sent")
        pooled = [output.outputs.data.float() for output in outputs]
        if self.pooling_task == "token_classify":  # one row's tokens x labels each
            rows = [self.task.from_pooled(data) for data in pooled]
            return {"label_ids": [row["label_ids"].numpy() for row in rows],
                    "scores": [row["scores"].numpy() for row in rows], "spans": [batch["spans"][p] for p in positions]}
        if not pooled:
            return {}
        return {name: value.numpy() for name, value in self.task.from_pooled(torch.stack(pooled)).items()}



def second_segment(types) -> int | None:
    """Where a pair's second segment (token type 1) starts, as vLLM's scoring entry point passes a
    pair's token types (zeros, then ones); None for one segment."""
    types = np.asarray(types)
    ones = np.flatnonzero(types)
    if not len(ones):
        return None
    if not (types[ones[0]:] == 1).all():
        raise UserError("a row's token types are not zeros then ones, which vLLM's pooling runner cannot pass on")
    return int(ones[0])


def pooling_arguments(context: LoadContext) -> dict:
    """LLM(...) keyword arguments of the pooling runner: the workflow's own (`pooling_checks.POOLING_OWNED`:
    rows of model.max_length tokens, the pooling runner, embed.pooling, raw outputs), the engine's
    defaults for this device, then the user's `<task>.vllm` mapping."""
    settings = context.settings
    options, max_length = settings.task_settings, settings.model.max_length
    user = dict(options.get("vllm") or {})
    pooler = {"use_activation": False}
    if settings.model.task == "embed":
        pooler["seq_pooling_type"] = POOLING_TYPES[options.pooling]
    arguments = {**base_arguments(context, max_length), "runner": "pooling", "pooler_config": pooler}
    if context.device.type == "cpu":
        arguments.update(cpu_defaults(context, user, max_length))
    return {**arguments, **user}
