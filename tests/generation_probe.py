"""Task generate's features on vLLM's engine, driven as the shard runner drives it, in a process of its
own (the in-process engine binds the process's CPU threads and stays loaded, so not in pytest's):

    PYTHONPATH=workflow:tests:scripts python tests/generation_probe.py <the sampled run's folder> <out folder>

With the settings of that run's config (as the Snakefile builds them), it writes Parquet tables
for tests/test_generation.py to compare: `one_window` (every row in one engine call: what one shard
computes), `n4` (4 samples per row), `reversed` (2 samples, the windows in reverse order), `subset`
(rows 5..8 alone), `greedy` (greedy, top 2 log-probabilities), `choice` (greedy, a choice among
CHOICES) and `cut` (json within 6 new tokens). `n4`, `greedy`, `choice` and `cut` give every row
parameters of its own (`PromptRows.params`), as a per-row input would.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path


def main(workdir: str, out: str) -> None:
    import pyarrow.parquet as pq
    import torch

    from generation_data import CHOICES, run_window, settings_of
    from shardinfer.engines.vllm.generate import VllmGenerate
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.params import RowParams
    from shardinfer.tasks.generate.task import Generate

    torch.set_num_threads(1)  # as the tests' shard jobs (`--set-threads infer=1`): the engine takes as many
    settings = settings_of(Path(workdir))
    table = pq.read_table(settings.input.path).select(list(settings.input.task_columns))
    engine = VllmGenerate.load(Generate, LoadContext(settings, torch.device("cpu"), torch.float32))
    base = RowParams.of(settings)
    half = table.num_rows // 2
    tables = {
        "one_window": run_window(engine, table),
        "n4": run_window(engine, table, params=dataclasses.replace(base, n=4)),
        "reversed": pa_concat([run_window(engine, table.slice(half), half), run_window(engine, table.slice(0, half))]),
        "subset": run_window(engine, table.slice(5, 4), 5),
        "greedy": run_window(engine, table, params=greedy(base)),
        "choice": run_window(engine, table, params=dataclasses.replace(base, do_sample=False, n=1, logprobs=None,
                                                                      structured={"choice": CHOICES})),
        "cut": run_window(engine, table, params=dataclasses.replace(base, max_new_tokens=6)),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, result in tables.items():
        pq.write_table(result, Path(out) / f"{name}.parquet")


def greedy(base):
    """The sampled run's parameters, greedy, one completion per row, the top 2 log-probabilities."""
    return dataclasses.replace(base, do_sample=False, n=1, logprobs=2)


def pa_concat(tables):
    import pyarrow as pa

    return pa.concat_tables(tables)


if __name__ == "__main__":
    main(*sys.argv[1:3])
