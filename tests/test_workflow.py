"""End to end through real `snakemake` runs: any shard count gives the same table, row for row,
and row i is the model's own output for text i."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import reference
from factory import (
    input_frame,
    read_predictions,
    run_workflow,
    run_workflows,
    run_workflows_ok,
    workflow_config,
    write_empty_input,
    write_input,
)
from shardinfer.hf.cpu_linear import onednn_linear_available

pytestmark = pytest.mark.e2e  # every test here runs the workflow or reads a run of it

ATOL = 1e-5  # float32 on CPU: batched vs unbatched attention differs by ~1e-7


def run_ok(workdir, config, *args):
    result = run_workflow(workdir, config, *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return read_predictions(workdir)


def assert_same_rows(got: pd.DataFrame, want: pd.DataFrame, float_columns):
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want)
    for column in got.columns:
        if column in float_columns:
            np.testing.assert_allclose(np.stack(got[column]), np.stack(want[column]), atol=ATOL)
        else:
            assert got[column].tolist() == want[column].tolist(), column


@pytest.mark.parametrize("shards", [4])
def test_classify_any_shard_count_equals_one_shard(classify_runs, shards):
    assert_same_rows(classify_runs(1000, shards).predictions, classify_runs(1000, 1).predictions,
                     float_columns={"probs"})


@pytest.mark.parametrize("rows,shards", [(1000, 1), (1000, 4), (2, 3)])
def test_classify_rows_are_the_models_own_outputs(classify_runs, models, rows, shards):
    """Against the model run on each text alone: with more shards than rows (empty shards) too."""
    run = classify_runs(rows, shards)
    got, frame = run.predictions, run.frame
    label_ids, probs = reference.classify(models.classifier, frame["text"].tolist(), max_length=32)
    assert list(got.columns) == ["index", "id", "gold", "label", "label_id", "probs"]
    assert got["index"].tolist() == list(range(rows))
    assert got["id"].tolist() == frame["id"].tolist() and got["gold"].tolist() == frame["gold"].tolist()
    assert got["label_id"].tolist() == label_ids.tolist()
    assert got["label"].tolist() == [["negative", "neutral", "positive"][i] for i in label_ids]
    np.testing.assert_allclose(np.stack(got["probs"]), probs, atol=ATOL)
    assert all(len(p) == 3 for p in got["probs"])
    plan = json.loads((run.workdir / "results" / "plan.json").read_text())
    empty = [s["shard"] for s in plan["shards"] if s["rows"] == 0]
    assert len(empty) >= shards - rows
    for shard in empty:  # written without loading the model or taking a device
        log = (run.workdir / "logs" / "infer" / f"{shard}.log").read_text()
        assert "without loading the model" in log and "loaded" not in log and "device:" not in log


def test_summary_reports_every_shard(classify_runs):
    workdir = classify_runs(1000, 4).workdir
    summary = json.loads((workdir / "results" / "summary.json").read_text())
    assert summary["rows"] == 1000 and summary["shards"] == 4
    plan = json.loads((workdir / "results" / "plan.json").read_text())
    assert [s["rows"] for s in summary["per_shard"]] == [s["rows"] for s in plan["shards"]]
    costs = [s["cost"] for s in plan["shards"]]  # balanced by estimated tokens, not by rows
    assert sum(costs) == plan["cost"]["total"] and max(costs) - min(costs) <= 32  # one row at most
    assert all(s["bound_by"] in {"read", "tokenize", "batch", "device", "write"} for s in summary["per_shard"])
    assert all(s["device"].startswith("cpu") and s["seconds"] > 0 for s in summary["per_shard"])
    assert summary["truncated"] == sum(s["truncated"] for s in summary["per_shard"]) > 0


def test_the_terminal_shows_a_summary_after_the_run(classify_runs):
    run = classify_runs(1000, 4)
    summary = json.loads((run.workdir / "results" / "summary.json").read_text())
    lines = [line for line in run.terminal.splitlines() if line.startswith("shardinfer: ")]
    assert lines[0].startswith("shardinfer: 1,000 rows written to results/predictions.parquet, proven complete")
    assert f"{summary['run']['rows_per_s']:,.1f} rows/s" in lines[1]
    assert any(f"WARNING {summary['truncated']:,} of 1,000 texts were longer than max_length=32" in line
               for line in lines)
    assert any("WARNING no GPU was used" in line for line in lines)
    shard_log = (run.workdir / "logs" / "infer" / "0.log").read_text()
    assert re.search(r"rows (\d+)/\1 \(100%\), \d+ rows/s, ETA 0 s", shard_log)
    assert ("14 linear layers packed for oneDNN on this CPU" if onednn_linear_available()  # CPU (hf.cpu_linear)
            else "linear layers left to torch on this CPU") in shard_log


@pytest.mark.parametrize("suffix,shards", [(".jsonl", 3), (".csv", 1)])
def test_embed_sharded_equals_unbatched_reference(models, embed_runs, suffix, shards):
    """3 shards (jsonl) and 1 shard (csv) each equal the model's own output, and each other."""
    got, frame = embed_runs(suffix, shards)
    want = reference.embed(models.encoder, frame["text"].tolist(), max_length=32)
    assert got["index"].tolist() == list(range(499)) and got["id"].tolist() == frame["id"].tolist()
    gold = frame["gold"].astype(str) if suffix == ".csv" else frame["gold"]  # csv has no types: kept as text
    assert got["gold"].tolist() == gold.tolist()
    np.testing.assert_allclose(np.stack(got["embedding"]), want, atol=ATOL)


def test_embed_three_shards_equal_one(embed_runs):
    three, one = embed_runs(".jsonl", 3)[0], embed_runs(".csv", 1)[0]
    assert_same_rows(three.drop(columns="gold"), one.drop(columns="gold"), float_columns={"embedding"})
    assert three["gold"].astype(str).tolist() == one["gold"].tolist()


@pytest.fixture(scope="module")
def embed_runs(models, tmp_path_factory):
    """The same 499 rows embedded from a jsonl and a csv file, with 3 or 1 shards (3 cuts 499 unevenly)."""
    frame, runs = input_frame(499, seed=7), {}
    for suffix, shards in ((".jsonl", 3), (".csv", 1)):  # both at once
        workdir = tmp_path_factory.mktemp(f"embed-{shards}")
        path = write_input(frame, workdir / "data" / f"input{suffix}")
        runs[suffix, shards] = (workdir, workflow_config(path, models.encoder, task="embed", shards=shards))
    run_workflows_ok(list(runs.values()))
    made = {key: (read_predictions(workdir), frame) for key, (workdir, _) in runs.items()}
    return lambda suffix, shards: made[suffix, shards]


def perturbed_copy(model_dir, out):
    """Another classifier (other weights) with the very same tokenizer."""
    import torch
    from transformers import BertForSequenceClassification

    from factory import save_tokenizer

    model = BertForSequenceClassification.from_pretrained(model_dir)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(out)
    save_tokenizer(out)
    return out


def test_tokenizing_ahead_gives_the_identical_table_and_is_reused_by_another_model(classify_runs, models, tmp_path):
    """Against the shared 1-shard run (tokenizing in the job): the same table bit for bit."""
    inline, frame = classify_runs(1000, 1).predictions, classify_runs(1000, 1).frame
    path = write_input(frame, tmp_path / "data" / "input.parquet")
    config = workflow_config(path, models.classifier, shards=1, tokenize={"ahead": True})
    first = run_workflow(tmp_path, config)
    assert first.returncode == 0, first.stderr[-4000:]
    assert first.stderr.count("rule tokenize:") == 1
    assert read_predictions(tmp_path).equals(inline)  # bit for bit, not only within a tolerance
    token_files = sorted((tmp_path / "results" / "tokens").glob("*/*.parquet"))
    made = {p: p.stat().st_mtime_ns for p in token_files}
    assert len(made) == 1

    other = perturbed_copy(models.classifier, tmp_path / "other-model")
    second = run_workflow(tmp_path, {**config, "model": {**config["model"], "path": str(other)}})
    assert second.returncode == 0, second.stderr[-4000:]
    assert "rule tokenize:" not in second.stderr and second.stderr.count("rule infer:") == 1
    assert {p: p.stat().st_mtime_ns for p in token_files} == made
    label_ids, probs = reference.classify(other, frame["text"].tolist(), max_length=32)
    got = read_predictions(tmp_path)
    assert got["label_id"].tolist() == label_ids.tolist()
    np.testing.assert_allclose(np.stack(got["probs"]), probs, atol=ATOL)
    assert np.abs(probs - np.stack(inline["probs"])).max() > 1e-2  # it is another model


def test_lora_adapter_is_applied_and_matches_peft(models, tmp_path):
    frame = input_frame(60, seed=5)
    path = write_input(frame, tmp_path / "data" / "input.parquet")
    got = run_ok(tmp_path, workflow_config(path, models.classifier, shards=2, adapter=models.lora))
    texts = frame["text"].tolist()
    _, peft_probs = reference.classify(models.classifier, texts, max_length=32, adapter=models.lora)
    _, base_probs = reference.classify(models.classifier, texts, max_length=32)
    np.testing.assert_allclose(np.stack(got["probs"]), peft_probs, atol=ATOL)
    assert np.abs(np.stack(got["probs"]) - base_probs).max() > 1e-2


def assert_refused(result, workdir, *fragments):
    """Non-zero exit, each fragment on the user's terminal, and no final output."""
    shown = result.stdout + result.stderr
    assert result.returncode != 0
    for fragment in fragments:
        assert fragment in shown, shown[-4000:]
    assert not (workdir / "results" / "predictions.parquet").exists()


def test_a_classifier_head_that_an_adapter_lacks_or_nobody_trained_is_refused(models, tmp_path):
    """Two runs at once (each one shard): an adapter without the head it needs, a base without one."""
    runs = []
    for name, adapter in (("adapter", models.lora_without_head), ("base", None)):
        path = write_input(input_frame(10), tmp_path / name / "data" / "input.parquet")
        runs.append((tmp_path / name, workflow_config(path, models.encoder, shards=1, adapter=adapter)))
    without_head, untrained = run_workflows(runs)
    assert_refused(without_head, tmp_path / "adapter",
                   "classifier weights classifier.bias, classifier.weight are missing", "predictions would be random")
    assert_refused(untrained, tmp_path / "base", "it has no trained classification head")


def test_an_input_without_rows_gives_an_empty_proven_table_and_a_warning(models, tmp_path):
    """A daily job on an empty split: the run succeeds, no shard loads the model, and the table has the
    index, the keep columns and the task's columns, and no row."""
    path = write_empty_input(tmp_path / "data" / "input.parquet")
    result = run_workflow(tmp_path, workflow_config(path, models.classifier, shards=2))
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-6000:]
    table = pq.read_table(tmp_path / "results" / "predictions.parquet")
    assert table.num_rows == 0 and table.schema.names == ["index", "id", "gold", "label", "label_id", "probs"]
    assert json.loads((tmp_path / "results" / "summary.json").read_text())["rows"] == 0
    written = "0 rows written to results/predictions.parquet, proven complete and in input order (2 shards, no rows)"
    assert written in shown
    assert f"shardinfer: WARNING the input had no rows ({path})" in shown
    for shard in (0, 1):
        assert "without loading the model" in (tmp_path / "logs" / "infer" / f"{shard}.log").read_text()


def test_bad_config_is_reported_before_any_job(models, tmp_path):
    path = write_input(input_frame(3), tmp_path / "data" / "input.parquet")
    result = run_workflow(tmp_path, workflow_config(path, models.classifier, input={"keep_columns": ["label"]}))
    assert_refused(result, tmp_path, "input.keep_columns: `label` clashes with an output column")
    assert not (tmp_path / "results").exists()


def test_text_and_a_late_optional_field_are_kept_from_jsonl(models, tmp_path):
    """keep_columns [id, text, source]: the text beside its label, and a field only the last rows
    carry (absent, not null, before), typed over the whole file, across two shards."""
    frame = input_frame(120)
    sources = [f"src-{i}" if i >= 100 and i % 2 else None for i in range(120)]
    lines = [json.dumps({**row, **({"source": source} if source else {})})
             for row, source in zip(frame.to_dict(orient="records"), sources)]
    path = tmp_path / "data" / "input.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    config = workflow_config(path, models.classifier, shards=2, input={"keep_columns": ["id", "text", "source"]})
    got = run_ok(tmp_path, config)
    assert list(got.columns) == ["index", "id", "text", "source", "label", "label_id", "probs"]
    assert got["text"].tolist() == frame["text"].tolist()
    written = pq.read_table(tmp_path / "results" / "predictions.parquet", columns=["source"])
    assert written.column("source").to_pylist() == sources and got["id"].tolist() == frame["id"].tolist()
    label_ids, _ = reference.classify(models.classifier, frame["text"].tolist(), max_length=32)
    assert got["label_id"].tolist() == label_ids.tolist()


def test_bad_line_deep_in_a_large_jsonl_is_named_on_the_terminal(models, tmp_path):
    """10 MB, three of Arrow's blocks: the user reads the file's own line number, not a row within a block."""
    rows = 66_000
    lines = [f'{{"id": "row-{i}", "gold": 0, "text": "the cat sat on a mat {i} {"and ran " * (i % 24)}"}}'
             for i in range(rows)]
    lines[rows - 10] = '{"id": "bad", "text": "a trailing comma",}'
    path = tmp_path / "data" / "input.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 10_000_000
    result = run_workflow(tmp_path, workflow_config(path, models.classifier, shards=2))
    assert_refused(result, tmp_path, f"cannot read it as jsonl: line {rows - 9}: JSON parse error")
