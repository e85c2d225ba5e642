"""Every (task, engine) pair the registries declare (`Task.engines`), run on a tiny model as a shard
job runs it (`run_shard`, after the Snakefile's checks and the plan; no Snakemake): the shard holds
one row per input row, in order, with the keep columns and exactly the columns the task's settings
declare (`Task.output_fields`), of those types, a value in every row, and the task's running
totals among its stats. An engine added to a task's `engines` is tested here without a line more
once its task has a tiny config below.

The pairs of an engine whose modules start it anyway are checked there, on the runs those modules
make (`holds_the_contract`: the same assertions on a finished run's proven table and summary), one
engine start fewer each: vLLM's in tests/test_vllm_pooling.py (the encoder tasks) and
tests/test_generation.py (generate, with n, log-probabilities and a JSON schema); the server's in
tests/test_server.py and tests/test_vllm_pooling.py, against the vLLM servers they start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from factory import REPO, bert_config, input_frame, save_tokenizer, workflow_config, write_input
from shardinfer.tasks import TASKS, task_class

ROWS = 12
# engines whose pairs another module checks, on the runs it makes with what they need up (`holds_the_contract`)
ELSEWHERE = {"server": "tests/test_server.py (generate) and tests/test_vllm_pooling.py (embed) run it against the "
                       "vLLM servers they start",
             "vllm": "tests/test_vllm_pooling.py (the encoder tasks) and tests/test_generation.py (generate) check "
                     "it on their runs of vLLM's CPU build"}
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


def task_config(task: str, root: Path, models, causal_lm) -> dict:
    """A tiny run of `task` over ROWS rows, in `root` (the input written there)."""
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
    paths = {"classify": models.classifier, "embed": models.encoder}
    if task == "score":
        return workflow_config(data, build_tiny_cross_encoder(root), task, score={"pair_column": "passage"})
    if task == "generate":
        config = workflow_config(data, causal_lm(), task, generate={"logprobs": 2})
        config["model"].update(max_length=24, max_new_tokens=4)
        return config
    if task == "seq2seq":
        config = workflow_config(data, build_tiny_seq2seq(root), task, seq2seq={"num_beams": 2})
        config["model"].update(max_new_tokens=4)
        return config
    return workflow_config(data, tagger(root) if task == "token-classify" else paths[task], task)


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


def marks(engine: str) -> list:
    return [pytest.mark.skip(reason=ELSEWHERE[engine])] if engine in ELSEWHERE else []


@pytest.mark.parametrize("task, engine", [pytest.param(task, engine, marks=marks(engine), id=f"{task}-{engine}")
                                          for task, engine in PAIRS])
def test_a_task_on_an_engine_writes_the_columns_its_settings_declare(task, engine, models, causal_lm, tmp_path,
                                                                    monkeypatch):
    config = task_config(task, tmp_path, models, causal_lm)
    if len(task_class(task).engines) > 1:
        config[task] = {**config.get(task, {}), "engine": engine}
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


def holds_the_contract(workdir: Path) -> None:
    """The test above, on a finished `snakemake` run in `workdir` (its config, proven table and
    summary): for the pairs whose engine another module starts anyway (ELSEWHERE)."""
    import yaml

    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    table = pq.read_table(workdir / "results" / "predictions.parquet")
    shards = json.loads((workdir / "results" / "summary.json").read_text())["per_shard"]
    declared, keep = expected_columns(config), config["input"].get("keep_columns", [])
    assert table.column_names == ["index", *keep, *declared]
    assert table.column("index").to_pylist() == list(range(table.num_rows)) > []
    assert sum(shard["rows"] for shard in shards) == table.num_rows
    assert {name: table.schema.field(name).type for name in declared} == declared
    assert all(table.column(name).null_count == 0 for name in declared)
    totals = set(task_class(config["model"]["task"]).reporting.totals)
    assert all(totals <= set(shard) for shard in shards)
