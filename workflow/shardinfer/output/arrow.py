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
    size_of,
    staged,
    staged_folder,
    write_in_parts,
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
            count = write_in_parts(proven.tables, staging, where.part_bytes, ".arrow",
                                   lambda path: IpcPart(path, proven.schema))
        return {"layout": "parts", "path": folder, "parts": count, "bytes": size_of(folder), "rows": proven.rows}

    def read_back(self, where: Destination) -> Iterator[dict]:
        files = sorted(Path(where.paths["arrow_parts"]).glob("*.arrow")) if where.parts else [where.paths["arrow"]]
        for path in files:
            with pa.memory_map(str(path)) as source:
                yield from pa.ipc.open_file(source).read_all().to_pylist()


class IpcPart:
    """An Arrow IPC file, of the proven table's schema (the first row group's where none is given)."""

    def __init__(self, path: Path, schema: pa.Schema | None) -> None:
        self.path, self.schema, self.writer = path, schema, None
        if schema is not None:
            self.writer = pa.ipc.new_file(str(path), schema)

    def write(self, table: pa.Table) -> None:
        if self.writer is None:
            self.schema = table.schema
            self.writer = pa.ipc.new_file(str(self.path), self.schema)
        self.writer.write_table(table.replace_schema_metadata(self.schema.metadata))

    def size(self) -> int:
        return self.path.stat().st_size

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def write_file(path: Path, tables: Iterable[pa.Table], schema: pa.Schema | None) -> None:
    """Every row group into one IPC file, in order (its schema: the proven table's, metadata and all)."""
    part = IpcPart(path, schema)
    try:
        for table in tables:
            part.write(table)
    finally:
        part.close()


WRITERS = (ArrowIPC(),)
