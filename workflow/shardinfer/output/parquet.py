"""The table in Parquet: `results/predictions.parquet`, or with `output.layout: parts` the folder
`results/predictions/` of Parquet parts and its manifest.

One file is written from the proven row groups as they pass, so memory does not grow with the
table (dictionary-encoded where the shard files are, every page with its checksum). The folder of
parts is the shards' own files, placed by the proof (`Proven.place_parts`: hard links and a
manifest, or without a shared filesystem the manifest of the parts the shard jobs wrote into the
bucket): no value is read or written again, and the rule's output is the folder's manifest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from shardinfer.contract.shard_file import dictionary_columns
from shardinfer.core.atomic import atomic_parquet_writer
from shardinfer.output.base import PART_PREFIX, Destination, Proven, Writer, one_file_facts

TABLE_FILE = "predictions.parquet"
TABLE_FOLDER = "predictions/"
MANIFEST_NAME = ".manifest.json"  # the folder's manifest (shardinfer.proof.manifest)


class Parquet(Writer):
    """The proven table: one Parquet file, or a folder of Parquet parts with its manifest."""

    name = "parquet"
    writes = "the table: `predictions.parquet`, or the folder `predictions/` of Parquet parts and its manifest"

    def files(self, parts: bool) -> dict[str, str]:
        return {"manifest": f"{TABLE_FOLDER}{MANIFEST_NAME}"} if parts else {"predictions": TABLE_FILE}

    def folder(self, parts: bool) -> str | None:
        return TABLE_FOLDER if parts else None

    def shown(self, parts: bool) -> str:
        """The file, or the folder (ending in `/`): its output in the rule is the folder's manifest."""
        return TABLE_FOLDER if parts else TABLE_FILE

    def reads_values(self, parts: bool) -> bool:
        return not parts

    def write(self, proven: Proven, where: Destination) -> dict:
        if where.parts:
            if proven.place_parts is None:
                raise ValueError("the parts layout's folder is made of the shards' files, which the proof places")
            return proven.place_parts(os.path.dirname(where.paths["manifest"]))
        path = where.paths["predictions"]
        schema = proven.schema
        with atomic_parquet_writer(path, schema, use_dictionary=dictionary_columns(schema)) as writer:
            for table in proven.tables:
                writer.write_table(table.replace_schema_metadata(schema.metadata))
        return one_file_facts(path)

    def read_back(self, where: Destination) -> Iterator[dict]:
        if not where.parts:
            yield from pq.read_table(where.paths["predictions"]).to_pylist()
            return
        folder = Path(where.paths["manifest"]).parent
        for part in sorted(folder.glob(f"{PART_PREFIX}-*.parquet")):
            yield from pq.read_table(part).to_pylist()


WRITERS = (Parquet(),)
