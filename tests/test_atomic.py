"""A shard file appears complete or not at all: a failed write or a kill at any point leaves
nothing under the final name, and never replaces a good file with a broken one."""

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory import python_env
from shardinfer.atomic import atomic_parquet_writer, partial_path
from shardinfer.contract.row_files import staging_folder
from shardinfer.errors import UserError
from shardinfer.shard.row_files import staged_files

SCHEMA = pa.schema([("index", pa.int64())])
KILLER = """
import os, signal
import pyarrow as pa
from shardinfer import atomic
point = {point!r}
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if point == "rename":
    atomic.os.replace = die
with atomic.atomic_parquet_writer({path!r}, pa.schema([("index", pa.int64())])) as writer:
    if point == "before-first-write":
        die()
    writer.write_table(pa.table({{"index": list(range(1000))}}))
    if point == "mid-write":
        die()
    writer.write_table(pa.table({{"index": list(range(1000, 2000))}}))
"""


@pytest.mark.parametrize("point", ["before-first-write", "mid-write", "rename"])
def test_a_kill_at_any_point_leaves_no_complete_looking_file(tmp_path, point):
    path = tmp_path / "3.parquet"
    code = KILLER.format(point=point, path=str(path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, env=python_env())
    assert result.returncode == -signal.SIGKILL
    assert not path.exists()
    assert partial_path(path).exists()  # the leftover's name says it is partial; the rerun replaces it


def test_a_successful_write_is_complete(tmp_path):
    path = tmp_path / "1.parquet"
    with atomic_parquet_writer(path, SCHEMA) as writer:
        writer.write_table(pa.table({"index": [1, 2]}))
    assert pq.read_table(path).column("index").to_pylist() == [1, 2]
    assert not partial_path(path).exists()


def test_a_shard_commits_its_table_closed_then_its_files_folder_then_the_table(tmp_path, monkeypatch):
    """The files folder takes its name only after the table is complete on disk, and just before the
    table takes its own: a failed footer write never leaves a new folder without its table."""
    table, files = tmp_path / "shards" / "1.parquet", tmp_path / "files" / "1"
    renames, real_replace = [], os.replace

    def recorded(src, dst):
        if Path(dst) == files:
            assert pq.read_metadata(partial_path(table)).num_rows == 2  # closed: its footer is written
            assert not table.exists()
        renames.append(Path(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recorded)
    with staged_files(str(files), {"blob": ".bin"}) as staged, \
            atomic_parquet_writer(table, SCHEMA, staged.commit) as writer:
        staged.write("blob", [b"a", b"b"], np.arange(2))
        writer.write_table(pa.table({"index": [0, 1]}))
    assert renames == [files, table]
    assert sorted(p.name for p in files.iterdir()) == ["000000000.bin", "000000001.bin"]


@pytest.mark.parametrize("fail", ["footer", "table rename"])
def test_a_failed_close_or_table_rename_leaves_neither_table_nor_files_folder(tmp_path, monkeypatch, fail):
    table, files = tmp_path / "shards" / "1.parquet", tmp_path / "files" / "1"
    real_close, real_replace = pq.ParquetWriter.close, os.replace

    def close(self):
        real_close(self)
        raise OSError(errno.ENOSPC, "disk full")

    def replace(src, dst):
        if Path(dst) == table:
            raise OSError(errno.ENOSPC, "disk full")
        real_replace(src, dst)

    if fail == "footer":
        monkeypatch.setattr(pq.ParquetWriter, "close", close)
    else:
        monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(UserError, match=f"no space left on the device while writing `{table}`"):
        with staged_files(str(files), {"blob": ".bin"}) as staged, \
                atomic_parquet_writer(table, SCHEMA, staged.commit) as writer:
            staged.write("blob", [b"a"], np.arange(1))
            writer.write_table(pa.table({"index": [0]}))
    assert not table.exists() and not files.exists()
    # the files stay in staging, where a rerun proves them against its committed windows or removes them
    assert [p.name for p in staging_folder(files).iterdir()] == ["000000000.bin"]


def test_a_full_disk_is_one_line_naming_the_file_leaves_nothing_and_keeps_the_old_file(tmp_path):
    # the partial file and a staged per-row file are links to /dev/full: the kernel's own ENOSPC
    target = tmp_path / "shards" / "0.parquet"
    target.parent.mkdir()
    pq.write_table(pa.table({"index": [7]}), target)
    partial_path(target).symlink_to("/dev/full")
    with pytest.raises(UserError, match=rf"no space left on the device while writing `{target}`; free space") as caught:
        with atomic_parquet_writer(target, SCHEMA) as writer:
            writer.write_table(pa.table({"index": list(range(100_000))}))
    assert "\n" not in str(caught.value) and not partial_path(target).exists()
    assert pq.read_table(target).column("index").to_pylist() == [7]

    folder = tmp_path / "files"
    staging_folder(folder).mkdir()
    (staging_folder(folder) / "000000007.png").symlink_to("/dev/full")
    with pytest.raises(UserError, match=r"no space left on the device while writing `.*000000007.png`"):
        with staged_files(str(folder), {"image": ".png"}) as files:
            files.write("image", [b"x" * 10], np.array([7]))
