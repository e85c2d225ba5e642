"""The table as Arrow IPC (Feather V2): `results/predictions.arrow`, or with `output.layout: parts`
the folder `results/predictions-arrow/` of parts (`part-00000-of-00003.arrow`, ...; name order is
index order), each closed once it holds `output.part_size`.

Every column keeps its Arrow type (lists, structs, binary, dictionaries) and the table's identity
in the schema's metadata, as in the Parquet file; nothing is encoded or compressed, so a reader
maps the file into memory and reads a column without copying it: `pyarrow.ipc.open_file`,
`pyarrow.feather.read_table`, `pandas.read_feather`, `polars.read_ipc`, DuckDB's `arrow` extension.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from shardinfer.output.base import (
    Destination,
    Proven,
    Writer,
    one_file_facts,
    part_name,
    size_of,
    staged,
    staged_folder,
)

FILE = "predictions.arrow"
FOLDER = "predictions-arrow/"


class ArrowIPC(Writer):
    """The table as Arrow IPC files: its own types, read back without decoding."""

    name = "arrow"
    writes = "the table as Arrow IPC (Feather V2): `predictions.arrow`, or the folder `predictions-arrow/`"

    def files(self, parts: bool) -> dict[str, str]:
        return {"arrow_parts": FOLDER} if parts else {"arrow": FILE}

    def write(self, proven: Proven, where: Destination) -> dict:
        if not where.parts:
            with staged([where.paths["arrow"]]) as (tmp,):
                write_file(tmp, proven.tables, proven.schema)
            return one_file_facts(where.paths["arrow"], rows=proven.rows)
        folder = where.paths["arrow_parts"]
        with staged_folder(folder) as staging:
            count = write_parts(proven.tables, proven.schema, staging, where.part_bytes)
        return {"layout": "parts", "path": folder, "parts": count, "bytes": size_of(folder), "rows": proven.rows}

    def read_back(self, where: Destination) -> Iterator[dict]:
        files = sorted(Path(where.paths["arrow_parts"]).glob("*.arrow")) if where.parts else [where.paths["arrow"]]
        for path in files:
            with pa.memory_map(str(path)) as source:
                yield from pa.ipc.open_file(source).read_all().to_pylist()


def write_file(path: Path, tables: Iterable[pa.Table], schema: pa.Schema | None) -> None:
    """Every row group into one IPC file, in order (its schema: the proven table's, metadata and all)."""
    writer = None
    try:
        for table in tables:
            if writer is None:
                writer = pa.ipc.new_file(str(path), schema or table.schema)
            writer.write_table(table.replace_schema_metadata((schema or table.schema).metadata))
        if writer is None:  # no rows: the table's columns alone
            writer = pa.ipc.new_file(str(path), schema)
    finally:
        if writer is not None:
            writer.close()


def write_parts(tables: Iterable[pa.Table], schema: pa.Schema | None, folder: Path, part_bytes: int) -> int:
    """The rows in parts of about `part_bytes` (a part closes after the row group that fills it),
    named by their number once all are written; no rows is one part of none. Returns the parts."""
    written, writer = [], None
    try:
        for table in tables:
            if writer is None:
                written.append(folder / f"{len(written)}.partial")
                writer = pa.ipc.new_file(str(written[-1]), schema or table.schema)
            writer.write_table(table.replace_schema_metadata((schema or table.schema).metadata))
            if written[-1].stat().st_size >= part_bytes:
                writer.close()
                writer = None
        if not written:
            written.append(folder / "0.partial")
            writer = pa.ipc.new_file(str(written[-1]), schema)
    finally:
        if writer is not None:
            writer.close()
    for number, path in enumerate(written):
        path.rename(folder / part_name(number, len(written), ".arrow"))
    return len(written)


WRITERS = (ArrowIPC(),)
