"""Reading ranges: every format yields exactly rows [start, end), in order, streaming."""

from pathlib import Path

import pyarrow as pa
import pytest

from factory import input_frame, write_input
from factory import input_settings as settings_for
from shardinfer.core.errors import UserError
from shardinfer.input.formats import format_named
from shardinfer.input.formats import text_blocks as tables
from shardinfer.input.parts import windows
from shardinfer.input.scan import count_rows, scan_input


def iter_range(inp, start, end, span=None):
    """One file's rows [start, end), as a shard reads them (from the plan's span, if given)."""
    return format_named(inp.format).read_range(inp, start, end, span)


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


# JSONL of any size reads as a 40-line one does: Arrow types a JSONL file from its first block
# (tables.BLOCK_BYTES) and numbers rows within a block, so these use a file of several blocks.

BIG_ROWS = 60_000  # about 11 MB: eleven blocks
LATE_FROM = 30_000  # `source` first appears here, past the first block


def big_row(i: int) -> str:
    source = f', "source": "src-{i}"' if i >= LATE_FROM and i % 3 == 0 else ""
    return f'{{"id": {i}, "text": "row {i} {words_of(i)}"{source}}}'


def words_of(i: int) -> str:  # rows of varied length, cheap to make
    return "the cat sat on a mat " * (4 + i % 7)


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    path.write_text("\n".join(big_row(i) for i in range(BIG_ROWS)) + "\n")
    assert path.stat().st_size > 10_000_000
    assert path.read_bytes().find(b'"source"') > tables.BLOCK_BYTES  # first seen after the first block
    return path


def test_jsonl_field_first_seen_after_the_first_block_is_read_in_every_row(big_jsonl):
    table = pa.Table.from_batches([b for _, b in iter_range(settings_for(big_jsonl, keep_columns=("id", "source")),
                                                            0, BIG_ROWS)])
    want = [f"src-{i}" if i >= LATE_FROM and i % 3 == 0 else None for i in range(BIG_ROWS)]
    assert table.column("source").to_pylist() == want
    assert table.column("id").to_pylist() == list(range(BIG_ROWS))
    assert scan_input(settings_for(big_jsonl, keep_columns=("source",))).rows == BIG_ROWS


def first_block_rows(path) -> int:
    with open(path, "rb") as handle:
        return handle.read(tables.BLOCK_BYTES).count(b"\n")


@pytest.mark.parametrize("where", ["across", "at", "after", "to the end"])
def test_jsonl_ranges_across_block_boundaries_are_exact(big_jsonl, where):
    cut = first_block_rows(big_jsonl)  # rows [0, cut) are the first block
    start, end = {"across": (cut - 3, cut + 3), "at": (cut, cut + 1), "after": (cut + 1, 2 * cut + 2),
                  "to the end": (BIG_ROWS - 5, BIG_ROWS)}[where]
    pieces = list(iter_range(settings_for(big_jsonl, keep_columns=("id",)), start, end))
    assert pieces[0][0] == start
    table = pa.Table.from_batches([b for _, b in pieces])
    assert table.column("id").to_pylist() == list(range(start, end))
    assert table.column("text").to_pylist() == [f"row {i} {words_of(i)}" for i in range(start, end)]


@pytest.mark.parametrize("rows", [40, BIG_ROWS])
def test_jsonl_parse_error_names_the_files_own_line(tmp_path, rows):
    lines = [big_row(i) for i in range(rows)]
    lines[rows - 7] = '{"id": 1, "text": "a trailing comma",}'
    lines.insert(2, "")  # a blank line: Arrow skips it when it counts rows, the file's lines do not
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as caught:
        scan_input(settings_for(path))
    message = str(caught.value)
    assert f"cannot read it as jsonl: line {rows - 5}: JSON parse error: Missing a name" in message, message
    assert "\n" not in message and "row" not in message


def test_jsonl_keep_column_in_no_row_lists_the_columns_of_every_row(big_jsonl):
    with pytest.raises(UserError, match=r"column `label` is not in .*; its columns are: id, text, source$"):
        scan_input(settings_for(big_jsonl, keep_columns=("label",)))


def test_jsonl_column_of_two_types_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "BLOCK_BYTES", 8)  # a block per line: the second type is in a later block
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(f'{{"id": {i}, "text": "t"}}\n' for i in range(10)) + '{"id": "x", "text": "t"}\n')
    with pytest.raises(UserError,
                       match=r"column `id` holds int64 before line 11 and string from there on; give it one type"):
        scan_input(settings_for(path))


def test_jsonl_dates_then_other_strings_in_a_later_block_are_text(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "BLOCK_BYTES", 8)  # Arrow types the first blocks' dates as timestamps
    path = tmp_path / "dates.jsonl"
    path.write_text('{"when": "2020-01-01", "text": "a"}\n{"when": "soon", "text": "b"}\n{"text": "c"}\n')
    batches = [b for _, b in iter_range(settings_for(path, keep_columns=("when",)), 0, 3)]
    assert pa.Table.from_batches(batches).column("when").to_pylist() == ["2020-01-01", "soon", None]


def test_gzipped_jsonl_reads_a_late_field_too(tmp_path, monkeypatch):
    import gzip

    monkeypatch.setattr(tables, "BLOCK_BYTES", 100)  # many blocks
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress("".join(big_row(LATE_FROM - 20 + i) + "\n" for i in range(40)).encode()))
    table = pa.Table.from_batches([b for _, b in iter_range(settings_for(path, keep_columns=("source",)), 0, 40)])
    assert table.column("source").to_pylist() == [f"src-{i}" if i >= LATE_FROM and i % 3 == 0 else None
                                                  for i in range(LATE_FROM - 20, LATE_FROM + 20)]


@pytest.mark.parametrize("keep,named", [(("id",), "id"), ((), "text")])
def test_duplicate_csv_column_is_refused_naming_it(tmp_path, keep, named):
    path = tmp_path / "in.csv"
    path.write_text("id,text,id,text\n1,a,2,b\n" if named == "text" else "id,text,id\n1,a,2\n")
    with pytest.raises(UserError, match=rf"has 2 columns named `{named}`; rename them") as caught:
        scan_input(settings_for(path, keep_columns=keep))
    assert "\n" not in str(caught.value)


def test_duplicate_parquet_column_is_refused_naming_it(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table([pa.array([1]), pa.array(["a"]), pa.array([2])], names=["id", "text", "id"]), path)
    with pytest.raises(UserError, match=r"input.keep_columns: .* has 2 columns named `id`"):
        scan_input(settings_for(path, keep_columns=("id",)))


def test_text_column_kept_reads_twice_in_place(tmp_path):
    frame = input_frame(5)
    path = write_input(frame, tmp_path / "in.jsonl")
    batch = next(iter_range(settings_for(path, keep_columns=("id", "text")), 1, 4))[1]
    assert batch.schema.names == ["text", "id", "text"]
    assert batch.column(2).to_pylist() == batch.column(0).to_pylist() == frame["text"].tolist()[1:4]


# Reading from the middle: the plan's scan marks where each block of rows starts (row, line,
# byte); a shard seeks to the mark at or before its range and parses from there. Small blocks
# (tables.BLOCK_BYTES) give many marks in a small file.

AWKWARD_CSV = (
    'id,text\r\n'
    '0,"line one\nline two"\n'  # a quoted newline
    '1,"say ""hi""\r\nthen, ""bye"""\r\n'  # doubled quotes, a quoted \r\n and comma
    '2,12" pizza\n'  # a quote inside an unquoted value is a character: quotes no longer pair up
    '3,"after it\na quoted newline"\n'
    '4,"ab"c"d\n'  # a quote after a closing quote is a character too
    '\n'  # a blank line is no row
    '5,""\n'
    '6,"\n\n\n"\n'
    '7,plain'  # no newline at the end
)


def full_csv_read(path) -> list[str]:
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(newlines_in_values=True),
                           convert_options=pacsv.ConvertOptions(column_types={"id": pa.string(), "text": pa.string()}))
    return table.column("text").to_pylist()


def rows_from_each_mark(path, settings, rows) -> None:
    """From every mark the scan made, the rest of the file reads exactly as the full read does."""
    scan = scan_input(settings)
    assert scan.rows == len(rows) and scan.marks[0].row == 0 and len(scan.marks) > 1
    for span in scan.spans([(mark.row, len(rows)) for mark in scan.marks]):
        pieces = list(iter_range(settings, span.row, len(rows), span))
        assert pieces[0][0] == span.row
        assert [t for _, b in pieces for t in b.column("text").to_pylist()] == rows[span.row:]


@pytest.mark.parametrize("block_bytes", range(4, 40))
def test_csv_read_from_any_mark_equals_the_full_read(tmp_path, monkeypatch, block_bytes):
    """Each block size puts the end of a read somewhere else: inside quoted newlines, between the
    two halves of a \\r\\n, on a doubled quote, on the stray quotes."""
    monkeypatch.setattr(tables, "BLOCK_BYTES", block_bytes)
    path = tmp_path / "awkward.csv"
    path.write_bytes(AWKWARD_CSV.encode())
    rows = full_csv_read(path)
    assert rows == ["line one\nline two", 'say "hi"\r\nthen, "bye"', '12" pizza', "after it\na quoted newline",
                    'abc"d', "", "\n\n\n", "plain"]
    rows_from_each_mark(path, settings_for(path), rows)


def test_csv_quoted_newline_where_a_block_read_ends_stays_in_its_value(tmp_path, monkeypatch):
    path = tmp_path / "in.csv"
    path.write_text('id,text\n0,"line one\nline two"\n1,after\n')
    monkeypatch.setattr(tables, "BLOCK_BYTES", len('0,"line one\n'))  # the first read ends on the quoted newline
    scan = scan_input(settings_for(path))
    assert scan.rows == 2 and [m.row for m in scan.marks] == [0, 1]
    rows_from_each_mark(path, settings_for(path), ["line one\nline two", "after"])


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".jsonl.gz", ".csv.gz"])
def test_every_range_read_from_its_span_equals_the_full_read(tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(tables, "BLOCK_BYTES", 512)
    frame = input_frame(600)
    frame.loc[::7, "text"] = frame["text"][::7] + '\nwith "a quoted" newline, and a comma'
    path = tmp_path / f"in{suffix}"
    write_input(frame, tmp_path / f"in{suffix.removesuffix('.gz')}")
    if suffix.endswith(".gz"):
        import gzip

        path.write_bytes(gzip.compress((tmp_path / f"in{suffix.removesuffix('.gz')}").read_bytes()))
    settings = settings_for(path)
    scan = scan_input(settings)
    assert scan.rows == 600 and len(scan.marks) > 20
    ranges = [(0, 1), (1, 97), (97, 98), (250, 420), (421, 599), (599, 600), (300, 300)]
    for (start, end), span in zip(ranges, scan.spans(ranges)):
        assert span.row <= start
        batches = [batch for _, batch in iter_range(settings, start, end, span)]
        for column in ("text", "id"):
            assert [v for b in batches for v in b.column(column).to_pylist()] == frame[column].tolist()[start:end]


def test_jsonl_error_read_from_a_span_names_the_files_own_line(tmp_path, monkeypatch):
    """The span carries the file's line number where it starts; blank lines before it count too."""
    monkeypatch.setattr(tables, "BLOCK_BYTES", 256)
    lines = [big_row(i) for i in range(300)]
    lines[3:3] = ["", "  "]  # blank lines: no rows, but lines
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    settings = settings_for(path)
    span = scan_input(settings).spans([(250, 300)])[0]
    assert span.row > 100 and span.fields is not None
    bad = lines[260].replace('"text": ', '"text"; ')  # same length: the plan's offsets still hold
    path.write_text("\n".join([*lines[:260], bad, *lines[261:]]) + "\n")
    with pytest.raises(UserError, match=r"cannot read it as jsonl: line 261: JSON parse error"):
        list(iter_range(settings, 250, 300, span))


def test_custom_task_columns_are_counted_not_measured(tmp_path):
    path = write_input(input_frame(30), tmp_path / "in.csv")
    scan = scan_input(settings_for(path, columns=("id", "gold"), keep_columns=()))
    assert scan.rows == 30 and scan.null_texts == 0 and scan.chars.tolist() == [0] * 30
    with pytest.raises(UserError, match=r"input.columns: column `title` is not in .*; its columns are: id, gold, text"):
        scan_input(settings_for(path, columns=("id", "title")))


def test_custom_task_columns_of_any_type_in_parquet_and_jsonl(tmp_path):
    for suffix in (".parquet", ".jsonl"):
        path = write_input(input_frame(30), tmp_path / f"in{suffix}")
        scan = scan_input(settings_for(path, columns=("gold",), keep_columns=("id",)))  # gold holds integers
        assert scan.rows == 30 and not scan.chars.any()


def test_a_span_that_starts_after_the_range_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "BLOCK_BYTES", 64)
    path = write_input(input_frame(50), tmp_path / "in.csv")
    span = scan_input(settings_for(path)).spans([(40, 50)])[0]
    with pytest.raises(ValueError, match="after the range's first row"):
        list(iter_range(settings_for(path), span.row - 1, 50, span))


def test_a_value_longer_than_many_blocks_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "BLOCK_BYTES", 16)
    long = "x, \"y\"\n" * 500
    path = tmp_path / "in.csv"
    path.write_text('id,text\n0,short\n1,"' + long.replace('"', '""') + '"\n2,after\n')
    rows_from_each_mark(path, settings_for(path), ["short", long, "after"])


@pytest.mark.parametrize("block_bytes", [1 << 20, 4])
def test_csv_last_record_of_spaces_without_a_newline_is_a_row(tmp_path, monkeypatch, block_bytes):
    """Arrow reads a line of spaces as a row; only line breaks are no row."""
    import pyarrow.csv as pacsv

    monkeypatch.setattr(tables, "BLOCK_BYTES", block_bytes)
    path = tmp_path / "in.csv"
    path.write_bytes(b"text\na\n   ")
    settings = settings_for(path, keep_columns=())
    expected = pacsv.read_csv(path).column("text").to_pylist()
    assert len(expected) == 2 and scan_input(settings).rows == 2 and count_rows(settings) == 2
    assert [t for _, b in iter_range(settings, 0, 2) for t in b.column("text").to_pylist()] == expected


def test_a_map_keep_column_is_kept_and_proven_and_a_union_is_refused_at_the_plan(tmp_path):
    import pyarrow.parquet as pq

    from shardinfer.contract.content_digest import table_digest

    frame = input_frame(30)
    maps = pa.array([[("k", i), ("j", -i)] if i % 3 else None for i in range(30)], pa.map_(pa.string(), pa.int64()))
    table = pa.Table.from_pandas(frame, preserve_index=False).append_column("counts", maps)
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    inp = settings_for(path, keep_columns=("id", "counts"))
    assert scan_input(inp).rows == 30
    read = pa.Table.from_batches([batch for _, batch in iter_range(inp, 7, 23)])
    assert read.column("counts").to_pylist() == maps.to_pylist()[7:23]
    # the digest of windows as a shard writes them equals the digest of the file read back whole
    pq.write_table(read, tmp_path / "shard.parquet")
    assert table_digest(read.slice(0, 16)) == table_digest(pq.read_table(tmp_path / "shard.parquet"))
    assert table_digest(read.slice(1)) != table_digest(read.slice(0, 15))

    union = pa.UnionArray.from_sparse(pa.array([0, 1] * 15, pa.int8()), [pa.array(range(30)), pa.array(["x"] * 30)])
    import pyarrow.feather as feather

    feather.write_feather(pa.Table.from_pandas(frame, preserve_index=False).append_column("either", union),
                          tmp_path / "in.arrow")
    with pytest.raises(UserError, match=r"input.keep_columns: `either` holds sparse_union<.*> in `.*in.arrow`, "
                                        r"which a shard table cannot hold and prove; allowed: numbers"):
        scan_input(settings_for(tmp_path / "in.arrow", keep_columns=("id", "either")))


def test_csv_keep_columns_are_the_strings_written_as_the_docs_say(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,text,zip\n7,a cat,02139\n8,a dog,10001\n")
    batch = next(iter_range(settings_for(path, keep_columns=("id", "zip")), 0, 2))[1]
    assert [batch.schema.field(c).type for c in ("id", "zip")] == [pa.string(), pa.string()]
    assert batch.column("zip").to_pylist() == ["02139", "10001"] and batch.column("id").to_pylist() == ["7", "8"]
    outputs = (Path(__file__).resolve().parents[1] / "docs" / "outputs.md").read_text()
    assert "CSV and TSV hold no types, so their columns are kept as strings exactly as written" in outputs
