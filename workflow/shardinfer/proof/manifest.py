"""The manifest of a folder of parts (`output.layout: parts`): the proof that travels with it.

`.manifest.json` lies in the folder beside the parts: dot-named, so that every reader of a folder
of Parquet files passes it over (pyarrow and pandas skip `.` and `_` names; Hugging Face `datasets`
reads an `_`-named file as data and fails, and skips a `.`-named one; DuckDB reads the glob it is
given). It says what the folder must hold and where it came from:

- per part, in index order: its name, rows, index range [start, end), the digest of its values (as
  its shard job recorded it: `shardinfer.contract.content_digest`), the SHA-256 and size of its bytes;
- the plan id, the settings digest, the input (its path and each file's size, rows and SHA-256),
  the columns, the rows and bytes in all.

Parts are named so that name order is index order, the Hugging Face layout:
`part-00000-of-00012.parquet` (`shardinfer.output.base.part_name`). `shardinfer.proof.verify` checks a
folder against its manifest alone.
"""

from __future__ import annotations

import json

import pyarrow as pa

from shardinfer.output.base import part_name
from shardinfer.output.parquet import MANIFEST_NAME as MANIFEST_NAME  # named here too

MANIFEST_FORMAT = "shardinfer.parts/1"


def part_names(count: int) -> list[str]:
    """Every part's name, in index order."""
    return [part_name(k, count) for k in range(count)]


def columns_of(schema: pa.Schema) -> list[list[str]]:
    return [[field.name, str(field.type)] for field in schema]


def manifest(parts: list[dict], plan, digest: str, schema: pa.Schema | None) -> dict:
    """The manifest's content (module docstring); `parts`: each part's name, rows, start, end,
    content, sha256 and bytes, in index order; `plan`: a `shardinfer.plan.plan_file.Plan`."""
    return {
        "format": MANIFEST_FORMAT,
        "rows": plan.rows,
        "bytes": sum(part["bytes"] for part in parts),
        "plan_id": plan.plan_id,
        "digest": digest,
        "input": {"path": plan.input_path,
                  "files": [{"path": part.path, "rows": part.rows, "size": part.size, "sha256": part.digest}
                            for part in plan.parts]},
        "columns": columns_of(schema) if schema is not None else None,
        "parts": parts,
    }


def dumps(content: dict) -> str:
    return json.dumps(content, indent=1) + "\n"
