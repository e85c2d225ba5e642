"""`evaluate:`: scores against the gold labels the input kept. Unit tests against scikit-learn on
made-up tables (nulls, unknown labels, string gold, generate's exact match), the checks when the
Snakefile loads, and one real run: the shared classify run copied and rerun with `evaluate` set,
which reruns gather and the report only, and whose summary, terminal and report hold the scores."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

import patience
from factory import input_frame, prepare_workdir, run_workflow, write_input
from shardinfer.core.errors import UserError
from shardinfer.report.snakemake_report import CONFUSION_SIZE, DPI, write_report
from shardinfer.report.terminal import summary_lines
from shardinfer.scores.metrics import check_gold, normalize_answer, score_predictions
from shardinfer.snakefile.checks import check_evaluate, check_inputs
from shardinfer.snakefile.configure import settings_by_input
from shardinfer.snakefile.rule_params import InputJobs
from test_config import DEFAULTS, settings
from test_inputs import full_config
from test_report import made_up_summary, png_size, report_files, table_rows

LABELS = ["negative", "neutral", "positive"]
ROWS, SHARDS = 1000, 4  # the shared classify run (conftest.classify_runs)


@pytest.fixture
def classifier_config(tmp_path) -> dict:
    """The model settings gather passes: a folder whose config.json names three labels (all that
    shardinfer.hf.labels reads; no weights)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(LABELS)}}))
    return {"task": "classify", "path": str(folder), "adapter": None, "labels": None}


def predictions(tmp_path: Path, gold, label_ids) -> str:
    """A predictions table as gather writes it for classify, with a gold keep column."""
    path = tmp_path / "predictions.parquet"
    ids = np.array(label_ids)
    pq.write_table(pa.table({"gold": gold, "label": [LABELS[i] for i in ids], "label_id": ids}), path)
    return str(path)


def sklearn_scores(gold, predicted) -> dict:
    """What scikit-learn says, called as a user would on the scored rows."""
    p, r, f, support = precision_recall_fscore_support(gold, predicted, zero_division=0)  # "warn"'s 0, unwarned
    return {"accuracy": accuracy_score(gold, predicted), "macro_f1": f1_score(gold, predicted, average="macro"),
            "weighted_f1": f1_score(gold, predicted, average="weighted"),
            "per_class": [list(p), list(r), list(f), list(support)],
            "confusion": confusion_matrix(gold, predicted).tolist()}


def assert_scikit_learns(metrics: dict, expected: dict) -> None:
    """The summary's scores are scikit-learn's (`sklearn_scores`), to the last bits of a float."""
    per_class = metrics["per_class"]
    got = {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"], "weighted_f1": metrics["weighted_f1"],
           "per_class": [[c[key] for c in per_class] for key in ("precision", "recall", "f1", "support")],
           "confusion": metrics["confusion"]["matrix"]}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(np.asarray(got[key], dtype=float), np.asarray(value, dtype=float), rtol=1e-12,
                                   err_msg=key)


def test_classify_scores_are_scikit_learns_and_null_or_unknown_gold_is_counted(tmp_path, classifier_config):
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 3, 200).tolist()
    label_ids = [g if rng.random() < 0.6 else int(rng.integers(0, 3)) for g in gold]
    gold[3], gold[10], gold[11], gold[50] = None, 7, -1, 7  # a null, and ids the model does not know
    metrics = score_predictions(predictions(tmp_path, gold, label_ids), classifier_config, "gold")
    scored = [i for i, g in enumerate(gold) if g in (0, 1, 2)]
    expected = sklearn_scores([gold[i] for i in scored], [label_ids[i] for i in scored])
    assert_scikit_learns(metrics, expected)
    assert (metrics["rows"], metrics["scored"], metrics["null"], metrics["unknown"]) == (200, 196, 1, 3)
    assert metrics["unknown_labels"] == [{"value": 7, "rows": 2}, {"value": -1, "rows": 1}]
    assert metrics["compared_with"] == "label_id" and metrics["confusion"]["labels"] == LABELS
    lines = summary_lines({"rows": 200, "shards": 1, "metrics": metrics}, "p.parquet", "s.json")
    assert f"accuracy {expected['accuracy']:.4f}, macro F1 {expected['macro_f1']:.4f} over 196 rows" in lines[1]
    assert ("WARNING 4 of 200 gold values in `gold` were not scored: 1 null and 3 not among the model's labels "
            "(7, -1); see s.json (metrics)") in lines[2]


def test_string_gold_is_compared_with_label_names(tmp_path, classifier_config):
    gold = ["negative", "positive", "positive", "Positive", None, "neutral"]
    path = predictions(tmp_path, gold, [0, 2, 1, 2, 0, 0])
    metrics = score_predictions(path, classifier_config, "gold")
    assert metrics["compared_with"] == "label" and (metrics["null"], metrics["unknown"]) == (1, 1)
    expected = sklearn_scores(["negative", "positive", "positive", "neutral"],
                              ["negative", "positive", "neutral", "negative"])
    assert_scikit_learns(metrics, expected)


def test_an_int_column_with_nulls_read_as_float_is_ids(tmp_path, classifier_config):
    """pandas writes an int column holding NaN as float64: NaN is a null, 1.0 is id 1, 1.5 no label."""
    path = predictions(tmp_path, [0.0, 1.0, float("nan"), 1.5, 2.0], [0, 1, 1, 1, 0])
    metrics = score_predictions(path, classifier_config, "gold")
    assert (metrics["scored"], metrics["null"], metrics["unknown"]) == (3, 1, 1)
    assert metrics["accuracy"] == pytest.approx(2 / 3)


def test_no_scorable_gold_scores_nothing_and_says_so(tmp_path, classifier_config):
    path = predictions(tmp_path, pa.array([None, None], pa.int64()), [0, 1])
    metrics = score_predictions(path, classifier_config, "gold")
    assert metrics["scored"] == 0 and metrics["accuracy"] is None and metrics["null"] == 2
    lines = summary_lines({"rows": 2, "shards": 1, "metrics": metrics}, "p.parquet", "s.json")
    assert "nothing scored" in lines[1] and "WARNING 2 of 2 gold values" in lines[2]


def test_generate_exact_match_as_is_and_normalized(tmp_path):
    reference = ["Paris", "the cat.", "Two  dogs", None, "blue"]
    generated = ["Paris", "Cat", "two dogs!", "x", "red"]
    path = tmp_path / "predictions.parquet"
    pq.write_table(pa.table({"answer": reference, "generated": generated}), path)
    metrics = score_predictions(str(path), {"task": "generate"}, "answer")
    scored = [0, 1, 2, 4]
    assert metrics["exact_match"] == accuracy_score([reference[i] for i in scored], [generated[i] for i in scored])
    assert metrics["exact_match"] == 0.25 and metrics["normalized_exact_match"] == 0.75
    assert (metrics["scored"], metrics["null"], metrics["unknown"]) == (4, 1, 0)
    assert [normalize_answer(t) for t in ("The  Cat.", "an apple, a day")] == ["cat", "apple day"]
    lines = summary_lines({"rows": 5, "shards": 1, "metrics": metrics}, "p.parquet", "s.json")
    assert "exact match 0.2500 (normalized 0.7500) over 4 rows scored against `answer`" in lines[1]


def test_the_report_draws_what_was_scored(tmp_path, classifier_config):
    """Classify: the table and the confusion matrix; generate: a table of its two scores, no figure;
    a summary without scores when they are asked for is refused, naming the fix."""
    summary = made_up_summary()
    gold = [0, 1, 2, 2, None, 9]
    summary["metrics"] = score_predictions(predictions(tmp_path, gold, [0, 1, 1, 2, 0, 0]), classifier_config, "gold")
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    files = replace(report_files(tmp_path / "report"), metrics=str(tmp_path / "m.html"),
                    confusion=str(tmp_path / "c.png"))
    write_report(str(tmp_path / "summary.json"), files)
    assert "4 of 6 rows scored; not scored: 1 null, 1 unknown to the model (9)" in (tmp_path / "m.html").read_text()
    assert png_size(tmp_path / "c.png") == (int(CONFUSION_SIZE[0] * DPI), int(CONFUSION_SIZE[1] * DPI))
    summary["metrics"] = {"label_column": "answer", "compared_with": "generated", "rows": 4, "scored": 4,
                          "null": 0, "unknown": 0, "exact_match": 0.25, "normalized_exact_match": 0.5}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    write_report(str(tmp_path / "summary.json"), replace(files, confusion=None))
    assert table_rows((tmp_path / "m.html").read_text()) == [["exact match", "0.25"], ["normalized exact match", "0.5"]]
    del summary["metrics"]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(UserError, match=r"no `metrics`.*--forcerun gather"):
        write_report(str(tmp_path / "summary.json"), files)


@pytest.mark.parametrize("task,kind,message", [
    ("classify", pa.bool_(), r"`gold` holds bool; it must hold integers \(label ids\) or strings"),
    ("generate", pa.int64(), r"`gold` holds int64; it must hold strings"),
])
def test_gather_refuses_a_gold_type_it_cannot_score(task, kind, message):
    with pytest.raises(UserError, match=message):
        check_gold(pa.schema([("gold", kind)]), task, "gold")


@pytest.mark.parametrize("overrides,message", [
    ({"model": {"task": "embed"}}, r"^evaluate is for classify, generate and seq2seq; task embed has no metric"),
    ({"evaluate": {"label_column": "golden"}}, r"^evaluate.label_column `golden` must be one of input.keep_columns"),
    ({"input": {"keep_columns": ["id"]}}, r"^evaluate.label_column `gold` must be one of input.keep_columns .*"
                                          r"keep_columns: \[id, gold\]$"),
])
def test_evaluate_is_checked_when_the_snakefile_loads(tmp_path, models, overrides, message):
    config = {"evaluate": {"label_column": "gold"}, **overrides}
    with pytest.raises(UserError, match=message):
        check_evaluate(settings(tmp_path, models, **config))


def test_generate_is_scored_against_a_kept_reference_column(tmp_path, models):
    check_evaluate(settings(tmp_path, models, model={"task": "generate", "max_new_tokens": 4},
                            evaluate={"label_column": "id"}))


def test_each_named_input_is_checked_and_scored_on_its_own(tmp_path, models):
    """`evaluate` holds for every input; each gather gets it (its own table, its own summary), and an
    input that does not keep the gold column is named."""
    for name in ("val", "test"):
        write_input(input_frame(3), tmp_path / f"{name}.parquet")
    config = full_config({"val": {"path": str(tmp_path / "val.parquet"), "keep_columns": ["id", "gold"]},
                          "test": {"path": str(tmp_path / "test.parquet"), "keep_columns": ["id"]}},
                         model={**DEFAULTS["model"], "path": str(models.classifier), "max_length": 32},
                         evaluate={"label_column": "gold"})
    by_name = settings_by_input(config, auto_shards=1)
    assert [InputJobs.of(s).evaluate for s in by_name.values()] == [{"label_column": "gold"}] * 2
    with pytest.raises(UserError, match=r"^inputs.test: evaluate.label_column `gold` must be one of input.keep_col"):
        check_inputs(by_name)


def test_evaluate_reaches_gather_alone(tmp_path, models):
    """Neither the shard digest nor a shard job's params hold `evaluate`: changing it reruns no shard."""
    off, on = (InputJobs.of(settings(tmp_path, models, evaluate={"label_column": column})) for column in (None, "gold"))
    check_evaluate(on.settings)
    assert (on.digest, on.job_settings) == (off.digest, off.job_settings) and "evaluate" not in on.job_settings
    assert (off.evaluate, on.evaluate) == ({"label_column": None}, {"label_column": "gold"})


@pytest.fixture(scope="module")
def evaluated(classify_runs, tmp_path_factory):
    """A copy of the shared classify run, rerun with `evaluate: {label_column: gold}`, then its report."""
    finished = classify_runs(ROWS, SHARDS)
    workdir = tmp_path_factory.mktemp("evaluated")
    shutil.copytree(finished.workdir, workdir, dirs_exist_ok=True, symlinks=True)
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    config["evaluate"] = {"label_column": "gold"}
    kept = {p.name: p.stat().st_mtime_ns for p in (workdir / "results").glob("**/*") if p.is_file()}
    result = run_workflow(workdir, config, report=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    command, env = prepare_workdir(workdir, config, report=True)
    report = patience.run([*command, "--report", "report.zip"], [workdir], cwd=workdir, env=env)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-6000:]
    return workdir, result.stdout + result.stderr, kept


@pytest.mark.e2e
def test_setting_evaluate_reruns_gather_and_the_report_only(evaluated):
    workdir, terminal, kept = evaluated
    stats = terminal.split("Job stats:")[1].split("\n\n")[0]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", stats, flags=re.M))
    assert set(jobs) == {"gather", "report_items", "all", "total"}, stats
    for name in ("plan.json", *(f"{i}.parquet" for i in range(SHARDS))):
        assert next((workdir / "results").glob(f"**/{name}")).stat().st_mtime_ns == kept[name], name


@pytest.mark.e2e
def test_summary_holds_scikit_learns_scores_and_the_terminal_its_headline(evaluated):
    workdir, terminal, _ = evaluated
    metrics = json.loads((workdir / "results" / "summary.json").read_text())["metrics"]
    table = pd.read_parquet(workdir / "results" / "predictions.parquet", columns=["gold", "label_id"])
    expected = sklearn_scores(table["gold"], table["label_id"])
    assert_scikit_learns(metrics, expected)
    assert (metrics["rows"], metrics["scored"], metrics["null"], metrics["unknown"]) == (ROWS, ROWS, 0, 0)
    assert (f"shardinfer: accuracy {expected['accuracy']:.4f}, macro F1 {expected['macro_f1']:.4f} over 1,000 rows "
            "scored against `gold` (label_id)") in terminal
    assert "not scored" not in terminal


@pytest.mark.e2e
def test_the_report_holds_the_scores_table_and_the_confusion_matrix(evaluated):
    workdir, _, _ = evaluated
    metrics = json.loads((workdir / "results" / "summary.json").read_text())["metrics"]
    with zipfile.ZipFile(workdir / "report.zip") as report:
        items = {Path(name).name: name for name in report.namelist() if name.startswith("report/data/raw/")}
        assert {"metrics.html", "confusion.png"} <= set(items)
        page, figure = report.read(items["metrics.html"]).decode(), report.read(items["confusion.png"])
    rows = {row[0]: row[1:] for row in table_rows(page)}
    assert list(rows) == [*LABELS, "accuracy", "macro avg", "weighted avg"]
    assert rows["accuracy"][2:] == [f"{metrics['accuracy']:.4g}", "1,000"]
    assert rows["macro avg"][2] == f"{metrics['macro_f1']:.4g}"
    assert [row[3] for label, row in rows.items() if label in LABELS] == [
        f"{c['support']:,}" for c in metrics["per_class"]]
    assert png_size(figure) == (int(CONFUSION_SIZE[0] * DPI), int(CONFUSION_SIZE[1] * DPI))
