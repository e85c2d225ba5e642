"""The task interface: read this first to add a task.

A shard job loads the task once, through the engine that runs it (`shardinfer.engines`: the
task names those that serve it in `engines`, its default first), streams its rows through four
calls, and knows nothing else about the task:

    task = Task.load(context)                  # once per job: model, tokenizer, user code...
    window = task.prepare(first, table)        # a window of input rows -> per-row costs (+ data)
    batch = task.collate(window, positions)    # rows of one batch -> host-side inputs
    results = task.predict(batch)              # -> {name: per-row values}, first axis = rows
    columns = task.to_arrow(results, index)    # the window's results, in row order -> Arrow
    # (`task.batches(window, settings)` cuts the window)

`load`, `batches`, `collate` and `predict` are how the transformers engine runs the task
(`shardinfer.engines.transformers`); another engine loads the model its own way and runs the rows
`prepare` made (vLLM's, for generate: `shardinfer.engines.vllm`).

Before any job, when the Snakefile loads, two classmethods that import no torch: `Task.inputs`
(the columns it reads, for the plan's scan) and `Task.check_settings` (its one-line refusals).

`prepare` and `collate` run in background workers, `predict` on the device thread, `to_arrow` in
the writer. Batching is the runner's: rows are sorted by cost and cut under `batch.max_tokens`
(rows x the batch's highest cost) and `batch.max_rows`, and results are put back in row order.
A batch that runs out of device memory is halved and retried. With `row_errors.mode: record`,
any exception while predicting halves the batch too, down to the rows that fail alone: those
get null outputs and their error (`shardinfer.shard.device_loop`).

A task owns the config section named after it (`embed:`, `generate:`), handed to it typed as
`settings.task_settings` (`shardinfer.settings.sections`); the shard digest takes the task's section (with
`model:`, the input's settings, the model files and, for custom, the hook's code;
`shardinfer.snakefile.settings_digest`), not the other tasks' sections. Its output columns follow from the
settings: `output_fields(settings)`, torch-free, each an Arrow type (or a type string,
`shardinfer.contract.shard_file`), is the one place they are declared (a task whose columns never
change declares them as `outputs`). The empty shard, the check of keep columns against them and
the loaded task's `columns` all read it.

Task modules import torch and transformers inside their methods only: planning and the config
checks import them to read their columns and settings, and stay free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from shardinfer.contract.shard_file import OutputType
from shardinfer.core.errors import UserError, words_list
from shardinfer.hf.batching import length_sorted_batches, padded_tokens
from shardinfer.settings.config import BatchSettings, ModelSettings, Settings
from shardinfer.tasks.traits import PlanCost, Reporting


@dataclass(frozen=True)
class TaskInputs:
    """The input columns a task reads, declared by the task (torch-free, from the config) so that
    the plan, the checks and the shard job take them from it and name no task."""

    columns: tuple[str, ...]  # in the order `prepare` gets them (then come the keep columns)
    keys: tuple[str, ...]  # the config key that names each column, for errors: `input.text_column`
    texts: tuple[str, ...]  # those holding text: strings, null only as input.null_text says; the plan's cost
    # those holding a conversation per row (lists of {role, content}): the plan's cost too, by their contents
    conversations: tuple[str, ...] = ()
    images: tuple[str, ...] = ()  # those holding images per row (generate: input.image_column), not measured


@dataclass(frozen=True)
class LoadContext:
    """What a task is loaded with, once per shard job."""

    settings: Settings
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    tokens: str | None = None  # the tokenize rule's file for this shard (text tasks, tokenize.ahead)


@dataclass(frozen=True)
class Window:
    """Rows [first, first + len(costs)) ready for batching."""

    first: int
    costs: np.ndarray  # per row, what the batch budget counts (tokens for text tasks)
    data: Any  # the task's own: token ids, a pyarrow table, ...
    lengths: np.ndarray | None = None  # per row, what the stats count as real tokens (default: costs)
    truncated: list[int] = field(default_factory=list)  # window positions the task had to cut
    # text tasks: per row, what the tokenizer gave beside the ids (token types)
    token_data: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.costs)

    @property
    def real(self) -> np.ndarray:
        return self.costs if self.lengths is None else self.lengths


class Task:
    """One kind of inference. Subclasses set `name` and `outputs` and implement the calls."""

    name: ClassVar[str]  # its settings, if any, are the config section of that name
    # Output column -> Arrow type or type string, in output order, for a task whose columns do not
    # depend on its settings (others override `output_fields`).
    outputs: ClassVar[dict[str, OutputType]] = {}
    # Whether its columns are known only once its code loads (custom): then an input without rows has
    # no table (gather refuses it), and `output_fields` gives none.
    columns_from_code: ClassVar[bool] = False
    # Its rows' cost as the plan balances it, in what unit (`shardinfer.tasks.traits`).
    cost: ClassVar[PlanCost] = PlanCost()
    # How its results are reported and scored: token counts, running totals, `evaluate:`.
    reporting: ClassVar[Reporting] = Reporting()
    # Its model.path may be any folder of the user's (custom): every file below it enters the shard
    # digest, not only those directly in it (a Hugging Face folder is flat).
    model_files_below: ClassVar[bool] = False
    tokenizes_ahead: ClassVar[bool] = False  # whether the tokenize rule can make its inputs (`tokenize.ahead`)
    reads_conversations: ClassVar[bool] = False  # whether `inputs` takes input.messages_column (generate)
    reads_images: ClassVar[bool] = False  # whether `inputs` takes input.image_column (generate)
    prepare_stage: str = "prepare"  # the pipeline stage's name in logs and the report
    # One forward pass per batch (classify, embed, score), which on CPU runs fastest in small batches
    # (`batch.max_tokens: auto`, shardinfer.hf.batching.batch_budget).
    one_pass: ClassVar[bool] = False
    # The engines that run it (`shardinfer.engines.ENGINES`), its default first: `<task>.engine` picks one.
    engines: ClassVar[tuple[str, ...]] = ("transformers",)

    @classmethod
    def load(cls, context: LoadContext) -> Task:
        raise NotImplementedError

    @classmethod
    def inputs(cls, inp: dict, section: dict) -> TaskInputs:
        """The columns the task reads, from the validated config's input (`inp`) and the task's own
        section: by default the text column, whose characters the plan balances."""
        return TaskInputs((inp["text_column"],), ("input.text_column",), (inp["text_column"],))

    @classmethod
    def output_fields(cls, settings: Settings) -> dict[str, OutputType]:
        """The output columns these settings give, in order (torch-free: the empty shard, the keep
        columns' check and gather call it without loading the task)."""
        return dict(cls.outputs)

    @property
    def columns(self) -> dict[str, OutputType]:
        """The loaded task's output columns: its settings' (`output_fields`)."""
        return self.output_fields(self.settings)

    @classmethod
    def check_settings(cls, settings: Settings) -> None:
        """The task's own checks of the settings against the file system, when the Snakefile loads
        (torch-free, before any job runs): each raises a one-line UserError naming the config key."""

    @classmethod
    def request_limits(cls, inp: dict, model: ModelSettings, section: dict) -> dict:
        """What a row may ask of the run, for an input whose rows carry their own request (an OpenAI
        batch file): the format checks each line against it as the plan reads it. {}: no such input."""
        return {}

    def batches(self, window: Window, batch: BatchSettings) -> list[np.ndarray]:
        """The window's batches as row positions: sorted by cost under the batch budget."""
        return length_sorted_batches(window.costs, batch.max_tokens, batch.max_rows)

    def padded_tokens(self, window: Window, batches: list[np.ndarray]) -> int:
        """Cost the batches pay, padding included (each batch: rows x its highest real cost)."""
        return padded_tokens(window.real, batches)

    def prepare(self, first: int, table: pa.Table) -> Window:
        """A window of rows (`table`: the task's input columns) -> costs and the task's data."""
        raise NotImplementedError

    def collate(self, window: Window, positions: np.ndarray) -> Any:
        """The inputs of one batch, built on the host ahead of the device."""
        raise NotImplementedError

    def predict(self, batch: Any) -> dict[str, Any]:
        """Per-row results of one batch: tensors (left on the device; the runner copies them back
        after queuing the next batch), arrays, or lists of any values (ragged ids, strings, bytes)."""
        raise NotImplementedError

    def to_arrow(self, results: dict[str, np.ndarray | list], index: np.ndarray) -> list[pa.Array]:
        """A window's results, already in row order, as the `columns`; `index` holds the
        rows' global numbers."""
        raise NotImplementedError

    def finish(self) -> dict:
        """Stats of the task's own for the shard's summary, its `reporting.totals` so far among them (e.g.
        generated tokens); called after each window."""
        return {}


def tokenize_ahead_refused(task: str, why: str) -> UserError:
    """`tokenize.ahead` set for a task whose inputs the tokenize rule cannot make: the message says
    which tasks it is for (those that declare `tokenizes_ahead`) and why this one is not."""
    from shardinfer.tasks import TASKS, task_class

    able = [name for name in TASKS if task_class(name).tokenizes_ahead]
    return UserError(f"tokenize.ahead is for {words_list(able)}; task {task} {why}")


def matrix_to_list_array(matrix: np.ndarray) -> pa.Array:
    """A (rows, width) float matrix as an Arrow list<float32> column, one list per row."""
    with np.errstate(over="ignore"):  # a custom task refuses what overflowed (`Custom.refuse_overflow`)
        matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    rows, width = matrix.shape
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(matrix.reshape(-1)))
