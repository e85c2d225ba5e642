"""Reading ranges: every format yields exactly rows [start, end), in order, streaming."""

import pyarrow as pa
import pytest

from factory import input_frame, write_input
from factory import input_settings as settings_for
from shardinfer.errors import UserError
from shardinfer.tables import count_rows, iter_range, scan_input, windows


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
@pytest.mark.parametrize("start,end", [(0, 300), (0, 1), (96, 98), (97, 194), (250, 300), (5, 5), (299, 300)])
def test_range_is_exact_in_every_format(tmp_path, suffix, start, end):
    frame = input_frame(300)
    path = write_input(frame, tmp_path / f"in{suffix}")  # parquet: row groups of 97 rows
    pieces = list(iter_range(settings_for(path), start, end))
    table = pa.Table.from_batches([batch for _, batch in pieces]) if pieces else None
    got = table.column("text").to_pylist() if table else []
    assert got == frame["text"].tolist()[start:end]
    offsets = [first for first, _ in pieces]
    assert offsets == sorted(offsets) and (not offsets or offsets[0] == start)
    if table:
        assert table.column("id").to_pylist() == frame["id"].tolist()[start:end]


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_count_rows(tmp_path, suffix):
    assert count_rows(settings_for(write_input(input_frame(123), tmp_path / f"in{suffix}"))) == 123


def test_missing_text_column_lists_the_columns(tmp_path):
    path = write_input(input_frame(3), tmp_path / "in.parquet")
    with pytest.raises(UserError, match=r"column `body` is not in .*; its columns are: id, gold, text"):
        scan_input(settings_for(path, text_column="body"))


def test_missing_keep_column_is_named(tmp_path):
    path = write_input(input_frame(3), tmp_path / "in.csv")
    with pytest.raises(UserError, match=r"input.keep_columns: column `label` is not in"):
        scan_input(settings_for(path, keep_columns=("label",)))


def test_non_string_text_is_refused(tmp_path):
    path = write_input(input_frame(3), tmp_path / "in.jsonl")
    with pytest.raises(UserError, match=r"input.text_column `gold` holds int64, not text"):
        scan_input(settings_for(path, text_column="gold", keep_columns=()))


def test_corrupt_parquet_is_one_line(tmp_path):
    path = tmp_path / "in.parquet"
    path.write_bytes(b"not a parquet file at all")
    with pytest.raises(UserError, match=r"cannot read it as parquet") as caught:
        scan_input(settings_for(path))
    assert "\n" not in str(caught.value)


def test_csv_columns_are_kept_as_written(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('zip,text\n02139,"a, quoted\nnewline"\nabc,plain\n')
    batch = next(iter_range(settings_for(path, keep_columns=("zip",)), 0, 2))[1]
    assert batch.column("zip").to_pylist() == ["02139", "abc"]
    assert batch.column("text").to_pylist() == ["a, quoted\nnewline", "plain"]


@pytest.mark.parametrize("first_size", [None, 1, 3, 50])
def test_windows_regroup_batches_contiguously_with_a_short_first_window(first_size):
    batches = [(10 + 7 * i, pa.record_batch({"x": list(range(10 + 7 * i, 17 + 7 * i))})) for i in range(6)]  # 42 rows
    got = list(windows(iter(batches), 10, first_size))
    sizes = [t.num_rows for _, t in got]
    want_first = min(first_size or 10, 42)
    assert sizes[0] == want_first and all(n == 10 for n in sizes[1:-1]) and sum(sizes) == 42
    assert [first for first, _ in got] == [10 + sum(sizes[:i]) for i in range(len(sizes))]
    assert [v for _, t in got for v in t.column("x").to_pylist()] == list(range(10, 52))
