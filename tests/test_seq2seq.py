"""Task seq2seq: each row's text through a tiny T5's `model.generate`, greedy or by beam search,
gives what the model gives on that row alone (the text, its token count up to eos, how it ended);
a row costs its input plus what its beams may generate; bad settings are refused in one line
before any job runs; and through `snakemake`, 3 shards equal 1 shard tokenized ahead, row for row,
in the input's order."""

import copy
import json

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
    workflow_config,
    write_input,
)
from shardinfer.engines.transformers import Transformers
from shardinfer.shard.device_loop import predict_window, prepare_batches
from shardinfer.snakefile.checks import check_settings, schema_errors
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.seq2seq import Seq2Seq

SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")
MAX_LENGTH, NEW, ROWS = 16, 6, 24
COLUMNS = ["generated", "n_generated_tokens", "finish_reason"]


def seq2seq_config(input_path, model_path, shards=1, **overrides) -> dict:
    config = workflow_config(input_path, model_path, task="seq2seq", shards=shards, **overrides)
    config["model"].update({"max_length": MAX_LENGTH, "max_new_tokens": NEW, **overrides.get("model", {})})
    return config


def validated(config: dict):
    """Settings as the Snakefile makes them: the schema's defaults filled in by `validate`."""
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    validate(config, SCHEMA)
    return settings_from_config(config)


def direct(path, texts: list[str], num_beams: int = 1) -> list[tuple[str, int, str]]:
    """transformers on each text alone: (generated, n_generated_tokens, finish_reason) per row, the
    decoder start token dropped and the tokens cut after the first eos."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = []
    with torch.inference_mode():
        for text in texts:
            inputs = tokenizer(text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            new = model.generate(**inputs, max_new_tokens=NEW, num_beams=num_beams, do_sample=False)[0, 1:].tolist()
            ended = tokenizer.eos_token_id in new
            new = new[: new.index(tokenizer.eos_token_id) + 1] if ended else new
            rows.append((tokenizer.decode(new, skip_special_tokens=True), len(new), "eos" if ended else "length"))
    return rows


def through_task(settings, texts: list[str]) -> tuple[list[tuple], Seq2Seq, np.ndarray]:
    """The rows as a shard job runs them (one window, length-sorted batches of up to 16 rows): per
    row its columns' values, the loaded task, and the window's costs."""
    task = Seq2Seq.load(LoadContext(settings, torch.device("cpu"), torch.float32))
    with torch.inference_mode():
        window = task.prepare(0, pa.table({"text": texts}))
        engine = Transformers(task)
        results = predict_window(engine, prepare_batches(engine, window, pa.table({}), settings.batch),
                                 torch.device("cpu"))
    columns = task.to_arrow(results, np.arange(len(texts)))
    assert [column.type for column in columns] == [pa.string(), pa.int32(), pa.string()]
    return list(zip(*(column.to_pylist() for column in columns))), task, window


@pytest.fixture(scope="module")
def frame():
    return input_frame(ROWS, seed=3)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_each_row_is_what_model_generate_gives_it_alone(seq2seq_lm, frame, tmp_path, num_beams):
    path = write_input(frame, tmp_path / "in.parquet")
    settings = validated(seq2seq_config(path, seq2seq_lm, seq2seq={"num_beams": num_beams}))
    texts = frame["text"].tolist()
    got, task, window = through_task(settings, texts)
    assert got == direct(seq2seq_lm, texts, num_beams)
    assert {finish for _, _, finish in got} == {"eos", "length"}  # the tiny model ends some rows, not all
    assert any(text and finish == "eos" for text, _, finish in got)  # some after words, counted with their eos
    assert all(n <= NEW for _, n, _ in got) and task.finish()["generated_tokens"] == sum(n for _, n, _ in got)
    assert len(window.truncated) > 3  # texts cut to max_length, counted
    np.testing.assert_array_equal(window.costs, window.real + NEW * num_beams)  # the decoder's tokens, per beam
    assert Seq2Seq.cost.overhead(settings) == NEW * num_beams  # and the plan's balance counts them too


def test_bad_settings_are_refused_in_one_line(seq2seq_lm, models, tmp_path):
    path = write_input(input_frame(4), tmp_path / "in.parquet")
    check_settings(validated(seq2seq_config(path, seq2seq_lm, tokenize={"ahead": True})))  # fine, tokenized ahead too
    missing = seq2seq_config(path, seq2seq_lm, model={"max_new_tokens": None})
    assert one_line_refusal(lambda: check_settings(validated(missing))) == (
        "model.max_new_tokens must be an integer >= 1 for task seq2seq (tokens to generate at most per row); got None")
    for beams, why in ((0, "0 is less than the minimum of 1"), ("2", "'2' is not of type 'integer'")):
        config = seq2seq_config(path, seq2seq_lm, seq2seq={"num_beams": beams})
        said = one_line_refusal(lambda config=config: schema_errors(config, SCHEMA))
        assert said == f"config `seq2seq.num_beams`: {why}"
    encoder = seq2seq_config(path, models.classifier)
    assert one_line_refusal(lambda: check_settings(validated(encoder))) == (
        f"model.path `{models.classifier}`: it holds BertForSequenceClassification, not an encoder-decoder model "
        "(its config.json has no is_encoder_decoder: true); task seq2seq needs one (T5, BART, Marian, NLLB)")


@pytest.mark.e2e
def test_three_shards_equal_one_shard_tokenized_ahead_and_the_model_row_for_row(seq2seq_lm, frame, tmp_path):
    """Two runs at once: 1 shard whose token ids the tokenize rule made, 3 tokenizing in their jobs."""
    runs = []
    for name, shards, ahead in (("one", 1, True), ("three", 3, False)):
        workdir = tmp_path / name
        path = write_input(frame, workdir / "data" / "texts.parquet")
        runs.append((workdir, seq2seq_config(path, seq2seq_lm, shards=shards, tokenize={"ahead": ahead})))
    run_workflows_ok(runs)
    one, three = (read_predictions(workdir) for workdir, _ in runs)
    assert one["index"].tolist() == three["index"].tolist() == list(range(ROWS))
    assert one["id"].tolist() == three["id"].tolist() == frame["id"].tolist()
    assert one[COLUMNS].equals(three[COLUMNS])
    assert list(one[COLUMNS].itertuples(index=False, name=None)) == direct(seq2seq_lm, frame["text"].tolist())
    assert any((runs[0][0] / "results" / "tokens").rglob("*.parquet"))  # the shard read token files made ahead
    summary = json.loads((runs[1][0] / "results" / "summary.json").read_text())
    assert summary["run"]["generated_tokens"] == int(three["n_generated_tokens"].sum())  # reported as generate's
