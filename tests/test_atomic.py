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

import patience
from factory import python_env
from shardinfer.contract.row_files import staging_folder
from shardinfer.core.atomic import HOST, atomic_parquet_writer, attempt_path, remove_dead_attempts
from shardinfer.core.errors import UserError
from shardinfer.proof.prove import refuse_stray_files
from shardinfer.proof.shards import ShardFile
from shardinfer.shard.row_files import staged_files

SCHEMA = pa.schema([("index", pa.int64())])
KILLER = """
import os, signal
import pyarrow as pa
from shardinfer.core import atomic
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
    # the leftover's name says it is partial, and whose: the next attempt removes it (its process is gone)
    leftovers = list(tmp_path.glob(".3.parquet.*.partial"))
    assert [p.name for p in leftovers] == [f".3.parquet.{HOST}-{leftovers[0].name.split('-')[-1]}"]
    with atomic_parquet_writer(path, SCHEMA) as writer:
        writer.write_table(pa.table({"index": [1]}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.parquet"]


def test_a_successful_write_is_complete(tmp_path):
    path = tmp_path / "1.parquet"
    with atomic_parquet_writer(path, SCHEMA) as writer:
        writer.write_table(pa.table({"index": [1, 2]}))
    assert pq.read_table(path).column("index").to_pylist() == [1, 2]
    assert not attempt_path(path).exists()


def test_a_shard_commits_its_table_closed_then_its_files_folder_then_the_table(tmp_path, monkeypatch):
    """The files folder takes its name only after the table is complete on disk, and just before the
    table takes its own: a failed footer write never leaves a new folder without its table."""
    table, files = tmp_path / "shards" / "1.parquet", tmp_path / "files" / "1"
    renames, real_replace = [], os.replace

    def recorded(src, dst):
        if Path(dst) == files:
            assert pq.read_metadata(attempt_path(table)).num_rows == 2  # closed: its footer is written
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
    attempt_path(target).symlink_to("/dev/full")
    with pytest.raises(UserError, match=rf"no space left on the device while writing `{target}`; free space") as caught:
        with atomic_parquet_writer(target, SCHEMA) as writer:
            writer.write_table(pa.table({"index": list(range(100_000))}))
    assert "\n" not in str(caught.value) and not attempt_path(target).exists()
    assert pq.read_table(target).column("index").to_pylist() == [7]

    folder = tmp_path / "files"
    staging_folder(folder).mkdir()
    (staging_folder(folder) / "000000007.png").symlink_to("/dev/full")
    with pytest.raises(UserError, match=r"no space left on the device while writing `.*000000007.png`"):
        with staged_files(str(folder), {"image": ".png"}) as files:
            files.write("image", [b"x" * 10], np.array([7]))


SECOND_WRITER = """
import sys
import pyarrow as pa
from shardinfer.core.atomic import atomic_parquet_writer
with atomic_parquet_writer({path!r}, pa.schema([("index", pa.int64())])) as writer:
    writer.write_table(pa.table({{"index": [2, 2]}}))
    print("written", flush=True)
    sys.stdin.readline()  # commits once told to, after the other writer committed
"""


def test_two_attempts_at_one_file_at_once_each_write_their_own_and_both_commit(tmp_path):
    """Two runs in one folder after `snakemake --unlock`: the same shard's jobs at once. Each writes
    its own temporary file; whichever commits last leaves a whole file (never one renamed away
    from under the other, or two writers in one file)."""
    path = tmp_path / "0.parquet"
    other = subprocess.Popen([sys.executable, "-c", SECOND_WRITER.format(path=str(path))], env=python_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline() == "written\n"
    with atomic_parquet_writer(path, SCHEMA) as writer:
        writer.write_table(pa.table({"index": [1]}))
    assert pq.read_table(path).column("index").to_pylist() == [1]
    other.communicate("commit\n", timeout=patience.HANG_S)  # a hang, not a slow machine (tests/patience.py)
    assert other.returncode == 0
    assert pq.read_table(path).column("index").to_pylist() == [2, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.parquet"]


def test_leftovers_of_dead_attempts_are_removed_and_the_others_left_where_gather_passes_over_them(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "shards" / "0.parquet"
    path.parent.mkdir()
    dead, running, elsewhere, old = (path.parent / f".0.parquet.{name}.partial" for name in (
        f"{HOST}-{gone.stdout.strip()}", f"{HOST}-{os.getppid()}", f"{HOST}x-{gone.stdout.strip()}", "x"))
    for leftover in (dead, running, elsewhere, old, path.parent / ".10.parquet.x-1.partial"):
        leftover.write_bytes(b"a killed attempt's leftover")
    assert remove_dead_attempts(path) == [dead]
    pq.write_table(pa.table({"index": [0]}), path)
    shard = ShardFile(0, str(path), 1, pa.schema([("index", pa.int64())]), {}, "")
    refuse_stray_files([shard])  # gather passes over the leftovers it cannot tell are dead
