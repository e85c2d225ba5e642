"""Several named inputs in one run (`inputs:`): a `val` and a `test` split through the same model, each
with its own plan, shards and proven table under results/<name>/, their shard jobs in one queue."""

from __future__ import annotations

import copy
import gzip
import json
import re
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import patience
import reference
from factory import gzipped, input_frame, prepare_workdir, run_workflow, workflow_config, write_input
from shardinfer.core.errors import UserError
from shardinfer.report.terminal import summary_lines
from shardinfer.snakefile.checks import check_input_keys, check_inputs, schema_errors
from shardinfer.snakefile.configure import settings_by_input
from shardinfer.snakefile.rule_params import shared_tokenizer_key
from test_config import DEFAULTS

SCHEMA = "workflow/schemas/config.schema.yaml"
ATOL = 1e-5  # float32 on CPU: batched vs unbatched attention differs by ~1e-7
SHARDS = {"val": 2, "test": 1}  # val: the top-level `shards: auto` (--resources gpu=2, or 2 cores); test: its own
GPUS = ("--resources", "gpu=2")


def named_config(model) -> dict:
    """`inputs:` with a gzipped CSV `val` (staged: its shards read a decompressed copy) and a Parquet
    `test`, tokenized ahead (rule tokenize runs per input too); val's count is `auto`'s."""
    config = workflow_config("unused", model, shards="auto", tokenize={"ahead": True})
    keep = config.pop("input")["keep_columns"]
    config["inputs"] = {"val": {"path": "data/val.csv.gz", "keep_columns": keep, "stage": "always"},
                        "test": {"path": "data/test.parquet", "keep_columns": keep, "shards": SHARDS["test"]}}
    return config


def shard_files(workdir: Path, name: str) -> list[Path]:
    return sorted((workdir / "results" / name / "shards").glob("*.parquet"))


def assert_is_the_models_output(workdir: Path, name: str, frame: pd.DataFrame, model: Path) -> None:
    """results/<name>/predictions.parquet is the model's own output per text, row for row, proven."""
    got = pd.read_parquet(workdir / "results" / name / "predictions.parquet")
    label_ids, probs = reference.classify(model, frame["text"].tolist(), max_length=32)
    assert got["index"].tolist() == list(range(len(frame)))
    assert got["id"].tolist() == frame["id"].tolist()
    assert got["gold"].astype(str).tolist() == frame["gold"].astype(str).tolist()  # CSV columns are read as text
    assert got["label_id"].tolist() == label_ids.tolist()
    np.testing.assert_allclose(np.stack(got["probs"]), probs, atol=ATOL)
    gather_log = (workdir / "logs" / name / "gather.log").read_text()
    assert f"proof holds: {SHARDS[name]} shards, {len(frame)} rows" in gather_log


@dataclass
class NamedRun:
    workdir: Path
    config: dict
    frames: dict[str, pd.DataFrame]  # the inputs of the first run
    edited: dict[str, pd.DataFrame]  # the inputs of the second: val replaced
    terminals: tuple[str, str]  # what each run printed
    first_mtimes: dict[Path, int]  # every shard file and summary after the first run


@pytest.fixture(scope="module")
def named_run(models, tmp_path_factory) -> NamedRun:
    """The first run, checked at once (its tables are replaced below), then `val` replaced by other
    texts (more rows) and the same command again."""
    workdir = tmp_path_factory.mktemp("named-inputs")
    frames = {"val": input_frame(30, seed=3), "test": input_frame(50, seed=4)}
    gzipped(frames["val"], workdir / "data" / "val.csv.gz")
    write_input(frames["test"], workdir / "data" / "test.parquet")
    config = named_config(models.classifier)
    first = run_workflow(workdir, config, *GPUS, report=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    for name, frame in frames.items():
        assert_is_the_models_output(workdir, name, frame, models.classifier)
    mtimes = {path: path.stat().st_mtime_ns for name in frames
              for path in [*shard_files(workdir, name), workdir / "results" / name / "summary.json"]}

    edited = {**frames, "val": input_frame(36, seed=5)}
    gzipped(edited["val"], workdir / "data" / "val.csv.gz")
    second = run_workflow(workdir, config, *GPUS, report=True)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-6000:]
    terminals = (first.stdout + first.stderr, second.stdout + second.stderr)
    return NamedRun(workdir, config, frames, edited, terminals, mtimes)


@pytest.mark.e2e
def test_each_input_is_the_models_own_output_proven_in_its_own_folder(named_run):
    """The tables themselves are checked in the fixture (assert_is_the_models_output), before the second run."""
    workdir, terminal = named_run.workdir, named_run.terminals[0]
    for name in named_run.frames:
        assert len(shard_files(workdir, name)) == SHARDS[name]
        assert (workdir / "results" / name / "plan.json").is_file()
        assert f"rows written to results/{name}/predictions.parquet, proven complete" in terminal
    assert not (workdir / "results" / "predictions.parquet").exists()  # nothing at the one-input paths
    # One DAG: the shard jobs of both inputs in one run, so `--resources gpu=N` queues them together.
    assert re.search(r"^infer\s+3$", terminal, re.M) and re.search(r"^tokenize\s+3$", terminal, re.M)
    assert terminal.count("snakemake --report report.zip") == 1
    # 2: one per GPU given, or on a machine that shows none, per core (`--cores 2`)
    assert terminal.count("shardinfer: shards: auto -> 2 (") == 1


@pytest.mark.e2e
def test_editing_one_input_replans_only_that_input(named_run, models):
    workdir, terminal = named_run.workdir, named_run.terminals[1]
    for name, frame in named_run.edited.items():
        assert_is_the_models_output(workdir, name, frame, models.classifier)
    kept = [*shard_files(workdir, "test"), workdir / "results" / "test" / "summary.json"]
    assert {path: path.stat().st_mtime_ns for path in kept} == {path: named_run.first_mtimes[path] for path in kept}
    assert all(path.stat().st_mtime_ns != named_run.first_mtimes[path] for path in shard_files(workdir, "val"))
    assert re.search(r"^infer\s+2$", terminal, re.M)  # val's shards only
    assert "rows written to results/val/predictions.parquet" in terminal  # the summary of the gather that ran
    assert "rows written to results/test/predictions.parquet" not in terminal
    plan = json.loads((workdir / "results" / "val" / "plan.json").read_text())
    staged = plan["input"]["parts"][0]["staged"]["path"]  # made again from the new val
    assert staged == "results/val/staged/00000.csv"
    assert (workdir / staged).read_bytes() == gzip.decompress((workdir / "data" / "val.csv.gz").read_bytes())


@pytest.mark.e2e
def test_the_report_has_each_inputs_items(named_run):
    command, env = prepare_workdir(named_run.workdir, named_run.config, "--report", "report.zip", report=True)
    result = patience.run(command, [named_run.workdir], cwd=named_run.workdir, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    with zipfile.ZipFile(named_run.workdir / "report.zip") as report:
        items = Counter(Path(name).name for name in report.namelist() if name.startswith("report/data/raw/"))
        page = report.read("report/report.html").decode()
    assert items == {item: 2 for item in ("run.html", "shards.html", "rows_per_s.png", "stages.png",
                                          "token_lengths.png")}
    for name in named_run.frames:  # each item labelled with its input
        assert f'"results/{name}/report/run.html": {{"name": "run.html"' in page
        assert f'"labels": {{"input": "{name}", "item": "the run at a glance"}}' in page


# Config checks, at load, before any job: each names the bad value and what is allowed.


def full_config(inputs: dict | None = None, **extra) -> dict:
    config = {**copy.deepcopy(DEFAULTS), "model": {**DEFAULTS["model"], "path": "m"}, **extra}
    config.pop("input")
    if inputs is not None:
        config["inputs"] = {name: {**DEFAULTS["input"], **section} for name, section in inputs.items()}
    return config


@pytest.mark.parametrize("config,message", [
    ({"model": {}},
     r"config needs `input` \(one table\) or `inputs` \(named tables, e.g. val and test\); it has neither"),
    ({"model": {}, "input": {"path": "a.csv"}, "inputs": {"val": {"path": "b.csv"}}},
     r"config has both `input` and `inputs`; give one.*add --replace-workflow-config to use it alone"),
    ({"model": {}, "inputs": {"val set": {"path": "a.csv"}}},
     r"config `inputs`: the name 'val set' is not allowed; a name holds letters, digits, `_` and `-` only"),
    ({"model": {}, "inputs": {"../x": {"path": "a.csv"}}}, r"the name '../x' is not allowed"),
    ({"model": {}, "inputs": {2024: {"path": "a.csv"}}}, r"the name 2024 is not allowed"),
])
def test_input_or_inputs_and_their_names(config, message):
    with pytest.raises(UserError, match=message):
        check_input_keys(config)


@pytest.mark.parametrize("inputs,message", [
    ({}, r"config `inputs`: \{\} should be non-empty"),
    ({"val": {"path": "a.csv", "shard": 2}}, r"config `inputs.val`: Additional properties are not allowed \('shard'"),
    ({"val": {"path": "a.csv", "shards": 0}},
     r"config `inputs.val.shards`: 0 is not allowed; give an integer >= 1 or `auto`"),
    ({"val": {"format": "csv"}}, r"config `inputs.val`: 'path' is a required property"),
])
def test_schema_refuses_bad_inputs_naming_the_key(inputs, message):
    with pytest.raises(UserError, match=message):
        schema_errors({"model": {"path": "m"}, "inputs": inputs}, SCHEMA)


def test_each_input_has_its_settings_and_shards(tmp_path):
    for name in ("val", "test"):
        write_input(input_frame(3), tmp_path / f"{name}.parquet")
    config = full_config({"val": {"path": str(tmp_path / "val.parquet")},
                          "test": {"path": str(tmp_path / "test.parquet"), "text_column": "body", "shards": 5}})
    by_name = settings_by_input(config, auto_shards=3)
    assert list(by_name) == ["val", "test"]
    assert by_name["val"].shards == 3 and by_name["test"].shards == 5  # `auto` (the default), and its own
    assert by_name["test"].input.text_column == "body" and by_name["val"].input.text_column == "text"
    assert by_name["val"].model == by_name["test"].model
    one = {**full_config(), "input": {**DEFAULTS["input"], "path": str(tmp_path / "val.parquet")}}
    assert list(settings_by_input(one, auto_shards=3)) == [None]
    with pytest.raises(UserError, match=r"config `shards: auto` needs this machine's count"):
        settings_by_input(one)


def test_a_bad_named_input_is_named(tmp_path, models):
    write_input(input_frame(3), tmp_path / "val.parquet")
    config = full_config({"val": {"path": str(tmp_path / "val.parquet")}, "test": {"path": str(tmp_path / "no.csv")}},
                         model={**DEFAULTS["model"], "path": str(models.classifier), "max_length": 32})
    with pytest.raises(UserError, match=r"^inputs.test: input.path `.*no.csv` does not exist"):
        check_inputs(settings_by_input(config, auto_shards=1))


def test_one_tokenizer_key_for_all_inputs():
    assert shared_tokenizer_key(["k1", "k1"]) == "k1"
    assert shared_tokenizer_key(["k1", "k2"]) == shared_tokenizer_key(["k2", "k1", "k2"]) not in ("k1", "k2")


def test_summary_lines_point_to_the_inputs_own_logs():
    summary = {"rows": 4, "shards": 1, "truncated": 1, "per_shard": [{"first_truncated_rows": [2]}],
               "run": {"max_length": 8}}
    lines = summary_lines(summary, "results/val/predictions.parquet", "results/val/summary.json",
                          "logs/val/infer/<shard>.log", report=False)
    assert lines[0].startswith("shardinfer: 4 rows written to results/val/predictions.parquet")
    assert "logs/val/infer/<shard>.log" in lines[-1] and not any("report.zip" in line for line in lines)
