"""output.layout parts through a real `snakemake` run: named inputs of one shard and of three, whose
folders of parts equal the one-file layout's table row for row as pandas, pyarrow, Hugging Face
`datasets` and DuckDB read them; the summary, terminal, `evaluate:` scores and report as with one
file; beside them (`output.writers: [parquet, jsonl]`) a folder of JSON Lines parts, the same rows;
a part deleted by hand makes gather, and nothing else, run again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import made_once
from factory import input_frame, run_workflow, run_workflows_ok, workflow_config, write_input
from shardinfer.proof.verify import verify_folder
from shardinfer.scores.metrics import score_predictions
from test_workflow import assert_same_rows

pytestmark = pytest.mark.e2e  # the run, and its rerun, start snakemake

ROWS = 1000
SHARDS = {"one": 1, "three": 3}
PART_SIZE = "20kB"  # the one shard's ~38 kB in two parts; each of the three shards (~13 kB) one part


def parts_config(models) -> dict:
    config = workflow_config("data/input.parquet", models.classifier, evaluate={"label_column": "gold"},
                             output={"layout": "parts", "part_size": PART_SIZE, "writers": ["parquet", "jsonl"]})
    inp = config.pop("input")
    config["inputs"] = {name: {**inp, "shards": shards} for name, shards in SHARDS.items()}
    return config


@pytest.fixture(scope="module")
def parts_run(models, tmp_path_factory) -> tuple[Path, dict, str]:
    """The run, made once: its folder, config and terminal."""
    config = parts_config(models)

    def make(folder: Path) -> None:
        write_input(input_frame(ROWS), folder / "data" / "input.parquet")
        (result,) = run_workflows_ok([(folder, config)], report=True)
        (folder / "terminal.txt").write_text(result.stdout + result.stderr)

    folder = made_once(tmp_path_factory, "parts-run", make)
    return folder, config, (folder / "terminal.txt").read_text()


@pytest.fixture(scope="module")
def one_file(classify_runs) -> pd.DataFrame:
    """The one-file layout's table of the same input and settings (conftest's shared run)."""
    return classify_runs(ROWS, 1).predictions


def folder_of(workdir: Path, name: str) -> Path:
    return workdir / "results" / name / "predictions"


@pytest.mark.parametrize("name", SHARDS)
def test_pandas_and_pyarrow_read_the_folder_as_the_one_file_table_row_for_row(parts_run, one_file, name):
    import pyarrow.dataset as ds

    folder = folder_of(parts_run[0], name)
    for got in (pd.read_parquet(folder), ds.dataset(folder).to_table().to_pandas()):
        assert got["index"].tolist() == list(range(ROWS))
        assert_same_rows(got, one_file, float_columns={"probs"})
        assert got.dtypes.to_dict() == one_file.dtypes.to_dict()


@pytest.mark.parametrize("name", SHARDS)
def test_datasets_and_duckdb_read_the_folder_in_index_order_passing_the_manifest_over(parts_run, one_file, name,
                                                                                     tmp_path):
    import datasets
    import duckdb

    folder = folder_of(parts_run[0], name)
    loaded = datasets.load_dataset("parquet", data_dir=str(folder), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == ROWS and loaded.column_names == list(one_file.columns)
    assert_same_rows(loaded.to_pandas(), one_file, float_columns={"probs"})
    frame = duckdb.sql(f"SELECT * FROM read_parquet('{folder}/*.parquet')").df()
    assert frame["index"].tolist() == list(range(ROWS)) and frame["id"].tolist() == one_file["id"].tolist()
    assert frame["label_id"].tolist() == one_file["label_id"].tolist()


def test_each_folder_is_its_shards_files_in_parts_proven_by_its_manifest(parts_run):
    workdir, _, terminal = parts_run
    for name, shards in SHARDS.items():
        folder = folder_of(workdir, name)
        plan = json.loads((workdir / "results" / name / "plan.json").read_text())
        manifest = verify_folder(str(folder), plan_id=plan["plan_id"])
        parts = sorted(path for path in folder.iterdir() if not path.name.startswith("."))
        assert [path.name for path in parts] == [part["name"] for part in manifest["parts"]]
        assert len(parts) == (2 if shards == 1 else 3)  # part_size cuts the one shard, not the three
        assert all(path.stat().st_nlink == 2 for path in parts)  # each the shard's own file, linked
        summary = json.loads((workdir / "results" / name / "summary.json").read_text())
        assert summary["output"] == {"layout": "parts", "path": f"results/{name}/predictions/", "parts": len(parts),
                                     "bytes": sum(path.stat().st_size for path in parts), "manifest": ".manifest.json"}
        assert (f"rows written to results/{name}/predictions/, proven complete and in input order ({shards} shard"
                in terminal)
        assert f": {len(parts)} parts, " in terminal and "proven by its .manifest.json" in terminal


@pytest.mark.parametrize("name", SHARDS)
def test_the_json_lines_parts_beside_the_folder_hold_the_same_rows(parts_run, name):
    """The jsonl writer's folder, a directory() output of gather: its parts in name order are the rows
    of the Parquet folder in index order, the JSON of its values (probs: the float32s as the doubles
    they are); beside them only Snakemake's hidden .snakemake_timestamp, which readers pass over."""
    folder = parts_run[0] / "results" / name / "predictions-jsonl"
    parts = sorted(folder.glob("part-*"))
    assert sorted(path.name for path in folder.iterdir() if path not in parts) == [".snakemake_timestamp"]
    assert parts and all(path.name.endswith(f"-of-{len(parts):05d}.jsonl") for path in parts)
    rows = [json.loads(line) for path in parts for line in path.read_text().splitlines()]
    table = pd.read_parquet(folder_of(parts_run[0], name))
    assert [row["index"] for row in rows] == list(range(ROWS)) and list(rows[0]) == list(table.columns)
    assert [[row[column] for column in ("id", "gold", "label", "label_id")] for row in rows] == \
        table[["id", "gold", "label", "label_id"]].values.tolist()
    assert [row["probs"] for row in rows] == [[float(x) for x in probs] for probs in table["probs"]]
    summary = json.loads((parts_run[0] / "results" / name / "summary.json").read_text())
    assert summary["outputs"]["jsonl"]["parts"] == len(parts) and summary["outputs"]["jsonl"]["rows"] == ROWS


def test_scores_and_report_are_those_of_the_one_file_table(parts_run, classify_runs):
    workdir = parts_run[0]
    table = classify_runs(ROWS, 1).workdir / "results" / "predictions.parquet"
    for name in SHARDS:
        summary = json.loads((workdir / "results" / name / "summary.json").read_text())
        assert summary["metrics"] == score_predictions(str(table), summary["model"], "gold")
        assert summary["metrics"]["scored"] == ROWS
        assert (workdir / "results" / name / "report" / "metrics.html").is_file()
        assert (workdir / "results" / name / "report" / "run.html").is_file()


def test_a_part_deleted_by_hand_reruns_gather_alone_which_links_it_again(parts_run, tmp_path):
    """In a copy of the run, gathered once there (a copy's files are new inodes: gather reads their
    bytes once and records them), a part is deleted: the next run reruns that input's gather alone,
    which reads the bytes of that shard only (its file's links changed) and links the part again."""
    workdir, config, _ = parts_run
    shutil.copytree(workdir, tmp_path, dirs_exist_ok=True, symlinks=True)
    settled = run_workflow(tmp_path, config)
    assert settled.returncode == 0 and "rule infer:" not in settled.stdout + settled.stderr
    folder = folder_of(tmp_path, "three")
    shards = {path: path.lstat().st_mtime_ns for path in (tmp_path / "results").glob("*/shards/*.parquet*")}
    removed = sorted(folder.glob("part-*"))[1]
    removed.unlink()
    result = run_workflow(tmp_path, config)
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-3000:]
    assert f"shardinfer: `results/three/predictions/`: part `{removed.name}` is missing" in shown
    assert "its manifest is withdrawn: gather runs again" in shown
    assert shown.count("rule gather:") == 1 and "rule infer:" not in shown and "rule plan:" not in shown
    assert "wildcards: name=three" in shown.split("rule gather:")[1]
    assert removed.is_file() and os.stat(removed).st_nlink == 2 and verify_folder(str(folder))["rows"] == ROWS
    assert {path: path.lstat().st_mtime_ns for path in shards} == shards  # no shard file was written again
    log = (tmp_path / "logs" / "three" / "gather.log").read_text()
    assert "1 of 3 shards were changed since their job wrote them (copied, touched or linked): 1 have" in log
