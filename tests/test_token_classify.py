"""Task token-classify: each row's entities equal transformers' own token-classification pipeline
(`aggregation_strategy="simple"`) on that text; 3 shards equal 1 shard row for row through
`snakemake`, read back with pyarrow as a list of structs; a wrong count of labels is refused in one
line."""

import copy

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from factory import REPO, input_frame, run_workflows_ok, workflow_config, write_input
from shardinfer.core.errors import UserError
from shardinfer.engines.transformers import Transformers
from shardinfer.shard.device_loop import predict_window, prepare_batches
from shardinfer.snakefile.checks import check_settings
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.token_classify import TokenClassify, grouped_entities
from tiny_models import build_tiny_tagger

SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.yaml")


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """tiny_models' tagger: every tag occurs and entities of several tokens form."""
    return build_tiny_tagger(tmp_path_factory.mktemp("tagger"))


def tagger_config(input_path, model_path, shards=1, **overrides) -> dict:
    config = workflow_config(input_path, model_path, task="token-classify", shards=shards, **overrides)
    config["model"]["max_length"] = 64
    return config


def validated(config: dict):
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    validate(config, SCHEMA)
    return settings_from_config(config)


def short_frame(rows: int):
    """Texts of 1 to 30 words: all within max_length, as the pipeline reads them whole."""
    frame = input_frame(rows)
    frame["text"] = [" ".join(text.split()[:30]) for text in frame["text"]]
    return frame


def entities_of(settings, texts: list[str]) -> list:
    task = TokenClassify.load(LoadContext(settings, torch.device("cpu"), torch.float32))
    with torch.inference_mode():
        window = task.prepare(0, pa.table({"text": texts}))
        engine = Transformers(task)
        results = predict_window(engine, prepare_batches(engine, window, pa.table({}), task.settings.batch),
                                 torch.device("cpu"))
    (column,) = task.to_arrow(results, np.arange(len(texts)))
    return column.to_pylist()


def pipeline_entities(path, texts: list[str]) -> list:
    from transformers import pipeline

    tagging = pipeline("token-classification", model=str(path), aggregation_strategy="simple", device="cpu")
    return [[{"label": e["entity_group"], "start": e["start"], "end": e["end"], "score": float(e["score"])}
             for e in tagging(text)] for text in texts]


def same_entities(got: list, wanted: list) -> None:
    assert len(got) == len(wanted)
    for row, (ours, theirs) in enumerate(zip(got, wanted)):
        assert [(e["label"], e["start"], e["end"]) for e in ours] == \
            [(e["label"], e["start"], e["end"]) for e in theirs], row
        np.testing.assert_allclose([e["score"] for e in ours], [e["score"] for e in theirs], atol=1e-5)


def test_grouping_follows_the_pipelines_simple_rule():
    tokens = [("B-PER", 0.9, 0, 3), ("I-PER", 0.7, 4, 8), ("B-PER", 0.8, 9, 12), ("O", 0.99, 13, 15),
              ("I-LOC", 0.6, 16, 20), ("MISC", 0.5, 21, 24), ("MISC", 0.7, 25, 27)]
    assert grouped_entities(tokens) == [
        {"label": "PER", "start": 0, "end": 8, "score": pytest.approx(0.8)},
        {"label": "PER", "start": 9, "end": 12, "score": pytest.approx(0.8)},
        {"label": "LOC", "start": 16, "end": 20, "score": pytest.approx(0.6)},
        {"label": "MISC", "start": 21, "end": 27, "score": pytest.approx(0.6)},
    ]


def test_entities_equal_the_transformers_pipeline(tagger, tmp_path):
    frame = short_frame(40)
    settings = validated(tagger_config(write_input(frame, tmp_path / "in.parquet"), tagger))
    got = entities_of(settings, frame["text"].tolist())
    same_entities(got, pipeline_entities(tagger, frame["text"].tolist()))
    assert sum(len(row) for row in got) > 40 and any(e["end"] - e["start"] > 8 for row in got for e in row)


def test_a_wrong_count_of_labels_is_refused_in_one_line(tagger, tmp_path):
    path = write_input(short_frame(4), tmp_path / "in.parquet")
    config = tagger_config(path, tagger)
    config["model"]["labels"] = ["O", "PER"]
    with pytest.raises(UserError) as caught:
        check_settings(validated(config))
    assert str(caught.value).startswith("model.labels gives 2 names but the config of model.path")
    assert "\n" not in str(caught.value)


@pytest.mark.e2e
def test_three_shards_equal_one_shard_row_for_row(tagger, tmp_path):
    frame = short_frame(60)
    runs = []
    for name, shards in (("one", 1), ("three", 3)):
        workdir = tmp_path / name
        runs.append((workdir, tagger_config(write_input(frame, workdir / "data" / "in.parquet"), tagger, shards)))
    run_workflows_ok(runs)
    one, three = (pq.read_table(workdir / "results" / "predictions.parquet") for workdir, _ in runs)
    assert one.column("index").to_pylist() == three.column("index").to_pylist() == list(range(60))
    same_entities(three.column("entities").to_pylist(), one.column("entities").to_pylist())  # batches differ: 1e-5
    assert one.schema.field("entities").type == pa.list_(pa.struct(
        [("label", pa.string()), ("start", pa.int64()), ("end", pa.int64()), ("score", pa.float32())]))
    same_entities(one.column("entities").to_pylist(), pipeline_entities(tagger, frame["text"].tolist()))
