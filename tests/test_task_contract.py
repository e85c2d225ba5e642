"""The task contract, for every registered task (`shardinfer.tasks.TASKS`) as it is: run by the shard
job function (`run_shard`, no Snakemake) on a tiny model over a two-shard plan, in windows of a few
rows and batches that the costs reorder, each task gives

- from `to_arrow`, exactly the columns it declares (`output_fields`; custom: its code's), each of the
  declared Arrow type (a file column: a value per row), a value per row of the `index` it is handed;
- a shard file whose index column is the shard's range, in order, its kept column the input's rows
  in the input's order, its output columns of the declared types, each row's values those of one
  shard in one window (so the runner put them back in row order);
- its running totals (`Reporting.totals`) among the shard's stats, the columns `evaluate:` compares
  among its outputs (`Reporting.compared`), its cost and its reporting as the small objects the plan
  and the reports read (`shardinfer.tasks.traits`);
- a page, docs/tasks/<name>.md, linked from README.md, and its row in the task tables
  scripts/config_docs.py writes.

A new task adds its tiny model to SETUPS (a line); one that breaks the contract fails here by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from snakemake.utils import validate

import config_docs as DOCS
from factory import REPO, input_frame, texts, workflow_config, write_input
from shardinfer.contract.shard_file import INDEX_COLUMN, arrow_type, file_suffix
from shardinfer.plan.plan_file import read_plan, run_plan
from shardinfer.scores.metrics import SCORERS
from shardinfer.settings.config import Settings
from shardinfer.shard.job import run_shard
from shardinfer.shard.runtime import ShardJob
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.tasks import TASKS, task_class
from shardinfer.tasks.traits import PlanCost, Reporting
from tiny_models import build_tiny_cross_encoder, build_tiny_seq2seq, build_tiny_tagger

SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
ROWS, SHARDS = 14, 2
# Windows of 4 rows, batches of at most 3 sorted by cost: results come back out of row order until
# the runner puts them back.
BATCH = {"max_tokens": 256, "max_rows": 3, "sort_window": 4}

HOOK = '''
class Predictor:
    outputs = {"words": "int64", "shout": "string", "lengths": "list<float32>", "blob": "file:.bin"}

    def predict(self, batch, index):
        text = batch.column("text").to_pylist()
        return {"words": [len(t.split()) for t in text], "shout": [t.upper() for t in text],
                "lengths": [[float(len(w)) for w in t.split()] for t in text],
                "blob": [t.encode() for t in text]}


def build(model_path, options, device):
    return Predictor()
'''


@dataclass
class Shard:
    """One shard job's results: its range, stats, file and what `to_arrow` gave, call by call."""

    start: int
    end: int
    stats: dict
    table: pa.Table
    calls: list[tuple[np.ndarray, list]] = field(default_factory=list)


@dataclass
class Contract:
    """A task's run: its settings and input, its loaded columns, its shards, and one shard's table."""

    settings: Settings
    frame: pd.DataFrame  # the input
    columns: dict  # the loaded task's `columns`
    shards: list[Shard]
    whole: pa.Table  # the same rows as one shard in one window


# Each task's tiny model and what its config adds: a new task adds its line, and the contract covers it.
SETUPS = {
    "classify": lambda root, models, causal_lm: (models.classifier, {}),
    "embed": lambda root, models, causal_lm: (models.encoder, {}),
    "generate": lambda root, models, causal_lm: (causal_lm(), {"model": {"max_new_tokens": 3}}),
    "score": lambda root, models, causal_lm: (build_tiny_cross_encoder(root), {"score": {"pair_column": "passage"}}),
    "token-classify": lambda root, models, causal_lm: (build_tiny_tagger(root), {}),
    "seq2seq": lambda root, models, causal_lm: (build_tiny_seq2seq(root), {"model": {"max_new_tokens": 3}}),
    "custom": lambda root, models, causal_lm: (None, {"model": {"entrypoint": f"{hook(root)}:build"},
                                                      "input": {"columns": ["text"]}}),
}


def hook(root) -> str:
    (root / "hook.py").write_text(HOOK)
    return str(root / "hook.py")


def task_settings(task: str, root, model, extra: dict, shards: int, batch: dict) -> Settings:
    """Settings for `task` on its tiny model over the contract's input, as the Snakefile hands them to a
    job (the config validated with its defaults filled, the settings through their params dict)."""
    frame = input_frame(ROWS, seed=5)
    frame["passage"] = texts(ROWS, seed=7)
    config = workflow_config(write_input(frame, root / "in.parquet"), model, task=task, shards=shards, batch=batch,
                             **extra)
    config["model"]["path"] = model and str(model)
    validate(config, SCHEMA)
    return Settings.from_dict(settings_from_config(config).to_dict())


def run_jobs(settings: Settings, root, calls: list) -> list[Shard]:
    """The plan (with the task's cost) and every shard's job, each shard with the `to_arrow` calls made
    while it ran."""
    cost = task_class(settings.model.task).cost
    plan = str(root / "plan.json")
    run_plan(settings.input, settings.shards, settings.model.max_length, plan, overhead=cost.overhead(settings),
             **cost.image_params(settings))
    shards = []
    for shard in range(settings.shards):
        start, end = read_plan(plan).ranges[shard]
        output = root / "shards" / f"{shard}.parquet"
        files = str(root / "files" / str(shard))
        stats = run_shard(ShardJob(settings, plan, shard, str(output), "digest", files=files))
        shards.append(Shard(start, end, stats, pq.read_table(output), calls[:]))
        calls.clear()
    return shards


def run_task(task: str, root, models, causal_lm) -> Contract:
    """The task's jobs over two shards in small windows, `to_arrow` recorded as the writer calls it,
    and its job over one shard in one window."""
    model, extra = SETUPS[task](root, models, causal_lm)
    settings = task_settings(task, root, model, extra, SHARDS, BATCH)
    calls, loaded = [], {}
    cls = task_class(task)
    original = cls.to_arrow

    def recorded(self, results, index):
        arrays = original(self, results, index)
        loaded["columns"] = dict(self.columns)
        calls.append((np.array(index), list(arrays)))  # a copy: the writer swaps file columns for names
        return arrays

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cls, "to_arrow", recorded)
        shards = run_jobs(settings, root / "sharded", calls)
    whole = task_settings(task, root, model, extra, 1, {"max_rows": 16, "sort_window": 128})
    (table,) = [shard.table for shard in run_jobs(whole, root / "whole", [])]
    frame = pq.read_table(settings.input.path).to_pandas()
    return Contract(settings, frame, loaded["columns"], shards, table)


@pytest.fixture(scope="module")
def contract(models, causal_lm, tmp_path_factory):
    """`contract(task)`: the task's run, made once per module for the tests that ask for it."""
    made: dict[str, Contract] = {}

    def of(task: str) -> Contract:
        if task not in made:
            made[task] = run_task(task, tmp_path_factory.mktemp(f"contract-{task}"), models, causal_lm)
        return made[task]

    return of


NAMES = list(TASKS)


def test_every_registered_task_is_covered():
    assert list(SETUPS) == NAMES, "a task of the registry needs its tiny model in SETUPS"
    assert all(task_class(name).name == name for name in NAMES)


@pytest.mark.parametrize("task", NAMES)
def test_to_arrow_gives_the_declared_columns_and_types_a_value_per_row(task, contract):
    run = contract(task)
    cls = task_class(task)
    if not cls.columns_from_code:
        assert run.columns == cls.output_fields(run.settings)
    assert run.columns, f"task {task} declares no output column"
    for shard in run.shards:
        assert shard.calls, f"task {task}: shard rows [{shard.start}, {shard.end}) reached no to_arrow"
        for index, arrays in shard.calls:
            assert len(arrays) == len(run.columns)
            for (name, spec), values in zip(run.columns.items(), arrays, strict=True):
                assert len(values) == len(index), f"task {task}, column {name}: {len(values)} values, {len(index)} rows"
                if file_suffix(spec):
                    assert all(value is None or isinstance(value, bytes) for value in values)
                else:
                    assert isinstance(values, pa.Array) and values.type == arrow_type(spec), (task, name)


@pytest.mark.parametrize("task", NAMES)
def test_rows_come_back_in_input_order_with_the_declared_types(task, contract):
    run = contract(task)
    assert run.shards[0].start == 0 and run.shards[-1].end == ROWS
    for shard in run.shards:
        rows = list(range(shard.start, shard.end))
        assert np.concatenate([index for index, _ in shard.calls]).tolist() == rows  # windows handed in order
        table = shard.table
        assert table.column_names == [INDEX_COLUMN, "id", "gold", *run.columns]
        assert table.column(INDEX_COLUMN).to_pylist() == rows
        assert table.column("id").to_pylist() == run.frame["id"].tolist()[shard.start:shard.end]
        for name, spec in run.columns.items():
            assert table.schema.field(name).type == arrow_type(spec), (task, name)
        assert shard.stats["rows"] == len(rows)


@pytest.mark.parametrize("task", NAMES)
def test_its_cost_and_reporting_are_what_the_plan_and_the_reports_read(task, contract):
    run = contract(task)
    cls = task_class(task)
    assert isinstance(cls.cost, PlanCost) and isinstance(cls.reporting, Reporting)
    assert isinstance(cls.cost.overhead(run.settings), int) and isinstance(cls.cost.image_params(run.settings), dict)
    reporting = cls.reporting
    assert reporting.scored_as is None or reporting.scored_as in SCORERS
    assert set(reporting.compared.values()) <= set(run.columns)
    for shard in run.shards:
        for name in reporting.totals:
            assert isinstance(shard.stats[name], int), f"task {task}: its running total {name} is not in its stats"
        if reporting.counts_tokens:
            assert shard.stats["real_tokens"] > 0


@pytest.mark.parametrize("task", NAMES)
def test_it_has_a_docs_page_and_a_row_in_the_task_tables(task):
    page = REPO / "docs" / "tasks" / f"{task}.md"
    assert page.is_file(), f"task {task} has no page {page.relative_to(REPO)}"
    assert f"tasks/{task}.md" in (REPO / "mkdocs.yml").read_text()
    assert f"](docs/tasks/{task}.md)" in (REPO / "README.md").read_text(), f"README.md links no page of task {task}"
    for part, table in (("tasks", DOCS.task_table), ("task-pages", DOCS.task_pages)):
        row = next(line for line in table() if line.startswith(f"| `{task}` |"))
        holding = [name for name in DOCS.FILES if part in written_parts((REPO / name).read_text())]
        assert holding
        for name in holding:
            assert row in (REPO / name).read_text(), f"{name} lacks task {task}: run scripts/config_docs.py --write"


def written_parts(text: str) -> set[str]:
    """The names of the parts scripts/config_docs.py writes into a file."""
    return {match["name"] for match in map(DOCS.BEGIN.match, text.splitlines()) if match}


@pytest.mark.parametrize("task", NAMES)
def test_shards_in_small_windows_equal_one_shard_in_one_window(task, contract):
    """Each row's outputs are its own whatever the batch, window and shard it ran in: results put
    back in row order (floats to within what padding changes; a file by its size and digest, its path
    being its shard's)."""
    run = contract(task)
    sharded = pa.concat_tables([shard.table for shard in run.shards])
    assert sharded.column_names == run.whole.column_names
    for name, spec in run.columns.items():
        got, want = (table.column(name).to_pylist() for table in (sharded, run.whole))
        if file_suffix(spec):
            got, want = ([value and {k: v for k, v in value.items() if k != "path"} for value in values]
                         for values in (got, want))
        wrong = [row for row, (a, b) in enumerate(zip(got, want, strict=True)) if not close(a, b)]
        assert not wrong, f"task {task}, column {name}: rows {wrong[:5]} differ from one shard's"


def close(a, b) -> bool:
    """Values equal, floats to a relative 1e-4 (nested in lists and structs too)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(close, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[key], b[key]) for key in a)
    return a == b
