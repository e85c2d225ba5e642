"""The input's identity (stat triggers and content digest) and the shard files' content digest: a
replaced input is noticed whatever its mtime, and a digest of values survives the trip through Parquet."""

import hashlib
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory import flip_a_data_page_byte, input_frame, input_settings, write_input
from shardinfer.contract.content_digest import ContentHasher, table_digest
from shardinfer.contract.file_digest import file_digest
from shardinfer.core.atomic import atomic_parquet_writer
from shardinfer.input.identity import gather_trigger, plan_trigger
from shardinfer.plan.plan_file import make_plan, read_plan, run_plan


def shard_like(rows: int = 200) -> pa.Table:
    """A shard's columns (index, keep columns of several input types, task outputs), nulls included."""
    return pa.table({
        "index": pa.array(np.arange(1000, 1000 + rows, dtype=np.int64)),
        "id": pa.array([None if i % 7 == 0 else f"row-{i}" * (i % 4) for i in range(rows)]),
        "gold": pa.array([None if i % 5 == 0 else i % 3 for i in range(rows)], pa.int64()),
        "score": pa.array([i / 3 for i in range(rows)], pa.float64()),
        "flag": pa.array([None if i % 9 == 0 else i % 2 == 0 for i in range(rows)]),
        "when": pa.array([None if i % 6 == 0 else 86_400_000 * i for i in range(rows)], pa.timestamp("ms")),
        "kind": pa.array([f"k{i % 3}" for i in range(rows)]).dictionary_encode(),
        "note": pa.array([f"n{i}" for i in range(rows)], pa.large_string()),
        "label": pa.array([["negative", "neutral", "positive"][i % 3] for i in range(rows)]),
        "probs": pa.array([None if i % 11 == 0 else [i / 7, None if i % 13 == 0 else 0.5, -0.0]
                           for i in range(rows)], pa.list_(pa.float32())),
    })


def written_and_read_back(table: pa.Table, path, cuts=(0, 17, 64, 130)) -> tuple[str, str]:
    """Hash the table as a shard job does (slices, written one by one) and as gather does (row groups read back)."""
    writing = ContentHasher()
    with atomic_parquet_writer(path, table.schema) as writer:
        for start, end in zip(cuts, [*cuts[1:], table.num_rows]):
            writer.write_table(table.slice(start, end - start))
            writing.update(table.slice(start, end - start))
    reading, file = ContentHasher(), pq.ParquetFile(path, page_checksum_verification=True)
    for group in range(file.num_row_groups):
        reading.update(file.read_row_group(group))
    return writing.digest(), reading.digest()


def test_the_content_digest_is_the_same_written_and_read_back(tmp_path):
    table = shard_like()
    written, read = written_and_read_back(table, tmp_path / "shard.parquet")
    assert written == read == table_digest(table) == table_digest(table.combine_chunks())
    assert pq.ParquetFile(tmp_path / "shard.parquet").num_row_groups == 4  # read back in other chunks
    assert table_digest(pq.read_table(tmp_path / "shard.parquet")) == written  # one chunk per column
    assert written.startswith("sha256:") and len(written) == 7 + 64


@pytest.mark.parametrize("column, row, value", [
    ("index", 5, 1), ("id", 4, "row-4row-4"), ("id", 7, ""), ("gold", 5, 0), ("score", 2, 0.6666),
    ("flag", 9, False), ("when", 6, 0), ("kind", 1, "k0"), ("note", 0, "m0"), ("label", 3, "neutral"),
    ("probs", 11, []), ("probs", 1, [1 / 7, 0.5]), ("probs", 13, [13 / 7, 0.5, -0.0]), ("probs", 2, [2 / 7, 0.5, 0.0]),
])
def test_any_changed_value_changes_the_digest(column, row, value):
    """One value per type: a changed value, a null made a value (and back), a list one item shorter,
    a null item, -0.0 against 0.0."""
    table = shard_like()
    values = table.column(column).to_pylist()
    assert values[row] != value or (value == 0.0 and str(values[row][2]) != str(value))
    values[row] = value
    changed = table.set_column(table.schema.get_field_index(column), column,
                               pa.array(values, type=table.schema.field(column).type))
    assert table_digest(changed) != table_digest(table)


def test_the_digest_does_not_depend_on_how_rows_are_split():
    table = shard_like(100)
    hasher = ContentHasher()
    for batch in table.to_batches(max_chunksize=9):
        hasher.update(batch)
    assert hasher.digest() == table_digest(table)
    assert table_digest(table.slice(0, 0)) == ContentHasher().digest()  # empty: adds nothing


def test_pages_are_written_with_checksums_and_a_damaged_page_is_refused(tmp_path):
    """Shard, token and predictions files all come from atomic_parquet_writer; a plain writer's file
    (no checksums) with the same damage is read without complaint: the check is the checksum's."""
    table = pa.table({"index": np.arange(500, dtype=np.int64)})
    for name, write in (("ours", lambda p: atomic_parquet_writer(p, table.schema)), ("plain", None)):
        path = tmp_path / f"{name}.parquet"
        if write is None:
            pq.write_table(table, path)
        else:
            with write(path) as writer:
                writer.write_table(table)
        flip_a_data_page_byte(path, "index")
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.ParquetFile(tmp_path / "ours.parquet", page_checksum_verification=True).read()
    pq.ParquetFile(tmp_path / "plain.parquet", page_checksum_verification=True).read()


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_the_plan_records_the_sha256_of_the_input_bytes(tmp_path, suffix):
    path = write_input(input_frame(30), tmp_path / f"in{suffix}")
    run_plan(input_settings(path), 3, 32, str(tmp_path / "plan.json"))
    expected = f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    assert json.loads((tmp_path / "plan.json").read_text())["input"]["parts"][0]["digest"] == expected
    assert read_plan(str(tmp_path / "plan.json")).parts[0].digest == expected == file_digest(str(path))


def test_the_plan_id_changes_with_the_content_alone(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.csv")
    first = make_plan(input_settings(path), 2, 32)
    stat = path.stat()
    path.write_text(path.read_text().replace("row-3,", "row-8,", 1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = make_plan(input_settings(path), 2, 32)
    (before,), (after,) = first.parts, again.parts
    assert (after.size, after.mtime_ns) == (before.size, before.mtime_ns) and after.digest != before.digest
    assert again.plan_id != first.plan_id


def test_an_older_replacement_changes_the_plan_trigger(tmp_path):
    """`cp -p` of another table: an older mtime, which Snakemake's mtime check alone does not notice."""
    path = write_input(input_frame(10), tmp_path / "in.csv")
    before, planned = plan_trigger((str(path),)), path.stat().st_mtime_ns
    other = write_input(input_frame(10, seed=4), tmp_path / "other.csv")
    os.utime(other, ns=(0, planned - 10**12))
    shutil.copy2(other, path)
    assert path.stat().st_mtime_ns < planned and plan_trigger((str(path),)) != before


def test_a_rewrite_with_the_same_size_and_mtime_changes_the_gather_trigger_only(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.csv")
    plan, gather = plan_trigger((str(path),)), gather_trigger((str(path),))
    stat = path.stat()
    copy = tmp_path / "copy.csv"
    shutil.copy2(path, copy)
    os.replace(copy, path)  # a copy of the same bytes put in its place, as a copied run folder has
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert plan_trigger((str(path),)) == plan and gather_trigger((str(path),)) != gather
