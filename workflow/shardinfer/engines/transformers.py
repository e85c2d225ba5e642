"""The transformers engine, every task's default: the task loads its transformers model (or, for
custom, the user's code) and runs each batch itself (`Task.load`, `Task.batches`, `Task.collate`,
`Task.predict`), on length-sorted batches under `batch.max_tokens` and `batch.max_rows`; a batch
that runs out of device memory is halved and retried (`shardinfer.shard.device_loop`). Nothing
more to install, one device per shard job.
"""

from __future__ import annotations

from typing import Any

from shardinfer.engines.base import Engine
from shardinfer.tasks.base import LoadContext, Task


class Transformers(Engine):
    """The task's own model and code on one device, a batch at a time: transformers' models (for
    generate, `model.generate`'s loop), or the code of task custom."""

    name = "transformers"

    @classmethod
    def load(cls, task_class: type[Task], context: LoadContext) -> Transformers:
        return cls(task_class.load(context))

    def run(self, rows: Any) -> dict[str, Any]:
        return self.task.predict(rows)
