"""The formats added behind the one format interface (Arrow IPC files and streams, Feather, Hugging
Face `datasets` folders, TSV and other delimiters), each compared with the same rows as Parquet,
row for row: whole-file scans, every shard's range through the plan, and gather's row counts.
Plus the format lines a user gets for what no format reads."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pytest

from factory import input_frame, write_input
from shardinfer.core.errors import UserError
from shardinfer.input.discovery import resolve_input
from shardinfer.input.formats import all_formats, format_named, format_of, options_in, text_blocks
from shardinfer.input.parts import iter_pieces
from shardinfer.input.scan import count_rows
from shardinfer.input.shard_bound import check_shard_count
from shardinfer.input.staging import wants_staging
from shardinfer.plan.plan_file import make_plan, read_plan, run_plan
from shardinfer.settings.config import InputSettings

ROWS = 500


def frame_with_awkward_text(rows: int = ROWS) -> pd.DataFrame:
    """Texts with commas, tabs, quotes and line breaks in them, and a null."""
    frame = input_frame(rows)
    frame.loc[3, "text"] = 'a "quoted", comma\tand tab'
    frame.loc[4, "text"] = "two\nlines"
    frame.loc[5, "text"] = None
    return frame


def settings(path: Path | str, fmt: str | None = None, section: dict | None = None, **overrides):
    """Input settings of a file or folder, its format, parts and format options resolved as the
    Snakefile does; `section`: the input section's format keys (`{"csv": {"delimiter": ";"}}`, or
    today's flat `{"delimiter": ";"}`)."""
    section = {"path": str(path), **(section or {})}
    found, parts = resolve_input(str(path), fmt or "auto", section)
    values = {"path": str(path), "format": found, "parts": parts, "text_column": "text", "keep_columns": ("id", "gold"),
              "null_text": "empty", "options": options_in(section, format_named(found))}
    return InputSettings(**{**values, **overrides})


def shard_table(inp, shards: int) -> pa.Table:
    """Every shard's rows read through the plan, as a shard job reads them, concatenated in order."""
    plan = make_plan(inp, shards, 32)
    batches = [batch for pieces in plan.pieces for _, batch in iter_pieces(inp, pieces, plan.fields)]
    assert sum(b.num_rows for b in batches) == plan.rows
    return pa.Table.from_batches(batches).cast(pa.schema([("text", pa.string()), ("id", pa.string()),
                                                          ("gold", pa.int64())]))


def parquet_rows(frame: pd.DataFrame, tmp_path: Path, shards: int = 3) -> pa.Table:
    return shard_table(settings(write_input(frame, tmp_path / "same.parquet")), shards)


def write_ipc_stream(table: pa.Table, path: Path, batch_rows: int) -> Path:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    return path


@pytest.mark.parametrize("kind", ["arrow file", "feather", "arrow stream", "arrow stream of dictionaries"])
def test_arrow_ipc_reads_as_the_same_rows_as_parquet(tmp_path, kind):
    """An IPC stream of a dictionary column has its dictionaries in messages of their own: read from
    its start (its batches have no positions); the others from the batch that holds a shard's rows."""
    frame = frame_with_awkward_text()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if kind == "arrow stream of dictionaries":
        table = table.set_column(2, "text", table.column("text").dictionary_encode())
    if kind.startswith("arrow stream"):
        path = write_ipc_stream(table, tmp_path / "in.arrow", batch_rows=37)
    else:
        path = tmp_path / ("in.arrow" if kind == "arrow file" else "in.feather")
        compression = "uncompressed" if kind == "arrow file" else "lz4"
        feather.write_feather(table, str(path), chunksize=37, compression=compression)
    inp = settings(path)
    assert inp.format == "arrow"
    want = parquet_rows(frame, tmp_path)
    for shards in (1, 4, 9):  # ranges cut inside batches of 37 rows
        assert shard_table(inp, shards).equals(want)
    spans = [piece.span for pieces in make_plan(inp, 4, 32).pieces for piece in pieces]
    assert all(span is None for span in spans) if kind.endswith("dictionaries") else spans[-1].row > 0
    assert count_rows(inp) == ROWS and format_named("arrow").rows_at_most(str(path), 10) == (ROWS, True)
    assert not wants_staging(dataclasses.replace(inp, stage="always"), str(path), ROWS, 1 << 40, [(0, 250), (250, 500)])


def test_arrow_parts_of_other_types_are_read_in_one_type(tmp_path):
    """Two Arrow parts whose writers typed a column differently (int32 and int64) read as int64."""
    frame = input_frame(60)
    folder = tmp_path / "parts"
    folder.mkdir()
    first = pa.Table.from_pandas(frame.iloc[:20], preserve_index=False)
    first = first.set_column(first.schema.get_field_index("gold"), "gold", first.column("gold").cast(pa.int32()))
    feather.write_feather(first, str(folder / "part-0.arrow"))
    feather.write_feather(pa.Table.from_pandas(frame.iloc[20:], preserve_index=False), str(folder / "part-1.arrow"))
    inp = settings(folder)
    assert shard_table(inp, 3).equals(parquet_rows(frame, tmp_path))


def save_dataset(frame: pd.DataFrame, path: Path, shards: int):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    dataset = datasets.Dataset.from_pandas(frame, preserve_index=False)
    dataset.save_to_disk(str(path), num_shards=shards)
    return datasets


def test_a_datasets_folder_is_its_rows_in_the_datasets_order(tmp_path):
    """A shuffled and selected dataset saved in 3 files: the rows `load_from_disk` gives, in its
    order, the JSON files passed over; the same rows as Parquet."""
    frame = frame_with_awkward_text()
    shuffled = frame.sample(frac=1.0, random_state=0).iloc[:400].reset_index(drop=True)
    datasets = save_dataset(shuffled, tmp_path / "ds", shards=3)
    inp = settings(tmp_path / "ds")
    assert inp.format == "hf_dataset" and [Path(p).name for p in inp.files] == [
        f"data-0000{k}-of-00003.arrow" for k in range(3)]
    assert datasets.load_from_disk(str(tmp_path / "ds"))["id"] == shuffled["id"].tolist()
    assert shard_table(inp, 4).equals(parquet_rows(shuffled, tmp_path, shards=2))


def test_a_dataset_dict_needs_a_split_and_never_joins_them(tmp_path):
    pytest.importorskip("datasets")
    import datasets

    datasets.disable_progress_bars()
    frame = input_frame(90)
    splits = {"train": frame.iloc[:60], "test": frame.iloc[60:]}
    datasets.DatasetDict({name: datasets.Dataset.from_pandas(part, preserve_index=False)
                          for name, part in splits.items()}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UserError, match=r"^input.path `.*dd` is a DatasetDict with splits train, test; set "
                                        r"input.split to one of them, or run each as a named input") as caught:
        settings(tmp_path / "dd")
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match=r"input.split `val` is not one of them"):
        settings(tmp_path / "dd", section={"split": "val"})
    test = settings(tmp_path / "dd", section={"split": "test"})
    assert shard_table(test, 2).equals(parquet_rows(splits["test"], tmp_path))
    assert settings(tmp_path / "dd", section={"hf_dataset": {"split": "test"}}) == test
    with pytest.raises(UserError, match=r"^input.split is for hf_dataset; input `.*plain.parquet` is parquet, so "
                                        r"leave it out$"):
        settings(write_input(frame, tmp_path / "plain.parquet"), section={"split": "test"})


@pytest.mark.parametrize("suffix, delimiter", [(".tsv", None), (".csv", ";"), (".csv", "|"), (".tsv.gz", None)])
def test_delimited_text_reads_as_the_same_rows_as_parquet(tmp_path, monkeypatch, suffix, delimiter):
    """A value holding the other separators, quotes and a line break stays one value, from any
    block (small blocks: many marks, so shards start inside the file)."""
    monkeypatch.setattr(text_blocks, "BLOCK_BYTES", 512)
    frame = frame_with_awkward_text()
    separator = delimiter or "\t"
    path = tmp_path / f"in{suffix}"
    options = pacsv.WriteOptions(delimiter=separator, quoting_style="needed")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    with pa.CompressedOutputStream(str(path), "gzip") if suffix.endswith(".gz") else pa.OSFile(str(path), "wb") as sink:
        pacsv.write_csv(table, sink, options)
    inp = settings(path, section={"csv": {"delimiter": delimiter}})
    assert inp.format == ("tsv" if suffix.startswith(".tsv") else "csv")
    texts = frame["text"].fillna("").tolist()
    got = shard_table(inp, 7)
    assert got.column("text").to_pylist() == texts
    assert got.column("id").equals(parquet_rows(frame, tmp_path).column("id"))


def test_a_tsv_read_as_csv_is_one_column_and_says_so(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("id\ttext\tgold\nrow-0\thello\t1\n")
    with pytest.raises(UserError, match=r"input.text_column: column `text` is not in .*; its columns are: id\ttext"):
        make_plan(settings(path, "csv"), 1, 32)
    assert shard_table(settings(path, "tsv"), 1).column("text").to_pylist() == ["hello"]


@pytest.mark.parametrize("delimiter", ['"', "\n", "ab"])
@pytest.mark.parametrize("nested", [True, False])
def test_a_delimiter_that_cannot_separate_is_refused_naming_its_key(tmp_path, delimiter, nested):
    path = write_input(input_frame(5), tmp_path / "in.csv")
    key, section = ("input.csv.delimiter", {"csv": {"delimiter": delimiter}}) if nested else (
        "input.delimiter", {"delimiter": delimiter})
    with pytest.raises(UserError, match=rf"^{key} .* is not allowed: one character other than a quote"):
        settings(path, section=section)


def test_one_delimiter_in_both_spellings_is_one_option_and_two_are_refused(tmp_path):
    path = write_input(input_frame(5), tmp_path / "in.csv")
    assert settings(path, section={"delimiter": ";", "csv": {"delimiter": ";"}}).options == {"delimiter": ";"}
    with pytest.raises(UserError, match=r"^input.csv.delimiter ';' and input.delimiter '\|' differ; give one"):
        settings(path, section={"delimiter": "|", "csv": {"delimiter": ";"}})


@pytest.mark.parametrize("section, key", [({"delimiter": ";"}, "input.delimiter"),
                                          ({"csv": {"delimiter": ";"}}, "input.csv.delimiter")])
def test_a_delimiter_for_a_typed_format_is_refused(tmp_path, section, key):
    path = write_input(input_frame(5), tmp_path / "in.parquet")
    with pytest.raises(UserError, match=rf"^{key} is for csv, tsv; input `.*` is parquet, so leave it out$"):
        settings(path, section=section)


def test_a_compressed_binary_format_is_an_unknown_type(tmp_path):
    """`x.parquet.gz` names no format (only text formats are read through a decompressor)."""
    path = tmp_path / "x.parquet.gz"
    path.write_bytes(b"\x1f\x8b")
    assert format_of(str(path)) is None and format_of("x.csv.gz").name == "csv" and format_of("x.arrow.zst") is None
    with pytest.raises(UserError, match=r"^input `.*x.parquet.gz`: unknown file type; allowed extensions: .*\.parquet"):
        resolve_input(str(path))


def test_a_feather_v1_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "old.feather"
    with pytest.warns(DeprecationWarning):
        feather.write_feather(pa.table({"text": ["a"], "id": ["0"], "gold": [1]}), str(path), version=1)
    with pytest.raises(UserError, match=r"^input `.*old.feather` is a Feather V1 file, which is not read"):
        make_plan(settings(path), 1, 32)


def test_an_unknown_format_name_is_refused_naming_those_there_are(tmp_path):
    path = write_input(input_frame(5), tmp_path / "in.csv")
    with pytest.raises(UserError, match=r"^input.format `excel` is not a format; allowed: auto, ") as caught:
        resolve_input(str(path), "excel")
    assert all(name in str(caught.value) for name in all_formats())


def test_a_corrupt_parquet_part_with_many_shards_is_one_line(tmp_path):
    """The shard-count bound reads footers when the Snakefile loads: a broken one is named."""
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 not really")
    inp = settings(path)
    with pytest.raises(UserError, match=r"^input `.*broken.parquet`: cannot read it as parquet: ") as caught:
        check_shard_count(inp, 5000)
    assert "\n" not in str(caught.value)


def test_every_format_is_found_by_its_extensions_alone():
    """The registry is the format modules: each extension names the format that declares it."""
    for fmt in all_formats().values():
        for suffix in fmt.extensions:
            assert format_of(f"data/part-0{suffix}") is fmt
            assert (format_of(f"data/part-0{suffix}.gz") is fmt) == fmt.compressible


def test_a_dataset_dict_split_is_planned_and_checked_again_as_that_split(tmp_path):
    """The plan records the split, so that shard jobs and gather resolve the same parts again (a
    DatasetDict folder without its split is no input); a data file added to the split's state
    after planning is refused, naming it."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    frame = input_frame(90)
    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame.iloc[:60], preserve_index=False),
                          "test": datasets.Dataset.from_pandas(frame.iloc[60:], preserve_index=False)}
                         ).save_to_disk(str(tmp_path / "dd"))
    inp = settings(tmp_path / "dd", section={"split": "test"})
    run_plan(inp, 2, 32, str(tmp_path / "plan.json"))
    plan = read_plan(str(tmp_path / "plan.json"))
    assert plan.options == {"hf_dataset": {"split": "test"}} and plan.rows == 30
    plan.check_input_unchanged()
    state = tmp_path / "dd" / "test" / "state.json"
    extra = tmp_path / "dd" / "test" / "data-00001-of-00002.arrow"
    shutil.copy(plan.parts[0].path, extra)
    listed = json.loads(state.read_text())
    listed["_data_files"].append({"filename": extra.name})
    state.write_text(json.dumps(listed))
    with pytest.raises(UserError, match=r"data-00001-of-00002.arrow` is not a part of the plan"):
        plan.check_input_unchanged()


def configured(section: dict) -> InputSettings:
    """The input settings of a config whose `input` is `section`, validated and built as the Snakefile does."""
    from snakemake.utils import validate

    from shardinfer.settings.schema import SCHEMA_PATH
    from shardinfer.snakefile.configure import settings_by_input

    config = {"input": section, "model": {}, "shards": 1}
    validate(config, str(SCHEMA_PATH))
    return settings_by_input(config)[None].input


# An input's rule params as before format options had sections (the keys of `plan_input`, in order).
PARAM_KEYS = ["path", "format", "text_column", "keep_columns", "null_text", "columns", "parts", "stage", "delimiter",
              "split", "task_columns", "column_keys", "text_columns"]


def test_a_format_option_in_either_spelling_gives_the_rule_params_of_before(tmp_path):
    """`input.csv.delimiter` and `input.delimiter` give one set of rule params, as Snakemake compares
    them (their repr), with the keys of before: moving a key to its section reruns no job."""
    path = str(write_input(input_frame(5), tmp_path / "in.csv"))
    flat, nested = configured({"path": path, "delimiter": ";"}), configured({"path": path, "csv": {"delimiter": ";"}})
    assert flat == nested and flat.options == {"delimiter": ";"}
    assert repr(flat.to_dict()) == repr(nested.to_dict())
    assert list(flat.to_dict()) == PARAM_KEYS and flat.to_dict()["delimiter"] == ";"
    assert list(configured({"path": path}).to_dict()) == PARAM_KEYS
    assert type(flat).from_dict(flat.to_dict()) == flat


def test_an_option_beyond_the_flat_ones_travels_under_options(tmp_path):
    """A format's option that never was a key of `input` is in the rule params only when set."""
    inp = InputSettings(path="x.arrow", format="arrow", text_column="text", keep_columns=(), null_text="error",
                        options={"delimiter": "|", "stripes": 4})
    data = inp.to_dict()
    assert list(data) == [*PARAM_KEYS[:10], "options", *PARAM_KEYS[10:]] and data["options"] == {"stripes": 4}
    assert InputSettings.from_dict(data) == inp


def test_another_formats_options_are_refused_in_one_line_and_empty_sections_pass(tmp_path):
    path = str(write_input(input_frame(5), tmp_path / "in.jsonl"))
    with pytest.raises(UserError, match=r"^input.csv.delimiter is for csv, tsv; input `.*in.jsonl` is jsonl, so leave "
                                        r"it out$"):
        configured({"path": path, "csv": {"delimiter": ";"}})
    assert configured({"path": path, "csv": {}, "hf_dataset": {"split": None}}).options == {}
