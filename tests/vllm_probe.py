"""Task generate on vLLM's engine, driven as the shard runner drives it, in a process of its own
(the in-process engine binds the process's CPU threads and stays loaded, so not in pytest's):

    PYTHONPATH=workflow:tests:scripts python tests/vllm_probe.py <model dir> <texts.json> <out.json>

Writes, for the texts: greedy rows, sampled rows as one window, sampled rows in reversed windows
(each row at its own global index), a subset alone, and another seed; each row as the task's
output columns. tests/test_vllm.py compares them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

SAMPLING = {"do_sample": True, "temperature": 1.3, "top_p": 0.95, "seed": 7}


def main(model: str, texts_path: str, out_path: str) -> None:
    import torch

    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate import Generate
    from shardinfer.tasks.vllm.task import VllmGenerate
    from test_generate import run, settings

    torch.set_num_threads(1)  # as the tests' shard jobs (`--set-threads infer=1`): the engine takes as many
    texts = json.loads(Path(texts_path).read_text())
    task = VllmGenerate.load(LoadContext(settings(model, engine="vllm"), torch.device("cpu"), torch.float32))
    greedy = run(task, texts, max_rows=4)
    sampling = dataclasses.replace(task.params, **SAMPLING)  # each row's parameters, as a per-row input gives them
    sampled = run(task, texts, 4, params=sampling)
    half = len(texts) // 2
    reversed_windows = run(task, texts[half:], 4, half, sampling) + run(task, texts[:half], 4, params=sampling)
    subset = run(task, texts[5:9], 4, 5, sampling)
    other_seed = run(task, texts, 4, params=dataclasses.replace(sampling, seed=8))
    empty = with_an_empty_prompt(task)
    transformers = Generate.load(LoadContext(settings(model), torch.device("cpu"), torch.float32))
    empty_transformers = with_an_empty_prompt(transformers)
    Path(out_path).write_text(json.dumps({"greedy": greedy, "sampled": sampled, "reversed": reversed_windows,
                                          "half": half, "subset": subset, "other_seed": other_seed,
                                          "generated_tokens": task.finish()["generated_tokens"], "empty": empty,
                                          "empty_transformers": empty_transformers, "bad_start": bad_start(model),
                                          **engine_facts()}))


def bad_start(model: str) -> str | None:
    """The one line a shard job gives for engine arguments vLLM refuses (max_num_seqs 0)."""
    import torch

    from shardinfer.errors import UserError
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.vllm.engine import start_engine
    from test_generate import settings

    try:
        start_engine(LoadContext(settings(model, engine="vllm", vllm={"max_num_seqs": 0}), torch.device("cpu"),
                                 torch.float32))
    except UserError as error:
        return str(error)
    return None


def with_an_empty_prompt(task) -> list:
    """A window whose first prompt has no token at all (a tokenizer that adds no BOS, an empty
    text), through the device loop as a shard job runs it."""
    import numpy as np
    import pyarrow as pa
    import torch

    from shardinfer.config import BatchSettings
    from shardinfer.shard.device_loop import predict_window, prepare_batches
    from shardinfer.tasks.base import Window
    from shardinfer.tasks.generate_params import PromptRows

    window = Window(0, np.array([1, 4]), PromptRows([[], [2, 10, 11, 12]], [task.params] * 2))
    with torch.inference_mode():
        prepared = prepare_batches(task, window, pa.table({}), BatchSettings(10_000, 4, 64))
        columns = task.to_arrow(predict_window(task, prepared, torch.device("cpu")), np.arange(2))
    return list(zip(*(column.to_pylist() for column in columns)))


def engine_facts() -> dict:
    """What the workflow assumes of this vLLM: the LoRA ranks it allows, and the names of the
    engine arguments the workflow sets."""
    import dataclasses
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks
    from vllm.engine.arg_utils import EngineArgs

    return {"lora_ranks": list(get_args(MaxLoRARanks)),
            "engine_fields": [field.name for field in dataclasses.fields(EngineArgs)]}


if __name__ == "__main__":
    main(*sys.argv[1:4])
