"""The format contract, held over every registered format (`shardinfer.input.formats.all_formats`):
a format's module is covered here as it is, and no line of this file names one. Each format writes
the same table as a sample of several blocks (`Format.write`). Read through the plan as the shard
jobs read it, with one shard and with several, it gives the rows Parquet gives, row for row. The
last of several shards reads less than the whole file: counted both as read calls (/proc/self/io)
and as the file's pages brought into memory from a cold page cache (mincore), which sees what a
memory-mapped reader touches too. A format that can start a shard only at a file's first row must
say so (`Format.reads_from_start`), and then shards that would each read a part from its start
are refused."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import mmap
import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from factory import bytes_read, input_frame
from shardinfer.core.errors import UserError
from shardinfer.input import formats, staging
from shardinfer.input.discovery import resolve_input
from shardinfer.input.formats import all_formats
from shardinfer.input.formats.csv import Csv
from shardinfer.input.parts import iter_pieces
from shardinfer.plan.plan_file import make_plan
from shardinfer.settings.config import InputSettings

ROWS, BLOCK_ROWS, SHARDS = 30_000, 2_000, 6
TYPES = pa.schema([("id", pa.string()), ("gold", pa.int64()), ("text", pa.string())])
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="counts bytes with /proc/self/io and mincore")


def sample_table() -> pa.Table:
    """input_frame's rows (ids, integers, texts of 1 to 80 words), texts with the characters that
    text formats must quote or escape, and others than ASCII. No nulls: CSV cannot tell one from ""."""
    frame = input_frame(ROWS)
    frame.loc[::97, "text"] = frame["text"][::97] + ' "quoted", with a comma;\ta tab | a pipe\nand a line break'
    frame.loc[5::89, "text"] = frame["text"][5::89] + " – ünïcödé, 漢字 and \\ a backslash"
    return pa.Table.from_pandas(frame, preserve_index=False).cast(TYPES)


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, InputSettings]:
    """The sample table in every format, each as the input settings its run would get."""
    folder, table = tmp_path_factory.mktemp("formats"), sample_table()
    written = {}
    for fmt in all_formats().values():
        path = folder / f"sample{fmt.extensions[0] if fmt.extensions else '-' + fmt.name}"
        fmt.write(table, str(path), BLOCK_ROWS)
        written[fmt.name] = settings_of(path, fmt.name)
    return written


def settings_of(path: Path, fmt: str) -> InputSettings:
    found, parts = resolve_input(str(path), fmt)
    return InputSettings(path=str(path), format=found, parts=parts, text_column="text", keep_columns=("id", "gold"),
                         null_text="error")


def shard_tables(inp: InputSettings, shards: int) -> list[pa.Table]:
    """Each shard's rows, read through the plan as its job reads them, in Parquet's types."""
    plan = make_plan(inp, shards, 64)
    schema = plan.no_rows(inp).schema  # the read columns' types, as a shard writes them
    return [pa.Table.from_batches([b for _, b in iter_pieces(inp, pieces, plan.fields)], schema)
            .select(TYPES.names).cast(TYPES) for pieces in plan.pieces]


@pytest.fixture(scope="module")
def parquet_rows(samples) -> pa.Table:
    return pa.concat_tables(shard_tables(samples["parquet"], 1))


@pytest.mark.parametrize("shards", [1, SHARDS])
@pytest.mark.parametrize("name", list(all_formats()))
def test_every_format_reads_parquets_rows_row_for_row(samples, parquet_rows, name, shards):
    tables = shard_tables(samples[name], shards)
    assert len(tables) == shards and all(t.num_rows for t in tables)
    got = pa.concat_tables(tables)
    assert got.num_rows == ROWS
    for column in TYPES.names:
        assert got.column(column).to_pylist() == parquet_rows.column(column).to_pylist(), (name, column)


@pytest.mark.parametrize("name", [name for name, fmt in all_formats().items() if not fmt.reads_from_start])
def test_the_last_shard_reads_less_than_the_whole_file(samples, name):
    """Less than half of it: the last shard holds a sixth of the rows, and a format may start reading
    up to a block before them (text: 1 MiB)."""
    inp = samples[name]
    read, size = last_shard_reads(inp)
    assert read["calls"] < size / 2 and read["pages"] < size / 2, (name, read, size)


def last_shard_reads(inp: InputSettings) -> tuple[dict[str, int], int]:
    """What reading the last of SHARDS shards takes of the input's files, from a cold page cache:
    bytes through read calls, and the files' bytes brought into memory; and the files' size."""
    plan = make_plan(inp, SHARDS, 64)
    for part in inp.files:
        evicted(part)
    before = bytes_read()
    rows = sum(batch.num_rows for _, batch in iter_pieces(inp, plan.pieces[-1], plan.fields))
    assert rows == plan.ranges[-1][1] - plan.ranges[-1][0]
    read = {"calls": bytes_read() - before, "pages": sum(resident_bytes(part) for part in inp.files)}
    return read, sum(os.path.getsize(part) for part in inp.files)


LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
LIBC.mmap.restype, LIBC.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                           ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(path: str) -> int:
    """The file's bytes in the page cache (mincore over a mapping that touches none of them)."""
    size, fd = os.path.getsize(path), os.open(path, os.O_RDONLY)
    try:
        address = LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        pages = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
        assert LIBC.mincore(address, size, pages) == 0, os.strerror(ctypes.get_errno())
        LIBC.munmap(address, size)
    finally:
        os.close(fd)
    return sum(page & 1 for page in pages) * mmap.PAGESIZE


def evicted(path: str) -> None:
    """Drop the file's pages from the page cache (written out first), so that a read brings them back."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert resident_bytes(path) == 0, f"{path}: the page cache keeps its pages, so nothing read can be counted"


class FromStart(Csv):
    """CSV read as a format without positions and without an index: each shard from the first row."""
    name = "from_start"
    extensions = (".fromstart",)
    compressible = False
    staged_suffix = None  # no copy to offer
    reads_from_start = True

    def batches(self, inp, span=None, fields=None):
        for _, batch in super().batches(inp, None, fields):
            yield None, batch


@pytest.fixture
def from_start(monkeypatch, samples) -> InputSettings:
    """The sample as a file of FromStart, a format registered for this test alone."""
    monkeypatch.setattr(formats, "all_formats", lambda: {**all_formats(), "from_start": FromStart()})
    path = Path(samples["csv"].path).with_suffix(".fromstart")
    path.write_bytes(Path(samples["csv"].path).read_bytes())
    return dataclasses.replace(samples["csv"], path=str(path), parts=(str(path),), format="from_start")


def test_the_measure_sees_a_shard_that_reads_from_the_start(from_start, parquet_rows):
    """What the contract refuses is seen: the last shard of a format without positions reads it all."""
    read, size = last_shard_reads(from_start)
    assert read["calls"] >= size and read["pages"] >= size
    assert pa.concat_tables(shard_tables(from_start, SHARDS)).column("id").equals(parquet_rows.column("id"))


def test_shards_that_would_reread_a_part_from_its_start_are_refused_in_one_line(from_start, monkeypatch, caplog,
                                                                                  tmp_path):
    """Refused where staging would copy the part (`input.stage`: `always`, or `auto` for a part
    whose rereads cost 64 MiB or more: here any), read so with a warning where `never` says so."""
    monkeypatch.setattr(staging, "STAGE_MIN_BYTES", 0)
    for stage in ("always", "auto"):
        with pytest.raises(UserError, match=r"^input `.*sample.fromstart`: its 6 shards would read it 3.\d times over "
                                            r"in place \(from_start files are read only from their first row\), and "
                                            r"from_start parts are never staged; give fewer shards") as caught:
            make_plan(dataclasses.replace(from_start, stage=stage), SHARDS, 64, staged_dir=str(tmp_path))
        assert "\n" not in str(caught.value)
    with caplog.at_level(logging.WARNING):
        plan = make_plan(dataclasses.replace(from_start, stage="never"), SHARDS, 64, staged_dir=str(tmp_path))
    assert plan.rows == ROWS and "shards would read it 3." in caplog.text and "input.stage: never says" in caplog.text
    assert make_plan(from_start, 1, 64, staged_dir=str(tmp_path)).rows == ROWS  # one shard reads it once
