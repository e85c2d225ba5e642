"""The Arrow IPC writer (`output.writers: [arrow]`, shardinfer.output.arrow) beyond the writer
contract (tests/test_writer_contract.py runs it as every writer): gathered from real shard files,
its file is the Parquet table itself (every Arrow type, the table's identity in its metadata) as
pyarrow, pandas and DuckDB read it, and its parts are cut at `output.part_size`, in index order."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from shardinfer.proof.gather import run_gather
from test_writer_contract import job_of, runs, same  # noqa: F401 - the contract's shard files, made once

CASES = ["custom", "batch"]


@pytest.mark.parametrize("run", CASES)
def test_one_file_is_the_parquet_table_types_metadata_and_all(runs, tmp_path, run):  # noqa: F811
    import pandas as pd

    job = job_of(runs[run], tmp_path / "out", ("parquet", "arrow"), "file")
    report = run_gather(job)
    table, ipc = pq.read_table(job.outputs["predictions"]), feather.read_table(job.outputs["arrow"])
    assert ipc.schema.equals(table.schema, check_metadata=True)
    assert all(same(a, b) for a, b in zip(ipc.to_pylist(), table.to_pylist()))  # NaN as NaN: `same`
    assert b"shardinfer" in b"".join(ipc.schema.metadata) and ipc.num_rows == report["outputs"]["arrow"]["rows"]
    frame = pd.read_feather(job.outputs["arrow"])
    assert frame["index"].tolist() == list(range(table.num_rows))


def test_parts_are_cut_at_part_size_in_index_order_and_duckdb_reads_them(runs, tmp_path):  # noqa: F811
    import duckdb

    job = job_of(runs["custom"], tmp_path / "out", ("parquet", "arrow"), "parts")
    report = run_gather(job)
    folder = Path(job.outputs["arrow_parts"])
    names = sorted(path.name for path in folder.iterdir())
    assert report["outputs"]["arrow"]["parts"] == len(names) > 1
    assert names[0] == f"part-00000-of-{len(names):05d}.arrow"
    joined = pa.concat_tables(feather.read_table(folder / name) for name in names)
    parquet_parts = sorted(Path(job.outputs["manifest"]).parent.glob("*.parquet"))
    table = pa.concat_tables(pq.read_table(path) for path in parquet_parts)
    assert joined.select(["index", "id"]).equals(table.select(["index", "id"]))
    ipc = feather.read_table(folder / names[0])
    got = duckdb.sql("select count(*), min(\"index\") from ipc").fetchall()
    assert got == [(ipc.num_rows, 0)]
