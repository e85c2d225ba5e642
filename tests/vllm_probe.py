"""Task generate on vLLM's engine, driven as the shard runner drives it, in a process of its own
(the in-process engine binds the process's CPU threads and stays loaded, so not in pytest's):

    PYTHONPATH=workflow:tests:scripts python tests/vllm_probe.py <model dir> <texts.json> <out.json> <model dir 2>

Writes, for the texts: greedy rows, sampled rows as one window, sampled rows in reversed windows
(each row at its own global index), a subset alone, and another seed; each row as the task's
output columns. Then the engine loop's failures (`fed_failures`): prompts the engine refuses as
they are added, a row that fails inside the engine (on the second model, whose tokenizer knows
ids its embedding lacks), and an engine that dies once, then twice. tests/test_vllm.py compares them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

SAMPLING = {"do_sample": True, "temperature": 1.3, "top_p": 0.95, "seed": 7}


def main(model: str, texts_path: str, out_path: str, unknown_tokens_model: str) -> None:
    import torch

    from shardinfer.engines.transformers import Transformers
    from shardinfer.engines.vllm.generate import VllmGenerate
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.task import Generate
    from test_generate import run, settings

    torch.set_num_threads(1)  # as the tests' shard jobs (`--set-threads infer=1`): the engine takes as many
    texts = json.loads(Path(texts_path).read_text())
    context = LoadContext(settings(model, engine="vllm"), torch.device("cpu"), torch.float32)
    engine = VllmGenerate.load(Generate, context)
    greedy = run(engine, texts, max_rows=4)
    sampling = dataclasses.replace(engine.task.params, **SAMPLING)  # each row's parameters, as a line gives them
    sampled = run(engine, texts, 4, params=sampling)
    half = len(texts) // 2
    reversed_windows = run(engine, texts[half:], 4, half, sampling) + run(engine, texts[:half], 4, params=sampling)
    subset = run(engine, texts[5:9], 4, 5, sampling)
    other_seed = run(engine, texts, 4, params=dataclasses.replace(sampling, seed=8))
    empty = with_an_empty_prompt(engine)
    transformers = Transformers.load(Generate, LoadContext(settings(model), torch.device("cpu"), torch.float32))
    empty_transformers = with_an_empty_prompt(transformers)
    Path(out_path).write_text(json.dumps({"greedy": greedy, "sampled": sampled, "reversed": reversed_windows,
                                          "half": half, "subset": subset, "other_seed": other_seed,
                                          "generated_tokens": engine.finish()["generated_tokens"], "empty": empty,
                                          "empty_transformers": empty_transformers, "bad_start": bad_start(model),
                                          **engine_facts(), **fed_failures(engine, texts, unknown_tokens_model)}))


def bad_start(model: str) -> str | None:
    """The one line a shard job gives for engine arguments vLLM refuses (max_num_seqs 0)."""
    import torch

    from shardinfer.core.errors import UserError
    from shardinfer.engines.vllm.engine import start_engine
    from shardinfer.tasks.base import LoadContext
    from test_generate import settings

    try:
        start_engine(LoadContext(settings(model, engine="vllm", vllm={"max_num_seqs": 0}), torch.device("cpu"),
                                 torch.float32))
    except UserError as error:
        return str(error)
    return None


def with_an_empty_prompt(engine) -> list:
    """A window whose first prompt has no token at all (a tokenizer that adds no BOS, an empty
    text), through the device loop as a shard job runs it."""
    import numpy as np
    import pyarrow as pa
    import torch

    from shardinfer.settings.config import BatchSettings
    from shardinfer.shard.device_loop import predict_window, prepare_batches
    from shardinfer.tasks.base import Window
    from shardinfer.tasks.generate.params import PromptRows

    window = Window(0, np.array([1, 4]), PromptRows([[], [2, 10, 11, 12]], [engine.task.params] * 2))
    with torch.inference_mode():
        prepared = prepare_batches(engine, window, pa.table({}), BatchSettings(10_000, 4, 64))
        columns = engine.task.to_arrow(predict_window(engine, prepared, torch.device("cpu")), np.arange(2))
    return list(zip(*(column.to_pylist() for column in columns)))


def through_feed(engine, windows: list, record: bool = True, kill_before: tuple[int, ...] = ()) -> dict:
    """Windows (`Window`s) through the engine's loop as a shard job feeds them: a window is
    ready at one call in three while the engine works (as a tokenizer still busy would leave it),
    so windows join an engine with rows in flight. Returns each row's output columns (None for a
    failed row) and the failed rows by global index. The engine is shut down before window k is
    handed over, for k in `kill_before`, as a worker that dies would leave it."""
    import numpy as np
    import pyarrow as pa
    import torch

    from shardinfer.engines.base import NOT_YET
    from shardinfer.settings.config import BatchSettings
    from shardinfer.shard.device_loop import prepare_batches

    items = [(w, w, prepare_batches(engine, w, pa.table({}), BatchSettings(10_000, 4, 64)).batches) for w in windows]
    calls, given = [0], [0]

    def take(wait: bool):
        calls[0] += 1
        if not wait and calls[0] % 3:
            return NOT_YET
        if given[0] == len(items):
            return None
        if given[0] in kill_before:
            kill(engine)
        given[0] += 1
        return items[given[0] - 1]

    rows, failed = [], {}
    with torch.inference_mode():
        for window, results, bad in engine.feed(take, record):
            ok = [p for p in range(window.rows) if p not in bad]
            columns = engine.task.to_arrow(results, np.asarray(ok) + window.first)
            done = dict(zip(ok, zip(*(column.to_pylist() for column in columns))))
            rows += [done.get(p) for p in range(window.rows)]
            failed.update({window.first + p: why for p, why in bad.items()})
    return {"rows": rows, "failed": failed}


def windows_of(engine, texts: list[str], size: int, edit=None) -> list:
    """The texts as the task prepares them, in windows of `size` rows; `edit(row, ids)` may change a
    row's prompt ids afterwards (as no check would let through) or return None to keep them."""
    import dataclasses

    import pyarrow as pa

    windows = []
    for first in range(0, len(texts), size):
        window = engine.task.prepare(first, pa.table({"text": texts[first:first + size]}))
        ids = [(edit and edit(first + p, row)) or row for p, row in enumerate(window.data.ids)]
        windows.append(dataclasses.replace(window, data=dataclasses.replace(window.data, ids=ids)))
    return windows


def one_line(call) -> str | None:
    from shardinfer.core.errors import UserError

    try:
        call()
    except UserError as error:
        return str(error)
    return None


def fed_failures(engine, texts: list[str], unknown_tokens_model: str) -> dict:
    """The engine loop's failures, each against the greedy rows: prompts vLLM refuses as they are
    added (row 2 longer than max_model_len, row 9 with an id past the tokenizer's, over 4 windows),
    a row the workflow refused before (row 5); a row that fails inside the engine's step (row 6,
    id 64: the second model's tokenizer knows it, its embedding of 64 rows does not), narrowed down
    by halves; an engine shut down under the loop with rows in flight (started again once: the same
    rows), and again after its restart."""
    import dataclasses

    import torch

    from shardinfer.engines.vllm.generate import VllmGenerate
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.task import Generate
    from test_generate import settings

    def refusals(row, ids):
        return {2: [ids[0]] + [10] * 39, 9: [*ids, 64]}.get(row)

    windows = windows_of(engine, texts[:16], 4, refusals)
    refused_before = dataclasses.replace(windows[1].data, refused={1: "row 5: refused"})
    windows[1] = dataclasses.replace(windows[1], data=refused_before)
    refused = through_feed(engine, windows)
    refused_fails = one_line(lambda: through_feed(engine, windows_of(engine, texts[:16], 4, refusals), record=False))
    restarted = through_feed(engine, windows_of(engine, texts, 4), kill_before=(3,))
    restarts = engine.restarts
    died_twice = one_line(lambda: through_feed(engine, windows_of(engine, texts, 4), kill_before=(2, 6)))
    kill(engine)  # its parallel state is the process's: one engine at a time
    other = VllmGenerate.load(Generate, LoadContext(settings(unknown_tokens_model, engine="vllm"),
                                                    torch.device("cpu"), torch.float32))
    def inside(row, ids):
        return [*ids, 64] if row == 6 else None

    narrowed = through_feed(other, windows_of(other, texts[:16], 4, inside))
    inside_fails = one_line(lambda: through_feed(other, windows_of(other, texts[:16], 4, inside), record=False))
    return {"refused": refused, "refused_fails": refused_fails, "restarted": restarted, "restarts": restarts,
            "died_twice": died_twice, "narrowed": narrowed, "inside_fails": inside_fails}


def kill(engine) -> None:
    """The engine shut down under the loop, as a worker that dies leaves it: every step fails."""
    engine.llm.llm_engine.engine_core.shutdown()


def engine_facts() -> dict:
    """What the workflow assumes of this vLLM: the LoRA ranks it allows, the names of the engine
    arguments the workflow sets, and the head sizes its CPU attention runs."""
    import dataclasses
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return {"lora_ranks": list(get_args(MaxLoRARanks)),
            "engine_fields": [field.name for field in dataclasses.fields(EngineArgs)],
            "cpu_head_sizes": list(CPUAttentionBackend.get_supported_head_sizes())}


if __name__ == "__main__":
    main(*sys.argv[1:5])
