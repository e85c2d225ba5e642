"""Staged copies: a part that shards cannot read by range (a gzipped CSV/JSONL, a Parquet file whose
row groups hold rows of several shards) is copied once by the plan, the shards read the copy, and
the copy is proven as the input is (its shards check its size and mtime, gather its digest)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory import gzipped, input_frame, input_settings
from shardinfer.core.errors import ProofError, UserError
from shardinfer.input.formats import format_named, parquet, text_blocks
from shardinfer.input.parts import iter_pieces
from shardinfer.input.staging import should_stage, stage_part
from shardinfer.plan.plan_file import make_plan, read_plan, run_plan
from shardinfer.proof.prove import check_part
from test_parts import parts_settings, write_parts

MiB = 1 << 20


def one_group_parquet(frame, path: Path) -> Path:
    """The frame as a Parquet file of one row group, as pandas writes it by default."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=len(frame))
    return path


def staged_input(tmp_path, name: str, shards: int = 4, stage: str = "always", rows: int = 1000):
    """A 1000-row input of one file (`in.parquet` of one row group, `in.csv.gz`, `in.jsonl.gz`),
    planned with `stage`; returns the settings, the plan as read back from its file, and the frame."""
    frame = input_frame(rows, seed=2)
    path = tmp_path / name
    one_group_parquet(frame, path) if name.endswith(".parquet") else gzipped(frame, path)
    inp = dataclasses.replace(input_settings(path, keep_columns=("id", "gold")), stage=stage)
    run_plan(inp, shards, 32, str(tmp_path / "plan.json"), staged_dir=str(tmp_path / "staged"))
    return inp, read_plan(str(tmp_path / "plan.json")), frame


def test_rows_read_in_place_by_kind_of_file(tmp_path):
    held = [(0, 250), (250, 500), (500, 750), (750, 1000)]
    table = pa.table({"text": [f"row {i}" for i in range(1000)]})

    def parquet_read(group_rows: int) -> int:
        path = tmp_path / f"groups-{group_rows}.parquet"
        pq.write_table(table, path, row_group_size=group_rows)
        return format_named("parquet").rows_read(str(path), held)

    assert parquet_read(1000) == 2500  # one row group: each shard from the group's start
    assert parquet_read(250) == 1000  # groups at the shard boundaries
    assert parquet_read(97) == 1000 + 56 + 15 + 71  # from 194, 485, 679
    assert format_named("csv").rows_read(str(tmp_path / "in.csv.gz"), held) == 2500  # compressed: from the start
    assert format_named("csv").rows_read(str(tmp_path / "in.csv"), held) == 1000  # text spans
    assert format_named("arrow").rows_read(str(tmp_path / "in.arrow"), held) == 1000  # any row, in place


@pytest.mark.parametrize("mode, size, read, staged", [
    ("auto", 1024 * MiB, 2500, True),  # 1.5 GB more read
    ("auto", 10 * MiB, 2500, False),  # 15 MB more: not worth a copy
    ("auto", 1024 * MiB, 1100, False),  # 1.1x: under the ratio
    ("always", 10 * MiB, 1001, True),
    ("always", 1024 * MiB, 1000, False),  # read by range already
    ("never", 1024 * MiB, 64000, False),
])
def test_when_a_part_is_staged(mode, size, read, staged):
    assert should_stage(mode, 1000, size, read) is staged


@pytest.mark.parametrize("name", ["in.parquet", "in.csv.gz", "in.jsonl.gz"])
def test_shards_read_their_rows_from_the_staged_copy(tmp_path, name):
    inp, plan, frame = staged_input(tmp_path, name)
    staged = plan.parts[0].staged
    assert staged is not None and Path(staged.path).parent == tmp_path / "staged"
    assert [piece.part.read_path for pieces in plan.pieces for piece in pieces] == [staged.path] * 4
    got = [[row for _, batch in iter_pieces(inp, pieces) for row in batch.column("id").to_pylist()]
           for pieces in plan.pieces]
    assert got == [frame["id"].tolist()[start:end] for start, end in plan.ranges]
    recorded = json.loads((tmp_path / "plan.json").read_text())["input"]["parts"][0]["staged"]
    columns = ["text", "id", "gold"] if name.endswith(".parquet") else None  # a text copy: the whole part
    assert recorded == {"path": staged.path, "size": os.path.getsize(staged.path),
                        "mtime_ns": os.stat(staged.path).st_mtime_ns, "digest": staged.digest, "columns": columns}


def test_a_gzipped_copy_is_the_decompressed_bytes_so_the_plans_spans_hold(tmp_path):
    inp, plan, _ = staged_input(tmp_path, "in.csv.gz")
    assert Path(plan.parts[0].staged.path).read_bytes() == gzip.decompress((tmp_path / "in.csv.gz").read_bytes())
    assert plan.parts[0].staged.path.endswith("00000.csv")


def test_a_parquet_copy_has_a_row_group_boundary_at_each_shard_boundary_and_only_the_read_columns(tmp_path):
    inp, plan, frame = staged_input(tmp_path, "in.parquet", shards=5)
    copy = pq.ParquetFile(plan.parts[0].staged.path)
    sizes = [copy.metadata.row_group(g).num_rows for g in range(copy.metadata.num_row_groups)]
    assert sizes == [end - start for start, end in plan.ranges]
    assert copy.schema_arrow.names == ["text", "id", "gold"]
    assert copy.read().to_pandas()["gold"].tolist() == frame["gold"].tolist()


def test_a_kept_text_column_is_copied_once_and_read_twice(tmp_path):
    frame = input_frame(100)
    path = one_group_parquet(frame, tmp_path / "in.parquet")
    inp = dataclasses.replace(input_settings(path, keep_columns=("text",)), stage="always")
    plan = make_plan(inp, 2, 32, str(tmp_path / "staged"))
    assert pq.ParquetFile(plan.parts[0].staged.path).schema_arrow.names == ["text"]
    batches = [batch for k in range(2) for _, batch in plan.shard_rows(inp, k)]
    assert {tuple(batch.schema.names) for batch in batches} == {("text", "text")}
    assert pa.Table.from_batches(batches).column(1).to_pylist() == frame["text"].tolist()


def test_a_parquet_copy_also_cuts_groups_at_a_memory_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet, "GROUP_BYTES", 4096)
    monkeypatch.setattr(parquet, "BATCH_ROWS", 50)  # the bound is checked batch by batch
    inp, plan, frame = staged_input(tmp_path, "in.parquet", shards=3)
    metadata = pq.ParquetFile(plan.parts[0].staged.path).metadata
    ends = {sum(metadata.row_group(g).num_rows for g in range(k + 1)) for k in range(metadata.num_row_groups)}
    assert metadata.num_row_groups > 3 and {end for _, end in plan.ranges} <= ends
    got = [row for pieces in plan.pieces for _, batch in iter_pieces(inp, pieces)
           for row in batch.column("id").to_pylist()]
    assert got == frame["id"].tolist()


def test_auto_reads_a_small_file_in_place_and_one_shard_never_stages(tmp_path):
    assert staged_input(tmp_path / "a", "in.parquet", stage="auto")[1].parts[0].staged is None  # 64 KB
    assert staged_input(tmp_path / "b", "in.csv.gz", shards=1)[1].parts[0].staged is None  # read once anyway
    assert staged_input(tmp_path / "c", "in.csv.gz", stage="never")[1].parts[0].staged is None
    assert list((tmp_path / "a" / "staged").iterdir()) == []  # the rule's folder, made empty


def test_only_the_parts_that_need_it_are_staged(tmp_path):
    frame = input_frame(1000)
    write_parts(frame, tmp_path / "parts", ".parquet", cuts=(0, 100, 600, 1000))  # row groups of 97 rows
    inp = dataclasses.replace(parts_settings(tmp_path / "parts"), stage="always")
    plan = make_plan(inp, 4, 32, str(tmp_path / "staged"))
    # part 0 (rows 0-99) lies in shard 0 alone; parts 1 and 2 hold shard boundaries inside a row group
    assert [part.staged is not None for part in plan.parts] == [False, True, True]
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == ["00001.parquet", "00002.parquet"]
    rows = [row for pieces in plan.pieces for _, batch in iter_pieces(inp, pieces)
            for row in batch.column("id").to_pylist()]
    assert rows == frame["id"].tolist()


@pytest.mark.parametrize("change", ["remove", "touch"])
def test_a_shard_refuses_a_staged_copy_gone_or_changed(tmp_path, change):
    inp, plan, _ = staged_input(tmp_path, "in.jsonl.gz")
    copy = Path(plan.parts[0].staged.path)
    copy.unlink() if change == "remove" else os.utime(copy, ns=(0, 0))
    word = "has disappeared" if change == "remove" else "changed"
    with pytest.raises(UserError, match=rf"^staged copy `.*00000.jsonl` of input `.*in.jsonl.gz` {word} since "
                                        r"planning; rerun the plan \(snakemake --forcerun plan\)$"):
        plan.check_input_unchanged()


def test_gather_refuses_a_staged_copy_edited_with_its_size_and_mtime_kept(tmp_path):
    inp, plan, _ = staged_input(tmp_path, "in.csv.gz")
    check_part(plan, plan.parts[0], inp)  # as planned: passes
    copy = Path(plan.parts[0].staged.path)
    before, text = copy.stat(), copy.read_text()
    copy.write_text(text.replace("row-7", "row-8", 1))
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    plan.check_input_unchanged()  # size and mtime as planned: only its content tells
    with pytest.raises(ProofError, match=r"^staged copy `.*00000.csv` of input `.*in.csv.gz` changed since planning: "
                                         r"other content \(sha256:\w+ -> sha256:\w+\); rerun the plan"):
        check_part(plan, plan.parts[0], inp)


def test_a_part_that_is_not_the_planned_one_when_staged_is_refused_and_no_copy_is_left(tmp_path):
    path = gzipped(input_frame(50), tmp_path / "in.csv.gz")
    target = tmp_path / "staged" / "00000.csv"
    with pytest.raises(UserError, match=r"^input `.*in.csv.gz` changed while it was being staged; rerun the plan"):
        stage_part(input_settings(path), str(path), "sha256:planned", [(0, 25), (25, 50)], target)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_a_parquet_copy_made_for_other_columns_is_refused_when_read(tmp_path):
    """A plan from before keep_columns changed (Snakemake replans on it unless its params trigger is off)."""
    inp, plan, _ = staged_input(tmp_path, "in.parquet")
    wider = dataclasses.replace(inp, keep_columns=("id", "gold", "extra"))
    with pytest.raises(UserError, match=r"^staged copy `.*00000.parquet` of input `.*in.parquet` holds the columns "
                                        r"\['text', 'id', 'gold'\], not `extra`; rerun the plan"):
        list(plan.shard_rows(wider, 0))


def test_a_copy_that_cannot_be_written_is_named_as_such_not_as_the_input(tmp_path):
    path = gzipped(input_frame(50), tmp_path / "in.csv.gz")
    (tmp_path / "staged").write_text("a file where the folder goes")
    with pytest.raises(UserError, match=r"^cannot write the staged copy `.*staged/00000.csv`: "):
        stage_part(input_settings(path), str(path), "sha256:any", [(0, 25), (25, 50)],
                   tmp_path / "staged" / "00000.csv")


def test_a_part_replaced_while_it_is_staged_is_refused(tmp_path, monkeypatch):
    """The digest thread and the copier open the part apart: a file renamed over it in between is
    caught by its inode, though the digest read the planned bytes."""
    inp, plan, _ = staged_input(tmp_path, "in.csv.gz")
    part, real = plan.parts[0], text_blocks.TextFormat.stage

    def replaced_meanwhile(*args):
        digest = real(*args)
        stat = os.stat(part.path)
        Path(part.path + ".new").write_bytes(Path(part.path).read_bytes())
        os.replace(part.path + ".new", part.path)
        os.utime(part.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        return digest

    monkeypatch.setattr(text_blocks.TextFormat, "stage", replaced_meanwhile)
    target = tmp_path / "again" / "00000.csv"
    with pytest.raises(UserError, match=r"changed while it was being staged"):
        stage_part(inp, part.path, part.digest, [(0, 500), (500, 1000)], target)
    assert not target.exists()
