"""Shard counts that cannot help are refused when the Snakefile loads, and a large count is told
what it costs; up to FEW_SHARDS, more shards than rows stay allowed (empty shards)."""

import gzip
import time

import pytest

from factory import input_frame, input_settings, run_workflow, workflow_config, write_input
from shardinfer.core.errors import UserError
from shardinfer.input.formats import text_blocks
from shardinfer.input.formats.text_blocks import lines
from shardinfer.input.shard_bound import FEW_SHARDS, check_shard_count, rows_at_most, shard_count_note
from shardinfer.settings.config import InputSettings


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_more_shards_than_rows_is_refused_naming_both_and_what_is_allowed(tmp_path, suffix):
    path = write_input(input_frame(13), tmp_path / f"in{suffix}")
    with pytest.raises(UserError, match=r"^config `shards` 100000 is more than the input's .*13.*: use at most 13$"):
        check_shard_count(input_settings(path), 100_000)
    check_shard_count(input_settings(path), 13)


def test_up_to_few_shards_more_than_rows_are_allowed_as_empty_shards(tmp_path):
    path = write_input(input_frame(5), tmp_path / "in.parquet")
    check_shard_count(input_settings(path), 8)
    check_shard_count(input_settings(path), FEW_SHARDS)
    with pytest.raises(UserError, match="use at most 5$"):
        check_shard_count(input_settings(path), FEW_SHARDS + 1)


def test_parts_are_counted_together(tmp_path):
    parts = [str(write_input(input_frame(700, seed=i), tmp_path / f"part-{i}.parquet")) for i in range(2)]
    inp = input_settings(tmp_path / "*.parquet", parts=tuple(parts))
    check_shard_count(inp, 1400)
    with pytest.raises(UserError, match="more than the input's 1400 rows"):
        check_shard_count(inp, 1401)


@pytest.mark.parametrize("data,want", [(b"h\na\nb\n", 3), (b"h\na\nb", 3), (b"h\r\na\r\nb\r\n", 3), (b"h\ra\rb\r", 3),
                                       (b"", 0), (b"\n", 1)])
def test_lines_end_at_any_line_break_and_count_a_last_line_without_one(tmp_path, data, want):
    (tmp_path / "f").write_bytes(data)
    assert lines(str(tmp_path / "f"), 100) == want


def test_counting_stops_once_the_shards_are_reached(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "x"}\n' * 10_000)
    monkeypatch.setattr(text_blocks, "LINE_CHUNK_BYTES", 1000)  # 71 lines and a part of one a chunk
    assert lines(str(path), 5) == 72  # one chunk read
    assert rows_at_most((str(path),), "jsonl", 100) == (143, False)  # two
    assert rows_at_most((str(path),), "jsonl", 20_000) == (10_000, False)


def test_compressed_text_is_not_counted(tmp_path):
    path = tmp_path / "in.csv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("id,text\n1,a\n")
    assert rows_at_most((str(path),), "csv", 100_000) is None
    check_shard_count(input_settings(path, format="csv"), 100_000)


def test_a_large_count_is_told_its_cost():
    assert shard_count_note(2000) is None
    note = shard_count_note(10_000)
    assert "\n" not in note and "10,000 shards" in note and "per 1,000 shards" in note and "loads the model" in note


@pytest.mark.e2e
def test_snakemake_refuses_a_huge_shard_count_at_once(models, tmp_path):
    path = write_input(input_frame(13), tmp_path / "data" / "input.parquet")
    started = time.monotonic()
    result = run_workflow(tmp_path, workflow_config(path, models.classifier, shards=100_000), "-n")
    shown = result.stdout + result.stderr
    assert result.returncode != 0 and time.monotonic() - started < 60
    assert f"ERROR: config `shards` 100000 is more than the input's 13 rows ({path}): use at most 13" in shown
    assert "Building DAG" not in shown


@pytest.mark.parametrize("name", ["in.csv.zst", "in.csv.bz2", "in.csv.gz", "in.csv.lz4", "in.csv.br", "in.data"])
def test_text_not_named_as_a_table_gives_no_bound(tmp_path, name):
    """Arrow decompresses by extension: newlines in the compressed bytes say nothing of the rows."""
    path = tmp_path / name
    path.write_bytes(b"\n" * 10)  # 10 newlines, whatever rows it may hold decompressed
    assert rows_at_most((str(path),), "csv", FEW_SHARDS + 1) is None
    inp = InputSettings(path=str(path), format="csv", text_column="text", keep_columns=(), null_text="error")
    check_shard_count(inp, FEW_SHARDS + 1)
