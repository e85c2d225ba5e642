"""Task score: a cross-encoder's score of each text pair equals the model called on the pair
directly (token types included, pairs cut longest first), raw or through a sigmoid; bad settings
are refused in one line; 2 shards equal 1 shard tokenized ahead, row for row, through `snakemake`."""

import copy

import numpy as np
import pyarrow as pa
import pytest
import torch

from factory import (
    REPO,
    input_frame,
    one_line_refusal,
    read_predictions,
    run_workflows_ok,
    texts,
    workflow_config,
    write_input,
)
from shardinfer.engines.transformers import Transformers
from shardinfer.plan.plan_file import make_plan
from shardinfer.shard.device_loop import predict_window, prepare_batches
from shardinfer.snakefile.checks import check_settings
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.score import Score
from tiny_models import build_tiny_cross_encoder

SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
MAX_LENGTH = 32


@pytest.fixture(scope="module")
def cross(tmp_path_factory):
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("cross"))


def pairs_frame(rows: int):
    """Queries and passages of 1 to 80 words: many pairs longer than MAX_LENGTH together."""
    frame = input_frame(rows)
    frame["passage"] = texts(rows, seed=7)
    return frame


def score_config(input_path, model_path, shards=1, score=None, **overrides) -> dict:
    score = {"pair_column": "passage"} if score is None else score
    config = workflow_config(input_path, model_path, task="score", shards=shards, score=score, **overrides)
    config["model"]["max_length"] = MAX_LENGTH
    return config


def validated(config: dict):
    """Settings as the Snakefile makes them: the schema's defaults filled in by `validate`."""
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    validate(config, SCHEMA)
    return settings_from_config(config)


def scored(task: Score, frame) -> tuple[np.ndarray, list[int]]:
    """The rows through the task as a shard job runs them: one window, length-sorted batches."""
    table = pa.table({"text": frame["text"].tolist(), "passage": frame["passage"].tolist()})
    with torch.inference_mode():
        window = task.prepare(0, table)
        engine = Transformers(task)
        results = predict_window(engine, prepare_batches(engine, window, pa.table({}), task.settings.batch),
                                 torch.device("cpu"))
    (column,) = task.to_arrow(results, np.arange(len(frame)))
    assert column.type == pa.float32()
    return column.to_numpy(), window.truncated


def direct(path, frame, zero_types: bool = False) -> np.ndarray:
    """transformers on each pair alone, with the tokenizer's own pair encoding, float32 on CPU."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for text, pair in zip(frame["text"], frame["passage"]):
            inputs = tokenizer(text, pair, truncation="longest_first", max_length=MAX_LENGTH, return_tensors="pt")
            if zero_types:
                inputs["token_type_ids"] = torch.zeros_like(inputs["token_type_ids"])
            out.append(model(**inputs).logits[0, 0].item())
    return np.asarray(out, dtype=np.float32)


def load(settings) -> Score:
    return Score.load(LoadContext(settings, torch.device("cpu"), torch.float32))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(the input's path, its frame): 24 pairs."""
    frame = pairs_frame(24)
    return write_input(frame, tmp_path_factory.mktemp("pairs") / "pairs.parquet"), frame


def test_scores_are_the_models_own_on_each_pair_with_its_token_types(cross, pairs):
    path, frame = pairs
    got, truncated = scored(load(validated(score_config(path, cross))), frame)
    assert len(truncated) > 3  # pairs cut longest first to max_length, counted
    np.testing.assert_allclose(got, direct(cross, frame), atol=1e-5)
    assert np.abs(got - direct(cross, frame, zero_types=True)).max() > 1e-2  # token types matter: all 0 would fail


def test_sigmoid_gives_the_logits_sigmoid(cross, pairs):
    path, frame = pairs
    config = score_config(path, cross, score={"pair_column": "passage", "sigmoid": True})
    got, _ = scored(load(validated(config)), frame)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-direct(cross, frame).astype(np.float64))), atol=1e-6)


def test_bad_settings_are_refused_in_one_line(cross, pairs, tmp_path):
    path, frame = pairs
    message = one_line_refusal(lambda: check_settings(validated(score_config(path, cross, score={}))))
    assert message.startswith("score.pair_column is required for task score")
    elsewhere = write_input(frame.drop(columns="passage"), tmp_path / "no-pair.parquet")
    settings = validated(score_config(elsewhere, cross))
    check_settings(settings)  # the model is fine; the column is missing from the data
    assert one_line_refusal(lambda: make_plan(settings.input, 1, MAX_LENGTH)).startswith(
        f"score.pair_column: column `passage` is not in `{elsewhere}`")
    two = build_tiny_cross_encoder(tmp_path, num_labels=2)
    wanted = f"model.path `{two}`: its classifier has 2 labels; task score needs a cross-encoder with exactly one"
    assert one_line_refusal(lambda: check_settings(validated(score_config(path, two)))).startswith(wanted)
    assert one_line_refusal(lambda: load(validated(score_config(path, two)))).startswith(wanted)  # and again at load


@pytest.mark.e2e
def test_two_shards_equal_one_shard_tokenized_ahead_row_for_row(cross, tmp_path):
    """Two runs at once: 1 shard whose token ids (and types) the tokenize rule made, 2 tokenizing in the job."""
    frame = pairs_frame(40)
    runs = []
    for name, shards, ahead in (("one", 1, True), ("two", 2, False)):
        workdir = tmp_path / name
        path = write_input(frame, workdir / "data" / "pairs.parquet")
        runs.append((workdir, score_config(path, cross, shards=shards, tokenize={"ahead": ahead})))
    run_workflows_ok(runs)
    one, two = (read_predictions(workdir) for workdir, _ in runs)
    assert one["index"].tolist() == two["index"].tolist() == list(range(40))
    assert one["id"].tolist() == two["id"].tolist() == frame["id"].tolist()
    np.testing.assert_allclose(two["score"], one["score"], atol=1e-5)
    np.testing.assert_allclose(one["score"], direct(cross, frame), atol=1e-5)
    assert any((runs[0][0] / "results" / "tokens").rglob("*.parquet"))  # the shard read token files made ahead
