"""Every registered output writer (`shardinfer.output`), as it is, holds to the contract: gathered
from real shard files in both layouts, its files give back the Parquet table's rows, in index order
(each writer on the runs whose input it can write: a custom task's table of lists, bytes, NaN and a
failed row; an OpenAI batch file's generations over the tiny byte-level Llama, one line failing);
a shard whose values are not those its job wrote leaves none of its files; switching a writer off
removes its files; the gather rule's outputs and params follow from the chosen writers, today's
configs' unchanged. Then the JSON Lines writer's own values, and the refusals, each in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import made_once
from factory import write_input
from shardinfer.core.errors import ProofError, UserError
from shardinfer.output import all_writers, chosen_writers, writer_files, writer_named
from shardinfer.output.jsonl import lines, plain
from shardinfer.output.write import fan_out
from shardinfer.plan.plan_file import run_plan
from shardinfer.proof.gather import GatherJob, run_gather
from shardinfer.settings.config import OutputSettings, Settings
from shardinfer.shard.job import run_shard
from shardinfer.shard.runtime import ShardJob
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.snakefile.settings_digest import output_digest
from tiny_models import build_tiny_bytes_lm

ROWS, SHARDS = 23, 3
HOOK = '''
import math

class Predictor:
    outputs = {"vec": "list<float32>", "blob": "binary", "score": "float64", "pair": "struct<a: int64, b: string>"}

    def predict(self, table, index):
        if 7 in set(int(i) for i in index):
            raise ValueError("row 7 fails, as a row may")
        return {"vec": [[float(i), 0.5] for i in index], "blob": [bytes([int(i), 255]) for i in index],
                "score": [math.nan if i == 4 else i / 3 for i in index],
                "pair": [{"a": int(i), "b": "ü" * int(i % 3)} for i in index]}

def build(model_path, options, device):
    return Predictor()
'''


def settings_of(config: dict) -> Settings:
    from snakemake.utils import validate

    from shardinfer.settings.schema import SCHEMA_PATH

    config = json.loads(json.dumps(config))
    validate(config, str(SCHEMA_PATH))
    return settings_from_config(config)


def shard_files(root: Path, settings: Settings) -> dict:
    """The plan and its real shard files under `root`, as gather's inputs."""
    run_plan(settings.input, settings.shards, settings.model.max_length, str(root / "plan.json"))
    digest = output_digest(settings)
    paths = [str(root / "shards" / f"{k}.parquet") for k in range(settings.shards)]
    folders = [str(root / "files" / str(k)) for k in range(settings.shards)]
    for k, path in enumerate(paths):
        run_shard(ShardJob(settings, str(root / "plan.json"), k, path, digest, files=folders[k]))
    return {"root": root, "settings": settings, "digest": digest, "paths": paths, "folders": folders}


def custom_run(root: Path) -> None:
    import pandas as pd

    write_input(pd.DataFrame({"id": [f"r{i}" for i in range(ROWS)], "x": range(ROWS)}), root / "in.parquet")
    (root / "hook.py").write_text(HOOK)
    shard_files(root, settings_of(custom_config(root)))


def custom_config(root: Path) -> dict:
    return {"input": {"path": str(root / "in.parquet"), "columns": ["x"], "keep_columns": ["id"]},
            "model": {"task": "custom", "entrypoint": f"{root}/hook.py:build", "path": None},
            "batch": {"max_rows": 4, "sort_window": 8}, "shards": SHARDS, "row_errors": {"mode": "record", "max": 1}}


def batch_config(root: Path, lm: Path) -> dict:
    return {"input": {"path": str(root / "batch.jsonl"), "format": "openai_batch"},
            "model": {"path": str(lm), "task": "generate", "max_length": 48, "max_new_tokens": 3,
                      "dtype": "float32"},
            "batch": {"max_tokens": 4096, "max_rows": 4, "sort_window": 8}, "shards": 2,
            "row_errors": {"mode": "record", "max": 1}}


def batch_run(root: Path, lm: Path) -> None:
    """Five requests, the fourth with a role the chat template refuses (its row fails)."""
    messages = [[{"role": "tool" if k == 3 else "user", "content": f"line {k} of five"}] for k in range(5)]
    (root / "batch.jsonl").write_text("".join(json.dumps({
        "custom_id": f"q-{k}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": messages[k], "max_tokens": 3, "temperature": 0}}) + "\n" for k in range(5)))
    shard_files(root, settings_of(batch_config(root, lm)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Each run's shard files, made once: the custom table, and the batch file's generations."""
    lm = made_once(tmp_path_factory, "bytes-lm", build_tiny_bytes_lm) / "tiny-bytes-lm"
    custom = made_once(tmp_path_factory, "writers-custom", custom_run)
    batch = made_once(tmp_path_factory, "writers-batch", lambda root: batch_run(root, lm))
    return {"custom": {"root": custom, "settings": settings_of(custom_config(custom))},
            "batch": {"root": batch, "settings": settings_of(batch_config(batch, lm))}}


def job_of(run: dict, out: Path, writers: tuple[str, ...], layout: str, **changes) -> GatherJob:
    """Gather's job for a run's shard files, its writers' files under `out`, as the rule gives them."""
    root, settings = run["root"], run["settings"]
    output = OutputSettings(layout=layout, part_size=200, writers=writers)
    outputs = {**writer_files(chosen_writers(output, settings.input), output.parts, str(out)),
               "summary": str(out / "summary.json")}
    fields = {"shard_paths": tuple(str(root / "shards" / f"{k}.parquet") for k in range(settings.shards)),
              "files_folders": tuple(str(root / "files" / str(k)) for k in range(settings.shards)), **changes}
    return GatherJob(str(root / "plan.json"), inp=settings.input, model=settings.to_dict()["model"],
                     digest=output_digest(settings), outputs=outputs, output=output, **fields)


def fits(name: str, run: str) -> bool:
    return all_writers()[name].formats is None or run == "batch"


CASES = [(name, layout, run) for name in all_writers() for layout in ("file", "parts") for run in ("custom", "batch")
         if fits(name, run)]


def same(value, expected) -> bool:
    """Equal as JSON gives them back (bytes as base64, NaN as null, tuples as lists)."""
    return json.loads(json.dumps(plain(value))) == json.loads(json.dumps(plain(expected)))


@pytest.mark.parametrize("name, layout, run", CASES, ids=["-".join(case) for case in CASES])
def test_a_writer_gives_back_the_parquet_tables_rows_in_index_order(runs, tmp_path, name, layout, run):
    writers = tuple(dict.fromkeys(("parquet", name)))
    job = job_of(runs[run], tmp_path / "out", writers, layout)
    report = run_gather(job)
    table = list(writer_named("parquet").read_back(job.where(writer_named("parquet"))))
    got = list(writer_named(name).read_back(job.where(writer_named(name))))
    assert [row["index"] for row in table] == list(range(len(table))) and len(table) in (ROWS, 5)
    assert [row["index"] for row in got] == [row["index"] for row in table]
    for row, expected in zip(got, table):
        assert all(same(value, expected[column]) for column, value in row.items()), (row, expected)
        assert set(row) == set(expected) or name == "openai_batch"
    assert list(report["outputs"]) == list(writers) and report["output"] == report["outputs"]["parquet"]
    assert Path(report["outputs"][name]["path"]).exists() and report["outputs"][name]["bytes"] > 0
    if name == "jsonl" and layout == "parts":  # cut at part_size, after the row group that reaches it
        assert report["outputs"][name]["parts"] > 1
        assert sorted(p.name for p in Path(job.outputs["jsonl_parts"]).iterdir())[0] == "part-00000-of-" \
            f"{report['outputs'][name]['parts']:05d}.jsonl"


def edited(run: dict, target: Path) -> tuple[str, ...]:
    """Copies of a run's shard files with one value of shard 1 edited, its metadata kept."""
    target.mkdir()
    copies = []
    for k, path in enumerate(Path(run["root"], "shards", f"{k}.parquet") for k in range(run["settings"].shards)):
        file = pq.ParquetFile(path)
        table = file.read()
        if k == 1:
            column = table.schema.get_field_index("index")
            table = table.set_column(column + 1, table.field(column + 1), pa.array(
                ["edited", *table.column(column + 1).to_pylist()[1:]], table.field(column + 1).type))
        copies.append(str(target / path.name))
        with pq.ParquetWriter(copies[-1], table.schema.remove_metadata()) as writer:
            writer.write_table(table.replace_schema_metadata(None))
            writer.add_key_value_metadata({k: v for k, v in file.metadata.metadata.items() if k != b"ARROW:schema"})
    return tuple(copies)


@pytest.mark.parametrize("name, layout, run", CASES, ids=["-".join(case) for case in CASES])
def test_a_refused_shard_leaves_none_of_a_writers_files(runs, tmp_path, name, layout, run):
    """Beside the table (two writers taking the values: the refusal reaches both threads)."""
    writers = tuple(dict.fromkeys(("parquet", name)))
    job = job_of(runs[run], tmp_path / "out", writers, layout, shard_paths=edited(runs[run], tmp_path / "shards"))
    with pytest.raises(ProofError, match="shard 1 .*its values are not those its job wrote"):
        run_gather(job)
    assert not (tmp_path / "out").exists() or sorted((tmp_path / "out").iterdir()) == []


def test_one_read_feeds_every_writer_and_a_writers_error_stops_them_all():
    tables = [pa.table({"x": [k]}) for k in range(50)]
    read = []

    def source():
        for table in tables:
            read.append(table)
            yield table

    def total(taken):
        return sum(table["x"][0].as_py() for table in taken)

    def failing(taken):
        for table in taken:
            if table["x"][0].as_py() == 3:
                raise OSError("disk full at 3")
        return "never"

    assert fan_out(source(), [total, total, len_of]) == [1225, 1225, 50] and len(read) == 50
    read.clear()
    with pytest.raises(OSError, match="disk full at 3"):
        fan_out(source(), [total, failing])
    assert len(read) < 50  # the reading stopped


def len_of(taken) -> int:
    return sum(1 for _ in taken)


def test_switching_a_writer_off_removes_its_files_and_the_other_layouts(runs, tmp_path):
    out = tmp_path / "out"
    run_gather(job_of(runs["custom"], out, ("parquet", "jsonl"), "parts"))
    assert (out / "predictions").is_dir() and (out / "predictions-jsonl").is_dir()
    run_gather(job_of(runs["custom"], out, ("jsonl",), "file"))
    assert sorted(path.name for path in out.iterdir()) == ["predictions.jsonl", "summary.json"]
    run_gather(job_of(runs["custom"], out, ("parquet",), "file"))
    assert sorted(path.name for path in out.iterdir()) == ["predictions.parquet", "summary.json"]


def test_the_gather_rule_follows_the_writers_and_todays_params_stay(runs):
    from shardinfer.snakefile.layout import Layout
    from shardinfer.snakefile.rule_params import InputJobs

    def layout(run: str, **output) -> Layout:
        settings = dataclasses.replace(runs[run]["settings"], output=OutputSettings(**output))
        return Layout.of({None: InputJobs.of(settings)}, False, "", None)

    today, batch = layout("custom"), layout("batch")
    assert today.gathered == {"predictions": "results/predictions.parquet", "summary": "results/summary.json"}
    assert batch.gathered == {"predictions": "results/predictions.parquet",
                              "batch_output": "results/batch_output.jsonl",
                              "batch_errors": "results/batch_errors.jsonl", "summary": "results/summary.json"}
    assert today.gather_params == {} and batch.gather_params == {}  # no new param for today's configs
    assert batch.outdated({}) == ["results/predictions.parquet", "results/summary.json", "results/batch_output.jsonl"]
    assert list(batch.also_outdated({})) == ["results/batch_errors.jsonl"] and list(today.also_outdated({})) == []
    jsonl = layout("custom", layout="parts", writers=["parquet", "jsonl"])
    assert jsonl.gathered["jsonl_parts"] == "results/predictions-jsonl" and "jsonl_parts" in jsonl.folders
    assert jsonl.gather_params == {"writers": ["parquet", "jsonl"]}
    assert jsonl.outdated({}) == layout("custom", layout="parts").outdated({})  # no shard reruns
    assert repr(jsonl.also_outdated({})) == "Untracked(['results/predictions-jsonl'])"  # a param Snakemake leaves
    assert layout("batch", writers=["parquet"]).gather_params == {"writers": ["parquet"]}  # switched off: reruns
    stale = jsonl.stale({})  # every other writer's files and the other layout's (each writer's own, any writer)
    assert {"results/batch_errors.jsonl", "results/batch_output.jsonl", "results/predictions.jsonl",
            "results/predictions.parquet"} <= set(stale) and stale == sorted(stale)
    assert not {"results/predictions-jsonl", "results/predictions/.manifest.json"} & set(stale)


@pytest.mark.parametrize("output, storage, message", [
    ({"writers": ["parquet", "xml"]}, False,
     rf"^output.writers: `xml` is not a writer; known: {', '.join(all_writers())}$"),
    ({"writers": ["openai_batch"]}, False, r"^output.writers openai_batch writes for input.format openai_batch; "
                                           r"input `.*in.parquet` is parquet, so leave openai_batch out$"),
    ({"writers": ["parquet", "jsonl"], "layout": "parts"}, True, r"^output.writers jsonl with output.layout parts "
                                                                  r"without a shared filesystem: .*use output.layout"),
])
def test_a_writer_that_cannot_write_is_refused_in_one_line(runs, output, storage, message):
    with pytest.raises(UserError, match=message):
        chosen_writers(OutputSettings(**output), runs["custom"]["settings"].input, storage)


def test_jsonl_writes_json_for_every_value():
    """Values JSON has none for, made plain; a float32 written as the double it is."""
    import datetime
    import decimal

    table = pa.table({
        "f": pa.array([float("nan"), float("inf"), 0.1], pa.float32()),
        "b": pa.array([b"\x00\xff", None, b""]),
        "t": pa.array([datetime.datetime(2024, 5, 1, 12, 30)] * 3, pa.timestamp("ms")),
        "d": pa.array([decimal.Decimal("1.10")] * 3, pa.decimal128(5, 2)),
        "m": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        "s": pa.array([{"x": [1.5, float("nan")]}, None, {"x": []}]),
        "c": pa.array(["a", "b", "a"]).dictionary_encode(),
        "n": pa.array([1, None, 3], pa.int64())})
    rows = [json.loads(line) for line in lines(table)]
    assert rows[0] == {"f": None, "b": "AP8=", "t": "2024-05-01T12:30:00", "d": "1.10", "m": [["k", 1]],
                       "s": {"x": [1.5, None]}, "c": "a", "n": 1}
    assert rows[1]["f"] is None and rows[1]["b"] is None and rows[1]["m"] == [] and rows[1]["s"] is None
    assert rows[2]["f"] == float(pa.scalar(0.1, pa.float32()).as_py()) and rows[2]["b"] == "" and rows[2]["n"] == 3
