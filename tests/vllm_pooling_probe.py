"""Task classify on vLLM's pooling runner, driven as the shard runner drives it, in a process of its
own (the in-process engine binds the process's CPU threads and stays loaded, so not in pytest's):

    PYTHONPATH=workflow:tests:scripts python tests/vllm_pooling_probe.py <classifier dir> <texts.json> <out.json>

Writes the texts' rows (the task's output columns) fed in windows of 4 as the shard job feeds them,
and again with the engine shut down under the loop before the third window (as a worker that dies
leaves it): the loop asks the engine whether it still runs a row (its health request), starts it
again and runs the rows in flight again. tests/test_vllm_pooling.py compares them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(model: str, texts_path: str, out_path: str) -> None:
    import pyarrow as pa
    import torch

    from shardinfer.engines.vllm.pooling import VllmPooling
    from shardinfer.settings.config import BatchSettings, InputSettings, ModelSettings, Settings
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.classify import Classify
    from vllm_probe import through_feed

    torch.set_num_threads(1)  # as the tests' shard jobs (`--set-threads infer=1`): the engine takes as many
    texts = json.loads(Path(texts_path).read_text())
    settings = Settings(input=InputSettings(path="unused.parquet", format="parquet", text_column="text",
                                            keep_columns=(), null_text="error"),
                        model=ModelSettings(path=model, adapter=None, task="classify", max_length=32, dtype="auto",
                                            trust_remote_code=False, allow_pickle=False),
                        batch=BatchSettings(256, 16, 128), shards=1, task_settings={"engine": "vllm"})
    engine = VllmPooling.load(Classify, LoadContext(settings, torch.device("cpu"), torch.float32))
    windows = [engine.task.prepare(first, pa.table({"text": texts[first:first + 4]}))
               for first in range(0, len(texts), 4)]
    plain = through_feed(engine, windows)
    restarted = through_feed(engine, windows, kill_before=(2,))
    Path(out_path).write_text(json.dumps({"plain": plain, "restarted": restarted, "restarts": engine.restarts,
                                          "finish": engine.finish()}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
