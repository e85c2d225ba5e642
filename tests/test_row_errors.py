"""`row_errors: record`: an exception while predicting is narrowed down to the rows that raise it,
which keep their place with null outputs and an `error`; the rest of the shard goes on. `fail`
(the default) fails the shard in one line, as before.

The narrowing and the cap are checked on the device loop with a toy task; the shard file, the
file proof and gather on shard jobs of a tiny custom hook run directly; and one small `snakemake`
run checks the table and the terminal line end to end.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from factory import REPO, gather_job, read_predictions, run_workflow
from shardinfer.core.errors import ProofError, UserError
from shardinfer.engines.transformers import Transformers
from shardinfer.plan.plan_file import run_plan
from shardinfer.proof.gather import run_gather
from shardinfer.settings.config import BatchSettings, RowErrorSettings, Settings
from shardinfer.shard.device_loop import RowErrors, predict_window, prepare_batches
from shardinfer.shard.job import run_shard
from shardinfer.shard.runtime import ShardJob
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.snakefile.settings_digest import output_digest
from shardinfer.tasks.base import Task, Window
from shardinfer.tasks.traits import PlanCost

CPU = torch.device("cpu")
FAILING = {3, 17}


class Flaky(Task):
    """Doubles each row's number; a batch holding a failing row raises, as a user's predict would."""

    name, outputs, cost = "flaky", {"y": "float32"}, PlanCost(unit="rows")

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.calls = failing, 0

    def collate(self, window: Window, positions: np.ndarray) -> np.ndarray:
        return window.first + np.asarray(positions)

    def predict(self, batch: np.ndarray) -> dict:
        self.calls += 1
        bad = sorted(set(batch.tolist()) & self.failing)
        if bad:
            raise ValueError(f"bad row {bad[0]}")
        return {"y": batch.astype(np.float32) * 2}


def run_window(task: Task, rows: int = 32, errors: RowErrors | None = None) -> dict:
    window = Window(0, np.ones(rows, dtype=np.int64), None)
    engine = Transformers(task)
    prepared = prepare_batches(engine, window, pa.table({"k": np.arange(rows)}), BatchSettings(10_000, rows, rows))
    return predict_window(engine, prepared, CPU, errors)


def test_narrowing_records_exactly_the_failing_rows_and_keeps_the_others():
    clean = run_window(Flaky(set()))["y"]
    task, errors = Flaky(FAILING), RowErrors(shard=0, cap=5)
    results = run_window(task, errors=errors)
    failed = errors.take_window()
    assert sorted(failed) == sorted(FAILING)
    assert failed[3] == "ValueError: bad row 3" and failed[17] == "ValueError: bad row 17"
    others = [k for k in range(32) if k not in FAILING]
    assert np.array_equal(results["y"], clean[others])  # in row order, the failed rows left out
    assert task.calls <= 2 * math.log2(32) * len(FAILING) + 1
    assert errors.stats() == {"row_errors": 2, "first_row_errors": [3, 17], "row_error_calls": task.calls - 1,
                              "first_row_error": "row 3: ValueError: bad row 3"}


def test_a_clean_window_costs_no_extra_call():
    task, errors = Flaky(set()), RowErrors(shard=0, cap=0)
    run_window(task, errors=errors)
    assert task.calls == 1 and errors.stats()["row_error_calls"] == 0


@pytest.mark.parametrize("limit", [1, 0.05])  # a count; a fraction: 5% of 32 rows is 1
def test_more_failed_rows_than_the_cap_fail_the_shard_in_one_line(limit):
    cap = RowErrorSettings("record", limit).cap(32)
    assert cap == 1
    with pytest.raises(UserError, match=r"shard 0: 2 rows failed, more than row_errors.max allows \(1\); "
                                        r"first rows: 3, 17; first error: row 3: ValueError: bad row 3") as caught:
        run_window(Flaky(FAILING), errors=RowErrors(shard=0, cap=cap))
    assert "\n" not in str(caught.value)


def test_the_cap_is_a_count_or_a_fraction_of_the_shards_rows():
    assert RowErrorSettings("record", 3).cap(1000) == 3
    assert RowErrorSettings("record", 0.01).cap(1000) == 10
    assert RowErrorSettings("record", 0.01).cap(99) == 0


def test_fail_raises_the_first_error_as_before():
    task = Flaky(FAILING)
    with pytest.raises(ValueError, match="bad row 3"):
        run_window(task)
    assert task.calls == 1


HOOK = '''
import os
import time
from pathlib import Path

FAILING = set({failing})

class Predictor:
    outputs = {{"blob": "file:.bin", "y": "float64"}}

    def predict(self, table, index):
        if int(os.environ.get("HOOK_STOP_AT", "-1")) in set(int(i) for i in index):  # until signalled
            Path("stopped.pid").write_text(str(os.getpid()))
            while True:
                time.sleep(0.02)
        bad = sorted(set(int(i) for i in index) & FAILING)
        if bad:
            raise ValueError(f"bad row {{bad[0]}}")
        return {{"blob": [bytes([int(i)]) * 4 for i in index],
                "y": [float(v) * 2 for v in table.column("x").to_pylist()]}}

def build(model_path, options, device):
    return Predictor()
'''


def hook_config(rows: int, shards: int, mode: str = "record", limit: float = 5, failing=FAILING) -> dict:
    """A tiny custom task on `rows` rows of data.csv (written here), with a hook failing on `failing`."""
    Path("hook.py").write_text(HOOK.format(failing=sorted(failing)))
    pd.DataFrame({"id": [f"r{i}" for i in range(rows)], "x": np.arange(rows) * 1.5}).to_csv("data.csv", index=False)
    return {"input": {"path": "data.csv", "columns": ["x"], "keep_columns": ["id"]},
            "model": {"task": "custom", "entrypoint": "hook.py:build", "path": None},
            "batch": {"max_rows": 8, "sort_window": 16}, "shards": shards,
            "row_errors": {"mode": mode, "max": limit}}


def validated(config: dict) -> Settings:
    from snakemake.utils import validate

    config = json.loads(json.dumps(config))
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return settings_from_config(config)


def shard_jobs(settings: Settings) -> list[ShardJob]:
    run_plan(settings.input, settings.shards, settings.model.max_length, "plan.json")
    digest = output_digest(settings)
    return [ShardJob(settings, "plan.json", k, f"shards/{k}.parquet", digest, files=f"files/{k}")
            for k in range(settings.shards)]


def test_record_writes_every_row_in_place_and_gather_proves_the_absent_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = validated(hook_config(24, 2))
    jobs = shard_jobs(settings)
    stats = [run_shard(job) for job in jobs]
    assert sum(s["row_errors"] for s in stats) == 2 and stats[0]["first_row_errors"] == [3]

    def gather():
        return run_gather(gather_job("plan.json", [j.output for j in jobs], settings.input,
                                     settings.to_dict()["model"], jobs[0].digest, "out.parquet", "out.json",
                                     files_folders=[j.files for j in jobs]))

    summary = gather()
    table = pq.read_table("out.parquet").to_pandas()
    assert table["index"].tolist() == list(range(24)) and table["id"].tolist() == [f"r{i}" for i in range(24)]
    assert set(table.index[table["error"].notna()]) == FAILING
    assert table.loc[3, "error"] == "ValueError: bad row 3"
    assert table.loc[list(FAILING), ["y", "blob"]].isna().all().all()
    good = table.drop(index=list(FAILING))
    assert good["y"].tolist() == [i * 3.0 for i in good["index"]] and good["blob"].notna().all()
    assert sorted(p.name for p in Path("files/0").iterdir()) == [f"{i:09d}.bin" for i in range(12) if i != 3]
    assert [s["row_errors"] for s in summary["per_shard"]] == [1, 1]
    Path(good.iloc[0]["blob"]["path"]).unlink()  # a successful row's file missing is still refused
    with pytest.raises(ProofError, match=r"row 0: file `files/0/000000000.bin` is missing"):
        gather()


def test_the_default_is_unchanged_no_error_column_and_the_same_digest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = hook_config(12, 1, failing=set())
    del config["row_errors"]
    default = validated(config)
    assert default.row_errors == RowErrorSettings("fail", 0.01)
    digest = output_digest(default)
    assert output_digest(dataclasses.replace(default, row_errors=RowErrorSettings("fail", 7))) == digest
    assert output_digest(dataclasses.replace(default, row_errors=RowErrorSettings("record", 0.01))) != digest
    run_shard(shard_jobs(default)[0])
    assert "error" not in pq.read_schema("shards/0.parquet").names
    assert "row_errors" not in json.loads(pq.read_metadata("shards/0.parquet").metadata[b"shardinfer.stats"])


def test_fail_mode_fails_the_shard_in_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = shard_jobs(validated(hook_config(12, 1, mode="fail")))[0]
    with pytest.raises(UserError, match=r"predict failed on rows? .*ValueError: bad row 3") as caught:
        run_shard(job)
    assert "\n" not in str(caught.value) and not Path(job.output).exists() and not Path(job.files).exists()


def test_a_shard_above_the_cap_fails_and_leaves_no_shard_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = shard_jobs(validated(hook_config(24, 1, limit=1)))[0]
    with pytest.raises(UserError,
                       match=r"shard 0: 2 rows failed, more than row_errors.max allows \(1\); first rows: 3, 17"):
        run_shard(job)
    assert not Path(job.output).exists() and not Path(job.files).exists()


def test_a_whole_count_is_required_above_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"row_errors.max is a count of rows when 1 or more .*got 2.5"):
        validated(hook_config(12, 1, limit=2.5))


@pytest.mark.e2e
def test_end_to_end_a_stopped_shard_resumes_and_the_terminal_says_which_rows_failed(tmp_path, monkeypatch):
    """Under `snakemake`: SIGTERM to a shard job (as Slurm sends at a time limit) fails it in one
    line; the committed windows survive Snakemake's cleanup of the failed job; the same command
    again resumes the shard there, and the row errors of kept and new windows are counted together."""
    import os
    import signal

    import patience
    from factory import prepare_workdir

    monkeypatch.chdir(tmp_path)
    config = hook_config(48, 2)  # shard 0: rows [0, 24), windows [0, 1), [1, 17), [17, 24)
    command, env = prepare_workdir(tmp_path, config)
    stopped = patience.Started(command, [tmp_path], merged=True, cwd=tmp_path, env={**env, "HOOK_STOP_AT": "20"})
    patience.until(lambda: Path("stopped.pid").exists(), [tmp_path], stopped.process, "the hook to block")
    os.kill(int(Path("stopped.pid").read_text()), signal.SIGTERM)
    ended = stopped.finish("the stopped run")
    out = ended.stdout
    assert ended.returncode != 0
    assert "ERROR shard 0: stopped by SIGTERM at row 17; rerun resumes there" in out
    assert not Path("results/predictions.parquet").exists()
    assert sorted(p.name for p in Path("results/shards/.0.parquet.windows").glob("*.parquet")) == [
        "000000000000.parquet", "000000000001.parquet"]  # Snakemake's cleanup of the failed job left them
    result = run_workflow(tmp_path, config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resumed at row 17 (17 rows kept)" in Path("logs/infer/0.log").read_text()
    table = read_predictions(tmp_path)
    assert table["index"].tolist() == list(range(48)) and table["id"].tolist() == [f"r{i}" for i in range(48)]
    assert set(table.index[table["error"].notna()]) == FAILING  # row 3 in a kept window, row 17 computed again
    assert table.loc[list(FAILING), ["y", "blob"]].isna().all().all()
    good = table.drop(index=list(FAILING))
    assert good["y"].tolist() == [i * 3.0 for i in good["index"]] and good["blob"].notna().all()
    summary = json.loads(Path("results/summary.json").read_text())
    assert [s["resumed_rows"] for s in summary["per_shard"]] == [17, 0]
    assert [s["row_errors"] for s in summary["per_shard"]] == [2, 0]
    assert ("shardinfer: WARNING 2 of 48 rows failed (first rows: 3, 17); their `error` column says why: "
            "results/predictions.parquet") in result.stdout + result.stderr


def test_record_is_taken_by_the_vllm_engine_too(causal_lm):
    """vLLM's engine loop fails a bad prompt's row alone (tests/test_vllm.py runs it)."""
    from factory import settings_for
    from shardinfer.engines import check_engine
    from shardinfer.engines.vllm.checks import vllm_installed
    from shardinfer.settings.config import ModelSettings
    from shardinfer.tasks.generate.task import Generate

    if not vllm_installed():
        pytest.skip("vLLM is not installed")
    model = ModelSettings(path=str(causal_lm()), adapter=None, task="generate", max_length=24,
                          dtype="auto", trust_remote_code=False, allow_pickle=False, max_new_tokens=10)
    settings = settings_for(model, task_settings={"engine": "vllm"}, row_errors=RowErrorSettings("record", 0.01))
    Generate.check_settings(settings)
    check_engine(settings)


def test_the_terminal_and_the_report_say_how_many_rows_failed_and_the_first():
    from shardinfer.report.snakemake_report import failed_rows_item
    from shardinfer.report.terminal import summary_lines

    summary = {"rows": 40, "shards": 2, "run": {}, "per_shard": [
        {"row_errors": 1, "first_row_errors": [17]}, {"row_errors": 2, "first_row_errors": [23, 31]}]}
    lines = summary_lines(summary, "results/predictions.parquet", "results/summary.json", report=False)
    assert ("shardinfer: WARNING 3 of 40 rows failed (first rows: 17, 23, 31); their `error` column says why: "
            "results/predictions.parquet") in lines
    assert failed_rows_item(summary) == [["rows failed (row_errors: record)",
                                          "3 (first rows: 17, 23, 31; non-null `error` in the predictions)"]]
    clean = {**summary, "per_shard": [{"row_errors": 0, "first_row_errors": []}]}
    assert not any("failed" in line for line in summary_lines(clean, "p", "s", report=False))
    assert failed_rows_item({"per_shard": [{}]}) == []  # fail mode: no item


def test_a_text_row_that_fails_alone_is_recorded_and_the_others_are_the_models_own(models, tmp_path, monkeypatch):
    """classify, a real model: its forward raises on any batch holding row 13's text (a [MASK]
    token, which no other text has), as a row that runs a device out of memory alone would."""
    from transformers import BertForSequenceClassification

    import reference
    from factory import input_frame, input_settings, write_input
    from shardinfer.settings.config import ModelSettings

    frame = input_frame(40, seed=6)
    frame.loc[13, "text"] = "the [MASK] cat"
    real = BertForSequenceClassification.forward

    def forward(self, input_ids=None, **kwargs):
        if (input_ids == 4).any():  # [MASK]
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(BertForSequenceClassification, "forward", forward)
    inp = input_settings(write_input(frame, tmp_path / "in.parquet"), keep_columns=("id",))
    model = ModelSettings(path=str(models.classifier), adapter=None, task="classify", max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(512, 16, 64), shards=1,
                        row_errors=RowErrorSettings("record", 2))
    run_plan(inp, 1, 32, str(tmp_path / "plan.json"))
    stats = run_shard(ShardJob(settings, str(tmp_path / "plan.json"), 0, str(tmp_path / "0.parquet"), "digest"))
    table = pq.read_table(tmp_path / "0.parquet").to_pandas()
    assert stats["row_errors"] == 1 and stats["first_row_errors"] == [13] and stats["row_error_calls"] > 0
    assert table["index"].tolist() == list(range(40)) and table["id"].tolist() == frame["id"].tolist()
    assert table.loc[13, "error"] == "RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB"
    assert table.loc[13, ["label", "label_id", "probs"]].isna().all() and table["error"].isna().sum() == 39
    others = [i for i in range(40) if i != 13]
    label_ids, probs = reference.classify(models.classifier, frame["text"][others].tolist(), max_length=32)
    assert table.loc[others, "label_id"].tolist() == label_ids.tolist()
    np.testing.assert_allclose(np.stack(table.loc[others, "probs"]), probs, atol=1e-5)
