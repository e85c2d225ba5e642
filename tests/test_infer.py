"""The shard runner's parts: background stages with bounded queues, out-of-memory splitting, and
token ids made ahead by the tokenize rule giving exactly the output of tokenizing in the job."""

import dataclasses
import json
import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import reference
from factory import input_frame, input_settings, write_input
from shardinfer.contract.shard_file import STATS_KEY
from shardinfer.core.errors import UserError
from shardinfer.engines.transformers import Transformers
from shardinfer.plan.plan_file import read_plan, run_plan
from shardinfer.settings.config import BatchSettings, ModelSettings, Settings
from shardinfer.shard.device_loop import predict_window, prepare_batches
from shardinfer.shard.job import run_shard
from shardinfer.shard.pipeline import Pipeline
from shardinfer.shard.runtime import ShardJob
from shardinfer.shard.tokenize_job import TokenizeJob, run_tokenize
from shardinfer.tasks.base import LoadContext, Task, Window
from shardinfer.tasks.text import TextTask


def test_stages_hand_on_every_item_in_order():
    with Pipeline(depth=2) as pipeline:
        squares = pipeline.map("square", lambda x: x * x, pipeline.source("count", range(100)))
        got = list(pipeline.drain("main", squares))
    assert got == [x * x for x in range(100)]


def test_a_source_runs_at_most_a_few_items_ahead_of_a_slow_consumer():
    """Bounded queues: memory stays flat however long the shard is."""
    produced, ahead = [], []

    def items():
        for i in range(50):
            produced.append(i)
            yield i

    with Pipeline(depth=2) as pipeline:
        doubled = pipeline.map("double", lambda x: 2 * x, pipeline.source("read", items()))
        for consumed, _ in enumerate(pipeline.drain("main", doubled)):
            time.sleep(0.005)
            ahead.append(len(produced) - consumed)
    assert max(ahead) <= 2 * 2 + 3  # two queues of two, plus one item in each worker's hands


def test_a_failing_worker_fails_the_main_thread_with_its_error():
    def explode(x):
        if x == 7:
            raise UserError("row 7 is bad")
        return x

    with pytest.raises(UserError, match="row 7 is bad"):
        with Pipeline() as pipeline:
            for _ in pipeline.drain("main", pipeline.map("check", explode, pipeline.source("read", range(1000)))):
                pass


def test_a_failing_sink_stops_the_main_thread_and_no_thread_is_left():
    def write(item):
        raise OSError("No space left on device")

    before = threading.active_count()
    with pytest.raises(OSError, match="No space left"):
        with Pipeline() as pipeline:
            out = pipeline.sink("write", write)
            for item in pipeline.drain("main", pipeline.source("read", range(1000))):
                pipeline.put(out, item)
            pipeline.finish(out)
    assert threading.active_count() == before


def test_a_failure_in_the_main_thread_stops_the_workers():
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="device lost"):
        with Pipeline() as pipeline:
            for item in pipeline.drain("device", pipeline.source("read", iter(range(10**9)))):
                if item == 3:
                    raise RuntimeError("device lost")
    assert threading.active_count() == before


def test_the_report_names_the_slowest_stage():
    with Pipeline() as pipeline:
        slow = pipeline.map("tokenize", lambda x: time.sleep(0.02) or x, pipeline.source("read", range(10)))
        for _ in pipeline.drain("device", slow):
            time.sleep(0.001)
    assert pipeline.bottleneck().name == "tokenize"
    assert pipeline.report().endswith("bound by tokenize")
    device = next(s for s in pipeline.stages if s.name == "device")
    assert device.waited_s > 0.1  # the device waited on tokenizing


def test_a_slow_writer_is_named_not_the_device_that_waits_for_it():
    with Pipeline(depth=1) as pipeline:
        out = pipeline.sink("write", lambda item: time.sleep(0.02))
        for item in pipeline.drain("device", pipeline.source("read", range(20))):
            pipeline.put(out, item)
        pipeline.finish(out)
    assert pipeline.bottleneck().name == "write"
    assert next(s for s in pipeline.stages if s.name == "device").busy_s < 0.1


def test_out_of_memory_splits_the_batch_down_to_one_row():
    class Fake(Task):
        calls = []

        def collate(self, window, positions):
            return torch.from_numpy(window.costs[positions])

        def predict(self, batch):
            self.calls.append(len(batch))
            if len(batch) > 2 or bool((batch == 7).any()):
                raise torch.OutOfMemoryError("simulated")
            return {"n": batch}

    def run(lengths):
        engine = Transformers(Fake())
        window = Window(100, np.array(lengths), None)
        prepared = prepare_batches(engine, window, pa.table({}), BatchSettings(1000, 8, 64))
        return predict_window(engine, prepared, torch.device("cpu"))

    assert run([1, 2, 3, 4, 5, 6])["n"].tolist() == [1, 2, 3, 4, 5, 6]
    assert max(Fake.calls) == 6 and 1 in Fake.calls
    with pytest.raises(UserError, match=r"row 102 \(7 tokens\) does not fit in device memory even alone"):
        run([1, 1, 7])


def test_results_of_any_shape_come_back_in_row_order():
    """Ragged arrays and strings per row (generation, a user's model), not only fixed-width tensors."""
    class Ragged(Task):
        def collate(self, window, positions):
            return positions

        def predict(self, positions):
            return {"ids": [np.arange(p) for p in positions], "text": [f"row {p}" for p in positions],
                    "width": torch.full((len(positions), 2), float(len(positions)))}

    lengths = np.array([5, 1, 4, 2, 3, 9, 1])
    engine = Transformers(Ragged())
    prepared = prepare_batches(engine, Window(0, lengths, None), pa.table({}), BatchSettings(8, 3, 64))
    got = predict_window(engine, prepared, torch.device("cpu"))
    assert [len(ids) for ids in got["ids"]] == list(range(7))
    assert got["text"] == [f"row {p}" for p in range(7)]
    assert got["width"].shape == (7, 2)


def test_text_batches_pad_to_their_longest_row_and_empty_rows_to_one_token(shard_inputs):
    tokenizer = SimpleNamespace(padding_side="right", model_input_names=["input_ids", "attention_mask"],
                                num_special_tokens_to_add=lambda: 0)
    _, settings = shard_inputs
    context = LoadContext(settings, torch.device("cpu"), torch.float32)
    task = TextTask(SimpleNamespace(model=None), tokenizer, 0, context)
    ids = [[5, 6, 7], [], [8, 9], [4]]
    window = Window(0, np.array([max(len(i), 1) for i in ids]), ids)
    prepared = prepare_batches(Transformers(task), window, pa.table({}), BatchSettings(1000, 2, 64))
    for positions, inputs in prepared.batches:
        assert inputs["input_ids"].shape == (len(positions), max(max(len(ids[p]), 1) for p in positions))
        assert inputs["attention_mask"].sum(1).tolist() == [max(len(ids[p]), 1) for p in positions]
    assert sorted(np.concatenate([positions for positions, _ in prepared.batches]).tolist()) == [0, 1, 2, 3]


ROWS = 300


@pytest.fixture(scope="module")
def shard_inputs(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("infer")
    frame = input_frame(ROWS, seed=3)
    frame.loc[160, "text"] = ""
    frame.loc[200, "text"] = "long " * 200  # cut at max_length
    inp = input_settings(write_input(frame, root / "in.parquet"), keep_columns=("id",))
    model = ModelSettings(path=str(models.classifier), adapter=None, task="classify", max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(512, 32, 64), shards=2)
    run_plan(inp, 2, 32, str(root / "plan.json"))
    return root, settings


def shard_job(root, settings, name, **extra):
    return ShardJob(settings, str(root / "plan.json"), 1, str(root / name), "digest", **extra)


def test_token_ids_made_ahead_give_exactly_the_same_shard(shard_inputs, caplog):
    root, settings = shard_inputs
    caplog.set_level(logging.INFO)
    inline = run_shard(shard_job(root, settings, "inline.parquet"))
    assert 200 in inline["first_truncated_rows"] or inline["truncated"] > 5
    assert inline["bound_by"] in {"read", "tokenize", "batch", "device", "write"}
    assert any("stages: read" in r.getMessage() and "bound by" in r.getMessage() for r in caplog.records)
    tokens = root / "tokens" / "1.parquet"
    assert run_tokenize(TokenizeJob(settings, str(root / "plan.json"), 1, str(tokens), "key-a")) > 0
    ahead = run_shard(shard_job(root, settings, "ahead.parquet", tokens=str(tokens), tokenizer_key="key-a"))
    assert pq.read_table(root / "ahead.parquet").equals(pq.read_table(root / "inline.parquet"))
    for key in ("rows", "real_tokens", "padded_tokens", "truncated", "first_truncated_rows"):
        assert ahead[key] == inline[key]
    stats = json.loads(pq.ParquetFile(root / "ahead.parquet").metadata.metadata[STATS_KEY])
    assert stats["bound_by"] in {"read", "read tokens", "batch", "device", "write"}


def test_token_ids_of_another_tokenizer_or_plan_are_refused(shard_inputs):
    root, settings = shard_inputs
    tokens = root / "tokens-b" / "1.parquet"
    run_tokenize(TokenizeJob(settings, str(root / "plan.json"), 1, str(tokens), "key-b"))
    with pytest.raises(UserError, match=r"token file `.*1.parquet` was made for .*key-b.*not .*key-c.*delete it"):
        run_shard(shard_job(root, settings, "wrong.parquet", tokens=str(tokens), tokenizer_key="key-c"))
    assert not (root / "wrong.parquet").exists()
    wider = dataclasses.replace(settings, batch=BatchSettings(512, 32, 7))  # other windows: still lines up
    run_shard(ShardJob(wider, str(root / "plan.json"), 1, str(root / "w7.parquet"), "digest", tokens=str(tokens),
                       tokenizer_key="key-b"))
    start, end = read_plan(str(root / "plan.json")).ranges[1]
    assert pq.read_table(root / "w7.parquet").column("index").to_pylist() == list(range(start, end))


def test_a_shard_without_keep_columns_holds_index_and_outputs_only(shard_inputs):
    """No keep column at all (the text alone in, predictions out): every row still written."""
    root, settings = shard_inputs
    bare = dataclasses.replace(settings, input=dataclasses.replace(settings.input, keep_columns=()))
    stats = run_shard(shard_job(root, bare, "bare.parquet"))
    table = pq.read_table(root / "bare.parquet")
    start, end = read_plan(str(root / "plan.json")).ranges[1]
    assert table.column_names == ["index", "label", "label_id", "probs"]
    assert table.column("index").to_pylist() == list(range(start, end)) and stats["rows"] == end - start


def test_embed_normalised_and_an_empty_shard(models, tmp_path, caplog):
    """A normalised embedding is the model's own, unit length; a shard without rows is written
    without loading the model (1 row in 2 shards)."""
    frame = input_frame(1, seed=1)
    inp = input_settings(write_input(frame, tmp_path / "in.parquet"), keep_columns=("id",))
    model = ModelSettings(path=str(models.encoder), adapter=None, task="embed", max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(512, 32, 64), shards=2,
                        task_settings={"pooling": "mean", "normalize": True})
    run_plan(inp, 2, 32, str(tmp_path / "plan.json"))
    caplog.set_level(logging.INFO)
    for shard in (0, 1):
        run_shard(ShardJob(settings, str(tmp_path / "plan.json"), shard, str(tmp_path / f"{shard}.parquet"), "d"))
    messages = [record.getMessage() for record in caplog.records]
    assert sum("without loading the model" in m for m in messages) == 1 and sum("loaded " in m for m in messages) == 1
    got, empty = pq.read_table(tmp_path / "0.parquet"), pq.read_table(tmp_path / "1.parquet")
    want = reference.embed(models.encoder, frame["text"].tolist(), max_length=32, normalize=True)
    assert got.column("index").to_pylist() == [0] and empty.num_rows == 0 and empty.schema.equals(got.schema)
    np.testing.assert_allclose(np.stack(got.column("embedding").to_pylist()), want, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(want, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_the_text_column_also_kept_is_read_once_per_role_in_every_format(models, tmp_path, suffix):
    """The docs suggest keeping the text beside its prediction: a column read by the task and
    kept too is one column of the shard table, in every format."""
    frame = input_frame(40, seed=4)
    inp = input_settings(write_input(frame, tmp_path / f"in{suffix}"), keep_columns=("text", "id"))
    model = ModelSettings(path=str(models.classifier), adapter=None, task="classify", max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(512, 32, 64), shards=2)
    run_plan(inp, 2, 32, str(tmp_path / "plan.json"))
    run_shard(ShardJob(settings, str(tmp_path / "plan.json"), 1, str(tmp_path / "1.parquet"), "digest"))
    table = pq.read_table(tmp_path / "1.parquet")
    assert table.column_names[:3] == ["index", "text", "id"] and table.column_names.count("text") == 1
    start = table.column("index")[0].as_py()
    assert table.column("text").to_pylist() == frame["text"].tolist()[start:]
    assert [str(v) for v in table.column("id").to_pylist()] == [str(v) for v in frame["id"].tolist()[start:]]
