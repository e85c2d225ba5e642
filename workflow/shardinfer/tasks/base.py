"""What every task provides: its model class, a check of what loaded, a batch step, its columns."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa
import torch

from shardinfer.config import ModelSettings
from shardinfer.models import LoadedModel


def matrix_to_list_array(matrix: np.ndarray) -> pa.Array:
    """A (rows, width) float matrix as an Arrow list<float32> column, one list per row."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    rows, width = matrix.shape
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(matrix.reshape(-1)))


class Task:
    """One kind of inference. The runner calls these and knows no task by name."""

    auto_class: ClassVar[type]

    def __init__(self, loaded: LoadedModel, settings: ModelSettings) -> None:
        self.model = loaded.model
        self.settings = settings
        self.check(loaded)

    def check(self, loaded: LoadedModel) -> None:
        """Refuse a model that would give meaningless outputs for this task."""

    def output_schema(self) -> pa.Schema:
        raise NotImplementedError

    def predict(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-row results of one batch, as tensors whose first axis is the batch's rows.

        Left on the device: the runner copies them to the host only after it has queued the next
        batch, so the device never idles while a result travels back.
        """
        raise NotImplementedError

    def to_arrow(self, results: dict[str, np.ndarray]) -> list[pa.Array]:
        """Rows' results (already in input order) as the task's output columns."""
        raise NotImplementedError
