"""Inputs of many files: a directory or glob of parts is one table, numbered across the parts in
sorted order; it plans and reads exactly as the same rows in one file, and gather proves it
against the whole set of parts (one added, removed or changed after planning is caught)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory import flip_a_data_page_byte, input_frame, input_settings, run_workflow, workflow_config, write_input
from shardinfer.core.errors import ProofError, UserError
from shardinfer.input.discovery import resolve_input
from shardinfer.input.formats.base import common_type
from shardinfer.input.identity import gather_trigger, plan_trigger
from shardinfer.input.parts import iter_pieces
from shardinfer.plan.plan_file import make_plan, read_plan, run_plan
from shardinfer.proof.prove import prove
from test_workflow import assert_refused, run_ok

CUTS = (0, 137, 137, 640, 1000)  # uneven parts, one of them empty


def write_parts(frame: pd.DataFrame, folder: Path, suffix: str, cuts=CUTS) -> list[Path]:
    """The frame cut into parts `part-00000<suffix>`, ... (a `.gz` suffix compresses them)."""
    paths = []
    for k, (start, end) in enumerate(zip(cuts, cuts[1:])):
        plain = suffix.removesuffix(".gz")
        path = write_input(frame.iloc[start:end], folder / f"part-{k:05d}{plain}")
        if suffix.endswith(".gz"):
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
            path.unlink()
            path = path.with_name(path.name + ".gz")
        paths.append(path)
    return paths


def parts_settings(path: Path | str, **overrides):
    """Input settings of a directory or glob, its parts resolved as the Snakefile resolves them."""
    fmt, parts = resolve_input(str(path))
    return dataclasses.replace(input_settings(Path(parts[0]), **overrides), path=str(path), format=fmt, parts=parts)


def shard_rows(inp, plan) -> list[list[str]]:
    return [[i for _, batch in iter_pieces(inp, pieces) for i in batch.column("id").to_pylist()]
            for pieces in plan.pieces]


def test_a_directory_is_its_table_files_in_order_markers_and_hidden_names_skipped(tmp_path):
    folder = tmp_path / "export"
    for name in ("b/part-1.parquet", "a/part-2.parquet", "part-0.parquet", "_SUCCESS", ".part-0.parquet.crc",
                 "README.md", "_temporary/0/part-9.parquet", ".hidden/part-8.parquet"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
    fmt, parts = resolve_input(str(folder))
    assert fmt == "parquet"
    assert [os.path.relpath(p, folder) for p in parts] == ["a/part-2.parquet", "b/part-1.parquet", "part-0.parquet"]


def test_a_glob_is_its_matches_sorted_by_name(tmp_path):
    for name in ("part-10.csv.gz", "part-02.csv", "part-01.csv", "_part-00.csv", "other.csv"):
        (tmp_path / name).write_text("")
    fmt, parts = resolve_input(str(tmp_path / "part-*.csv*"))
    assert fmt == "csv" and [Path(p).name for p in parts] == ["part-01.csv", "part-02.csv", "part-10.csv.gz"]
    assert resolve_input(str(tmp_path / "**" / "part-0*.csv"))[1] == parts[:2]


@pytest.mark.parametrize("names, pattern, message", [
    ((), "part-*.parquet", r"input.path `.*part-\*.parquet` matches no files \(names starting with `.` or `_`"),
    (("_part-0.parquet",), "*part-*.parquet", r"matches no files"),
    (("a.parquet", "b.csv"), "*", r"input.path `.*\*` mixes formats: `.*a.parquet` is parquet, `.*b.csv` is csv"),
    (("a.parquet", "b.txt"), "*", r"input `.*b.txt`: unknown file type; allowed extensions"),
])
def test_a_glob_that_gives_no_one_table_is_refused_in_one_line(tmp_path, names, pattern, message):
    for name in names:
        (tmp_path / name).write_text("")
    with pytest.raises(UserError, match=message) as caught:
        resolve_input(str(tmp_path / pattern))
    assert "\n" not in str(caught.value)


def test_input_format_reads_parts_without_an_extension(tmp_path):
    for k in range(2):
        (tmp_path / f"part-{k}").write_text("")
    parts = tuple(str(tmp_path / f"part-{k}") for k in range(2))
    assert resolve_input(str(tmp_path / "part-*"), "csv") == ("csv", parts)


def test_a_file_whose_name_looks_like_a_glob_is_that_file(tmp_path):
    path = write_input(input_frame(3), tmp_path / "scores[2024].csv")
    assert resolve_input(str(path)) == ("csv", (str(path),))


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl", ".csv.gz", ".jsonl.gz"])
def test_parts_plan_and_read_as_the_same_rows_in_one_file(tmp_path, suffix):
    frame = input_frame(1000)
    write_parts(frame, tmp_path / "parts", suffix)
    whole = input_settings(write_input(frame, tmp_path / f"whole{suffix.removesuffix('.gz')}"))
    inp = parts_settings(tmp_path / "parts")
    plan, single = make_plan(inp, 4, 32), make_plan(whole, 4, 32)
    assert (plan.rows, plan.ranges, plan.costs) == (single.rows, single.ranges, single.costs)
    assert [(p.first_row, p.rows) for p in plan.parts] == [(0, 137), (137, 0), (137, 503), (640, 360)]
    assert [len(pieces) for pieces in plan.pieces] == [2, 1, 2, 1]  # shards 0 and 2 span a part boundary
    assert shard_rows(inp, plan) == shard_rows(whole, single) == [frame["id"].tolist()[s:e] for s, e in plan.ranges]


@pytest.mark.parametrize("cuts, shards", [((0, 1, 1, 2, 9), 12), ((0, 0, 5, 5), 3), ((0, 3, 4, 9, 30), 7)])
def test_pieces_cover_each_range_exactly_with_empty_parts_and_empty_shards(tmp_path, cuts, shards):
    write_parts(input_frame(cuts[-1]), tmp_path / "parts", ".csv", cuts=cuts)
    inp = parts_settings(tmp_path / "parts")
    plan = make_plan(inp, shards, 32)
    for (start, end), pieces in zip(plan.ranges, plan.pieces):
        first = [piece.part.first_row for piece in pieces]
        rows = [row for at, piece in zip(first, pieces) for row in range(at + piece.start, at + piece.end)]
        assert rows == list(range(start, end)) and all(piece.start < piece.end for piece in pieces)
    assert sum(map(len, shard_rows(inp, plan))) == cuts[-1]


def test_the_plan_file_records_each_part_and_each_shards_pieces(tmp_path):
    paths = write_parts(input_frame(1000), tmp_path / "parts", ".csv")
    inp = parts_settings(tmp_path / "parts")
    run_plan(inp, 4, 32, str(tmp_path / "plan.json"))
    recorded = json.loads((tmp_path / "plan.json").read_text())
    assert recorded["input"]["path"] == str(tmp_path / "parts")
    part = recorded["input"]["parts"][2]
    assert part == {"path": str(paths[2]), "first_row": 137, "rows": 503, "size": paths[2].stat().st_size,
                    "mtime_ns": paths[2].stat().st_mtime_ns, "digest": part["digest"], "staged": None}
    first = recorded["shards"][0]
    assert [(p["part"], p["start"], p["end"]) for p in first["pieces"]] == [(0, 0, 137), (2, 0, first["end"] - 137)]
    assert first["pieces"][1]["span"]["row"] == 0
    assert read_plan(str(tmp_path / "plan.json")) == make_plan(inp, 4, 32)


def test_null_texts_are_named_by_their_row_in_the_whole_input(tmp_path):
    frame = input_frame(1000)
    frame.loc[[3, 700, 701], "text"] = None
    write_parts(frame, tmp_path / "parts", ".parquet")
    with pytest.raises(UserError, match=r"is null in 3 row\(s\) \(first: 3, 700, 701\)"):
        make_plan(parts_settings(tmp_path / "parts"), 4, 32)


def test_parquet_parts_of_other_writers_types_are_read_in_one_type(tmp_path):
    """Writers differ (Spark: string and int32, pandas: large_string and int64, a categorical):
    the plan types the parts together and every shard reads them in those types."""
    frame = input_frame(30)
    write_input(frame.iloc[:10], tmp_path / "parts" / "a.parquet")
    spark = pa.table({"text": pa.array(frame["text"][10:20], pa.string()),
                      "id": pa.array(frame["id"][10:20], pa.string()),
                      "gold": pa.array(frame["gold"][10:20], pa.int32())})
    pq.write_table(spark, tmp_path / "parts" / "b.parquet")
    categorical = pa.Table.from_pandas(frame.iloc[20:].astype({"id": "category", "gold": "uint32"}),
                                       preserve_index=False)
    pq.write_table(categorical, tmp_path / "parts" / "c.parquet")
    inp = parts_settings(tmp_path / "parts", keep_columns=("id", "gold"))
    plan = make_plan(inp, 3, 32)
    run_plan(inp, 3, 32, str(tmp_path / "plan.json"))
    assert read_plan(str(tmp_path / "plan.json")).fields == plan.fields
    batches = [batch for k in range(plan.shards) for _, batch in plan.shard_rows(inp, k)]
    assert {str(batch.schema) for batch in batches} == {"text: large_string\nid: large_string\ngold: int64"}
    assert pa.Table.from_batches(batches).column("gold").to_pylist() == frame["gold"].tolist()
    assert pa.Table.from_batches(batches).column("id").to_pylist() == frame["id"].tolist()
    same = make_plan(parts_settings(tmp_path / "parts", keep_columns=()), 2, 32)
    assert same.fields is not None  # text: string in b, large_string in a and c


@pytest.mark.parametrize("one, other, common", [
    (pa.string(), pa.large_string(), pa.large_string()), (pa.int32(), pa.int64(), pa.int64()),
    (pa.uint32(), pa.int64(), pa.int64()), (pa.uint64(), pa.int64(), None), (pa.int8(), pa.uint8(), None),
    (pa.float32(), pa.float64(), pa.float64()), (pa.int64(), pa.float64(), None), (pa.null(), pa.int16(), pa.int16()),
    (pa.dictionary(pa.int8(), pa.string()), pa.large_string(), pa.large_string()), (pa.string(), pa.int64(), None),
    (pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.large_list(pa.int64())),
    (pa.timestamp("ms"), pa.string(), None),
])
def test_parquet_parts_widen_only_where_every_value_is_kept(one, other, common):
    assert common_type(one, other) == common and common_type(other, one) == common


@pytest.mark.parametrize("other, holds", [(str, "large_string"), ("float64", "double"), ("uint64", "uint64")])
def test_parquet_parts_whose_column_no_one_type_holds_exactly_are_refused(tmp_path, other, holds):
    """Only widenings that keep every value (no int64 into a double, no signed into unsigned, no
    numbers as text); the conflicting part is named, not merely the first."""
    frame = input_frame(30)
    (tmp_path / "parts").mkdir()
    pq.write_table(pa.table({"text": frame["text"][:10], "gold": pa.nulls(10)}), tmp_path / "parts" / "a.parquet")
    write_input(frame.iloc[10:20], tmp_path / "parts" / "b.parquet")
    write_input(frame.iloc[20:].astype({"gold": other}), tmp_path / "parts" / "c.parquet")
    inp = parts_settings(tmp_path / "parts", keep_columns=("id", "gold"))
    with pytest.raises(UserError, match=rf"^input `.*c.parquet`: column `gold` holds {holds}, but `.*b.parquet` "
                                        r"holds int64, and no type holds both exactly \(allowed across parts"):
        make_plan(dataclasses.replace(inp, keep_columns=("gold",)), 2, 32)
    assert make_plan(dataclasses.replace(inp, keep_columns=()), 2, 32).fields is None  # gold not read: no conflict


def test_a_keep_column_missing_from_one_part_names_the_part(tmp_path):
    frame = input_frame(20)
    write_input(frame.iloc[:10], tmp_path / "parts" / "a.csv")
    write_input(frame.iloc[10:].drop(columns="gold"), tmp_path / "parts" / "b.csv")
    with pytest.raises(UserError, match=r"input.keep_columns: column `gold` is not in `.*b.csv`"):
        make_plan(parts_settings(tmp_path / "parts", keep_columns=("gold",)), 2, 32)


def test_jsonl_parts_are_typed_together(tmp_path):
    """A field only a later part carries is null in the earlier ones; int and float give float."""
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"id": "a", "text": "the cat", "score": 1}\n')
    (folder / "b.jsonl").write_text('{"id": "b", "text": "a dog", "score": 0.5, "note": "late"}\n')
    inp = parts_settings(folder, keep_columns=("score", "note"))
    plan = make_plan(inp, 2, 32)
    rows = pa.Table.from_batches([batch for pieces in plan.pieces for _, batch in iter_pieces(inp, pieces)])
    assert rows.column("score").to_pylist() == [1.0, 0.5] and rows.column("note").to_pylist() == [None, "late"]
    (folder / "c.jsonl").write_text('{"id": "c", "text": "a bird", "score": "high"}\n')
    with pytest.raises(UserError, match=r"input `.*c.jsonl`: column `score` holds string here and double in the "
                                        r"parts before it; give it one type"):
        make_plan(parts_settings(folder, keep_columns=("score",)), 2, 32)


@pytest.fixture
def planned(tmp_path):
    """A plan of three CSV parts (the proof's input checks come before any shard file is read)."""
    paths = write_parts(input_frame(1000), tmp_path / "parts", ".csv", cuts=(0, 137, 640, 1000))
    inp = parts_settings(tmp_path / "parts")
    run_plan(inp, 4, 32, str(tmp_path / "plan.json"))
    return read_plan(str(tmp_path / "plan.json")), inp, paths


def refused(plan, inp, message):
    with pytest.raises((UserError, ProofError), match=message) as caught:
        prove(plan, [f"{k}.parquet" for k in range(plan.shards)], inp, "digest")
    assert "\n" not in str(caught.value)


def test_a_part_added_after_planning_is_refused_naming_it(planned):
    plan, inp, paths = planned
    shutil.copy(paths[0], paths[0].with_name("part-00000a.csv"))
    refused(plan, inp, r"input `.*parts`: `.*part-00000a.csv` is not a part of the plan \(added or renamed since "
                       r"planning; 1 such file\(s\)\); rerun the plan")


def test_a_part_removed_after_planning_is_refused_naming_it(planned):
    plan, inp, paths = planned
    paths[1].unlink()
    refused(plan, inp, r"input `.*part-00001.csv` has disappeared since planning; rerun the plan")


def test_a_part_renamed_after_planning_is_refused(planned):
    plan, inp, paths = planned
    paths[2].rename(paths[2].with_name("part-00003.csv"))
    refused(plan, inp, r"`.*part-00003.csv` is not a part of the plan \(added or renamed")


def test_a_part_of_another_size_or_mtime_is_refused_naming_it(planned):
    plan, inp, paths = planned
    os.utime(paths[1], ns=(0, paths[1].stat().st_mtime_ns - 10**9))
    refused(plan, inp, r"input `.*part-00001.csv` changed since planning \(size/mtime .*\); rerun the plan")


def test_a_part_edited_with_its_size_and_mtime_kept_is_refused_by_its_digest(planned):
    plan, inp, paths = planned
    before = paths[2].stat()
    text = paths[2].read_text()
    paths[2].write_text(text.replace("row-700,", "row-799,", 1))
    os.utime(paths[2], ns=(before.st_atime_ns, before.st_mtime_ns))
    refused(plan, inp, r"^input `.*part-00002.csv` changed since planning: same size and mtime, other content "
                       r"\(sha256:\w+ -> sha256:\w+\); rerun the plan")


def test_a_damaged_parquet_part_is_caught_by_its_digest_though_its_row_count_is_metadata(tmp_path):
    paths = write_parts(input_frame(300), tmp_path / "parts", ".parquet", cuts=(0, 100, 300))
    inp = parts_settings(tmp_path / "parts")
    plan = make_plan(inp, 2, 32)
    before = paths[1].stat()
    flip_a_data_page_byte(paths[1], "id")
    os.utime(paths[1], ns=(before.st_atime_ns, before.st_mtime_ns))
    refused(plan, inp, r"^input `.*part-00001.parquet` changed since planning: same size and mtime, other content")


def test_the_triggers_follow_every_part(tmp_path):
    """The rule params: a part added or renamed replans; a part rewritten with its size and mtime reruns gather."""
    paths = write_parts(input_frame(100), tmp_path / "parts", ".csv", cuts=(0, 50, 100))
    files = resolve_input(str(tmp_path / "parts"))[1]
    plan, gather = plan_trigger(files), gather_trigger(files)
    assert plan["parts"] == gather["parts"] == 2
    paths[1].rename(paths[1].with_name("part-00009.csv"))
    assert plan_trigger(resolve_input(str(tmp_path / "parts"))[1]) != plan
    paths[1].with_name("part-00009.csv").rename(paths[1])
    stat = paths[0].stat()
    shutil.copy2(paths[0], tmp_path / "copy.csv")
    os.replace(tmp_path / "copy.csv", paths[0])
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert plan_trigger(files) == plan and gather_trigger(files) != gather
    write_input(input_frame(3), tmp_path / "parts" / "part-00002.csv")
    assert plan_trigger(resolve_input(str(tmp_path / "parts"))[1])["parts"] == 3


@pytest.mark.e2e
def test_a_directory_of_parts_runs_as_one_table_and_gather_proves_every_part(classify_runs, models,
                                                                                      tmp_path):
    """Three Parquet parts of a classify run's input in a directory (uneven; a shard spans a part
    boundary; Spark's markers beside them; row groups of 97 rows, staged with `input.stage: always`
    so that the shards read copies with groups cut at their boundaries) give the single-file run's
    table. Then a part edited with its size and mtime kept is refused at gather, naming it, and a
    part added makes the next run replan. (Globs and gzipped CSV/JSONL parts read as one file: the
    unit tests above; a gzipped input staged: the named inputs' `val`.)"""
    want = classify_runs(1000, 4)
    parquet = tmp_path / "parquet"
    paths = write_parts(want.frame, parquet / "data" / "parts", ".parquet", cuts=(0, 137, 640, 1000))
    for marker in ("_SUCCESS", ".part-00000.parquet.crc"):
        (parquet / "data" / "parts" / marker).write_text("")
    config = workflow_config("data/parts", models.classifier, shards=4)
    config["input"]["stage"] = "always"
    assert run_ok(parquet, config).equals(want.predictions)  # bit for bit: the same ranges and batches
    plan = json.loads((parquet / "results" / "plan.json").read_text())
    assert [part["path"] for part in plan["input"]["parts"]] == [f"data/parts/part-0000{k}.parquet" for k in range(3)]
    assert max(len(shard["pieces"]) for shard in plan["shards"]) == 2
    staged = [part["staged"] and part["staged"]["path"] for part in plan["input"]["parts"]]
    # part 0 lies in one shard; part 2's one shard boundary (row 737 = 640 + 97) is a row group's: read in place
    assert staged == [None, "results/staged/00001.parquet", None]

    before, original = paths[1].stat(), paths[1].read_bytes()
    flip_a_data_page_byte(paths[1], "id")
    os.utime(paths[1], ns=(before.st_atime_ns, before.st_mtime_ns))
    result = run_workflow(parquet, config)
    assert_refused(result, parquet, "input `data/parts/part-00001.parquet` changed since planning: same size and "
                                    "mtime, other content")
    assert "rule plan:" not in result.stderr and "rule infer:" not in result.stderr, result.stderr  # gather alone

    paths[1].write_bytes(original)
    write_input(input_frame(20, seed=5), parquet / "data" / "parts" / "part-00003.parquet")
    result = run_workflow(parquet, config, "--until", "plan", report=True)  # (--omit-from would confuse --until)
    assert result.returncode == 0, result.stderr[-3000:]
    replanned = json.loads((parquet / "results" / "plan.json").read_text())
    assert replanned["plan_id"] != plan["plan_id"]
    assert replanned["rows"] == 1020 and len(replanned["input"]["parts"]) == 4

    shutil.rmtree(parquet / "results" / "staged")  # deleted by hand: the shards' input, so the plan reruns
    result = run_workflow(parquet, config, "-n")
    assert result.returncode == 0 and re.search(r"^plan\s+1$", result.stdout, re.M), result.stdout[-3000:]


TREE = ("export/b/part-1.parquet", "export/a/part-2.parquet", "export/part-0.parquet", "export/_SUCCESS",
        "export/.part-0.parquet.crc", "export/README.md", "export/_temporary/0/part-9.parquet",
        "export/.hidden/part-8.parquet", "export/c/_d/part-7.parquet", "part-10.csv.gz", "part-02.csv",
        "part-01.csv", "_part-00.csv", "other.csv", "raw/part-0", "raw/part-1", "raw/_part-2")


def resolved_or_refused(path: str, fmt: str, listed: list[str] | None = None):
    try:
        return resolve_input(path, fmt, listed=listed)
    except UserError as error:
        return str(error)


@pytest.mark.parametrize("path, fmt", [
    ("export", "auto"), ("export/", "auto"), ("export/*.parquet", "auto"), ("export/**/part-*.parquet", "auto"),
    ("export/*", "auto"), ("*/a", "auto"), ("part-*.csv*", "auto"), ("**/part-0*.csv", "auto"),
    ("raw/part-*", "csv"), ("part-01.csv", "auto"), ("export/*/", "auto"),
])
def test_a_bucket_listing_gives_the_parts_the_filesystem_gives(tmp_path, monkeypatch, path, fmt):
    """Without a shared filesystem the parts are picked among the object names listed under the
    path's literal folder: the same parts, in the same order, as the same tree on disk gives."""
    from shardinfer.input.discovery import listing_root

    for name in TREE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    root = listing_root(path)
    listed = [name for name in TREE if name.startswith(f"{root}/") or not root]
    assert resolved_or_refused(path, fmt, listed) == resolved_or_refused(path, fmt)
    # a listing has no folders of its own: a folder with no objects below it is one object, and so is
    # a listing of the object itself (a tokenize job's, from the plan), whatever its name
    assert resolve_input("data/input.parquet", listed=[]) == ("parquet", ("data/input.parquet",))
    assert resolve_input("data/rows.txt", "csv", listed=["data/rows.txt"]) == ("csv", ("data/rows.txt",))


@pytest.mark.parametrize("path, listed, message", [
    ("export/x*.csv", ["export/a.parquet"], r"input.path `export/x\*.csv` matches no objects in the bucket"),
    ("export/", ["export/README.md", "export/_SUCCESS"], r"input.path `export/` is a folder in the bucket with no "
                                                         r"table files"),
    ("ds/", ["ds/state.json", "ds/data-00000-of-00001.arrow"], r"input.path `ds/` in the bucket holds `state.json`: "
                                                               r"a hf_dataset folder"),
])
def test_a_listing_that_gives_no_parts_is_refused_in_one_line(path, listed, message):
    with pytest.raises(UserError, match=message) as caught:
        resolve_input(path, listed=listed)
    assert "\n" not in str(caught.value)


def test_a_listing_is_of_object_names_as_snakemake_normalizes_them():
    """Snakemake normalizes every object's name (`./data/x` is `data/x`): so does the listing's root,
    and the parts are the objects' own names."""
    from shardinfer.input.discovery import listing_root

    assert listing_root("./export/") == "export" and listing_root("./export/*.parquet") == "export"
    names = ["export/a.parquet", "export/b/c.parquet"]
    assert resolve_input("./export/", listed=names) == ("parquet", tuple(names))
    assert resolve_input("./export//*.parquet", listed=names) == ("parquet", ("export/a.parquet",))
