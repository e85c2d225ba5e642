"""Gather proves before it writes: each fault in a shard file is refused with one line naming
the shard, and no predictions file appears."""

import json
import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from factory import flip_a_data_page_byte, gather_job, input_frame, input_settings, write_input
from shardinfer.contract.content_digest import CONTENT_KEY
from shardinfer.contract.shard_file import IDENTITY_KEY
from shardinfer.core.errors import ProofError, UserError
from shardinfer.plan.plan_file import read_plan, run_plan
from shardinfer.proof.gather import run_gather
from shardinfer.settings.config import BatchSettings, ModelSettings, Settings
from shardinfer.shard.job import run_shard
from shardinfer.shard.runtime import ShardJob

ROWS, SHARDS, DIGEST = 40, 3, "digest-a"


@pytest.fixture(scope="module")
def shards(models, tmp_path_factory):
    """A plan and its three real shard files, made once; tests tamper with copies."""
    root = tmp_path_factory.mktemp("gather")
    inp = input_settings(write_input(input_frame(ROWS), root / "in.parquet"), keep_columns=("id", "gold"))
    model = ModelSettings(path=str(models.classifier), adapter=None, task="classify", max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(256, 16, 128), shards=SHARDS)
    run_plan(inp, SHARDS, 32, str(root / "plan.json"))
    paths = []
    for shard in range(SHARDS):
        paths.append(str(root / "shards" / f"{shard}.parquet"))
        run_shard(ShardJob(settings, str(root / "plan.json"), shard, paths[-1], DIGEST))
    return root, inp, paths


def gather(root, inp, paths, digest=DIGEST):
    out = root / "out"
    return run_gather(gather_job(root / "plan.json", paths, inp, {}, digest, out / "predictions.parquet",
                                 out / "summary.json"))


def tampered(paths, tmp_path, shard, change):
    """Copy the shard files, rewriting one of them with `change(table, identity)`."""
    copies = []
    for i, path in enumerate(paths):
        table = pq.read_table(path)
        file_metadata = pq.ParquetFile(path).metadata.metadata
        if i == shard:
            identity = json.loads(file_metadata[IDENTITY_KEY])
            table, identity = change(table, identity)
            file_metadata = {**file_metadata, IDENTITY_KEY: json.dumps(identity).encode()}
        copies.append(str(tmp_path / "shards" / f"{i}.parquet"))
        (tmp_path / "shards").mkdir(exist_ok=True)
        writer = pq.ParquetWriter(copies[-1], table.schema.remove_metadata())
        writer.write_table(table.replace_schema_metadata(None))
        writer.add_key_value_metadata({k: v for k, v in file_metadata.items() if k != b"ARROW:schema"})
        writer.close()
    return copies


def assert_refused(shards, paths, message, digest=DIGEST):
    root, inp, _ = shards
    with pytest.raises(ProofError, match=message) as caught:
        gather(root, inp, paths, digest)
    assert "\n" not in str(caught.value)
    assert not (root / "out" / "predictions.parquet").exists()
    assert not (root / "out" / "summary.json").exists()


def test_untouched_shards_gather_into_all_rows_in_order(shards):
    root, inp, paths = shards
    report = gather(root, inp, paths)
    table = pq.read_table(root / "out" / "predictions.parquet")
    assert table.column("index").to_pylist() == list(range(ROWS))
    assert table.column("id").to_pylist() == [f"row-{i}" for i in range(ROWS)]
    plan = read_plan(str(root / "plan.json"))
    assert [s["rows"] for s in report["per_shard"]] == [end - start for start, end in plan.ranges]
    for name in ("predictions.parquet", "summary.json"):
        (root / "out" / name).unlink()


def test_missing_shard_file(shards, tmp_path):
    paths = list(shards[2])
    paths[1] = str(tmp_path / "nowhere.parquet")
    assert_refused(shards, paths, r"shard 1 \(.*\): file is missing")


def start_of(shards, shard: int) -> int:
    return read_plan(str(shards[0] / "plan.json")).ranges[shard][0]


def test_duplicated_index(shards, tmp_path):
    def duplicate(table, identity):
        return pa.concat_tables([table.slice(0, 5), table.slice(4, 1), table.slice(6)]), identity

    row = start_of(shards, 1) + 4
    assert_refused(shards, tampered(shards[2], tmp_path, 1, duplicate), rf"shard 1 .*: index {row} appears 2 times")


def test_missing_row(shards, tmp_path):
    def drop(table, identity):
        return pa.concat_tables([table.slice(0, 2), table.slice(3)]), identity

    row = start_of(shards, 2) + 2
    assert_refused(shards, tampered(shards[2], tmp_path, 2, drop), rf"shard 2 .*: row {row} is missing")


def test_rows_out_of_order(shards, tmp_path):
    def swap(table, identity):
        return table.take(pa.array([1, 0, *range(2, table.num_rows)])), identity

    assert_refused(shards, tampered(shards[2], tmp_path, 0, swap), r"shard 0 .*: rows out of order at position 0")


def test_shard_from_another_plan(shards, tmp_path):
    def other_plan(table, identity):
        return table, {**identity, "plan_id": "0123456789abcdef"}

    assert_refused(shards, tampered(shards[2], tmp_path, 2, other_plan), r"shard 2 .*: made under another plan")


def test_shard_from_other_settings(shards):
    assert_refused(shards, shards[2], r"shard 0 .*: made with other model or output settings", digest="digest-b")


def test_truncated_shard_file(shards, tmp_path):
    paths = list(shards[2])
    data = open(paths[1], "rb").read()
    (tmp_path / "1.parquet").write_bytes(data[: len(data) // 2])
    paths[1] = str(tmp_path / "1.parquet")
    assert_refused(shards, paths, r"shard 1 .*: unreadable or truncated parquet")


def test_a_file_that_is_not_a_shard(shards, tmp_path):
    paths = list(shards[2])
    pq.write_table(pa.table({"index": pc.cast(pa.array(range(14)), pa.int64())}), tmp_path / "0.parquet")
    paths[0] = str(tmp_path / "0.parquet")
    assert_refused(shards, paths, r"shard 0 .*: not a shard file of this workflow")


def test_stray_file_in_the_shard_folder(shards, tmp_path):
    copies = tampered(shards[2], tmp_path, 0, lambda table, identity: (table, identity))
    (tmp_path / "shards" / ".1.parquet.partial").write_bytes(b"a killed job's leftover is not a shard")
    (tmp_path / "shards" / "7.parquet").write_bytes(b"")
    assert_refused(shards, copies, r"stray file `.*/shards/7.parquet` in the shard folder is not part of the plan")
    (tmp_path / "shards" / "7.parquet").unlink()
    root, inp, _ = shards
    assert gather(root, inp, copies)["rows"] == ROWS
    for name in ("predictions.parquet", "summary.json"):
        (root / "out" / name).unlink()


def test_input_changed_after_planning_is_refused_before_writing(tmp_path):
    inp = input_settings(write_input(input_frame(10), tmp_path / "in.parquet"))
    run_plan(inp, 2, 32, str(tmp_path / "plan.json"))
    write_input(input_frame(11), tmp_path / "in.parquet")
    out = tmp_path / "out" / "predictions.parquet"
    with pytest.raises(UserError, match=r"input `.*in.parquet` changed since planning .*rerun the plan"):
        run_gather(gather_job(tmp_path / "plan.json", [tmp_path / "0.parquet", tmp_path / "1.parquet"], inp, {},
                              DIGEST, out, tmp_path / "out" / "summary.json"))
    assert not out.exists()


def test_a_shard_with_edited_values_and_its_metadata_kept_is_refused_and_nothing_written(shards, tmp_path):
    """Only the values change: index, identity, stats and content digest are copied over as they were."""
    def edit(table, identity):
        probs = table.column("probs").to_pylist()
        probs[3] = [p + 0.25 for p in probs[3]]
        return table.set_column(table.schema.get_field_index("probs"), "probs",
                                pa.array(probs, type=table.schema.field("probs").type)), identity

    assert_refused(shards, tampered(shards[2], tmp_path, 1, edit),
                   r"shard 1 .*: its values are not those its job wrote")
    assert not list((shards[0] / "out").glob(".*partial"))  # shard 0 was already streamed: the partial file is gone


def test_a_shard_rewritten_without_its_content_digest_is_refused_naming_the_rewrite(shards, tmp_path):
    """The identity is kept (as a rewrite that copies the schema's metadata keeps it), the digest lost."""
    copies = tampered(shards[2], tmp_path, 2, lambda table, identity: (table, identity))
    table, metadata = pq.read_table(copies[2]), pq.ParquetFile(copies[2]).metadata.metadata
    pq.write_table(table.replace_schema_metadata({k: v for k, v in metadata.items() if k != CONTENT_KEY}), copies[2])
    assert_refused(shards, copies, r"shard 2 .*: its metadata holds no digest of its values, which its infer job "
                                   r"always writes \(the file was rewritten by another tool")


def test_a_flipped_byte_in_a_data_page_is_refused_as_a_checksum_failure(shards, tmp_path):
    """A bit flipped in page data (not a header or the footer) of `probs`, a column read only while
    writing, mid-stream, after shards 0 and 1 are already in the partial file."""
    (tmp_path / "shards").mkdir()
    paths = [shutil.copy(path, tmp_path / "shards") for path in shards[2]]  # byte for byte, checksums kept
    flip_a_data_page_byte(paths[2], "probs")
    assert_refused(shards, paths, r"shard 2 .*: damaged: a page fails its checksum \(.*CRC")
    assert not list((shards[0] / "out").glob(".*partial"))


def test_input_edited_with_the_same_size_and_mtime_is_refused_by_its_content_digest(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.csv")
    inp = input_settings(path)
    run_plan(inp, 2, 32, str(tmp_path / "plan.json"))
    before = path.stat()
    text = path.read_text()
    edited = text.replace("row-3,", "row-8,", 1)
    assert edited != text and len(edited) == len(text)
    path.write_text(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    out = tmp_path / "out" / "predictions.parquet"
    with pytest.raises(ProofError, match=r"^input `.*in.csv` changed since planning: same size and mtime, other "
                                         r"content \(sha256:\w+ -> sha256:\w+\); rerun the plan") as caught:
        run_gather(gather_job(tmp_path / "plan.json", [tmp_path / "0.parquet", tmp_path / "1.parquet"], inp, {},
                              DIGEST, out, tmp_path / "out" / "summary.json"))
    assert "\n" not in str(caught.value)
    assert not out.exists()


def empty_run(root, task="classify", model_path="unused"):
    """A plan of an input without rows, its two (empty) shard files and the job's settings."""
    from factory import write_empty_input

    inp = input_settings(write_empty_input(root / "in.parquet"), keep_columns=("id", "gold"))
    model = ModelSettings(path=model_path, adapter=None, task=task, max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(256, 16, 128), shards=2)
    run_plan(inp, 2, 32, str(root / "plan.json"))
    paths = [str(root / "shards" / f"{shard}.parquet") for shard in range(2)]
    for shard, path in enumerate(paths):  # empty: no model is loaded (the path names none)
        run_shard(ShardJob(settings, str(root / "plan.json"), shard, path, DIGEST))
    return inp, paths


def test_an_input_without_rows_gathers_into_an_empty_proven_table(tmp_path):
    inp, paths = empty_run(tmp_path)
    out = tmp_path / "out"
    report = run_gather(gather_job(tmp_path / "plan.json", paths, inp, {"task": "classify"}, DIGEST,
                                   out / "predictions.parquet", out / "summary.json"))
    table = pq.read_table(out / "predictions.parquet")
    assert table.num_rows == 0 and report["rows"] == 0 and report["run"]["rows"] == 0
    assert table.schema.names == ["index", "id", "gold", "label", "label_id", "probs"]
    assert table.schema.field("gold").type == pa.int64() and table.schema.field("probs").type == pa.list_(pa.float32())
    assert json.loads((out / "summary.json").read_text())["rows"] == 0


def test_an_input_without_rows_that_changed_since_planning_is_refused(tmp_path):
    """Its identity holds as for any input: the same size and mtime, other bytes, is refused by digest."""
    inp, paths = empty_run(tmp_path)
    path, stamp = tmp_path / "in.parquet", os.stat(tmp_path / "in.parquet")
    data = path.read_bytes()
    assert b"parquet-cpp-arrow" in data  # the footer's `created_by`: same size, other content, still readable
    path.write_bytes(data.replace(b"parquet-cpp-arrow", b"parquet-cpp-arroW"))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    with pytest.raises(ProofError, match="changed since planning: same size and mtime, other content"):
        run_gather(gather_job(tmp_path / "plan.json", paths, inp, {"task": "classify"}, DIGEST,
                              tmp_path / "out" / "predictions.parquet", tmp_path / "out" / "summary.json"))
    assert not (tmp_path / "out" / "predictions.parquet").exists()


def test_a_custom_task_on_an_input_without_rows_is_refused_in_one_line(tmp_path):
    """Custom code names its columns only when it loads for rows: no table to write, said so."""
    root = tmp_path
    from factory import write_empty_input

    inp = input_settings(write_empty_input(root / "in.parquet"), keep_columns=("id",))
    run_plan(inp, 2, 32, str(root / "plan.json"))
    with pytest.raises(UserError, match=r"has no rows, and task custom names its output columns only when its code"):
        run_gather(gather_job(root / "plan.json", [], inp, {"task": "custom"}, DIGEST, root / "p.parquet",
                              root / "s.json"))
