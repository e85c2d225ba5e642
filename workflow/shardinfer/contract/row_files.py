"""Files per row (an image per input row): how a shard's files are named and proven, the contract
between the runner that writes them (`shardinfer.shard.row_files`) and gather (and a resumed shard:
`shardinfer.shard.resume`) that check them.

A shard's files go into a staging folder beside its final one (`results/files/.3.partial`), each
named by its row's global index (`000001234.png`), so two shards or two rows can never write the
same name. The table records each file's path (relative to the working directory), byte size and
SHA-256; gather checks every one and refuses any file the table does not name.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from shardinfer.contract.file_digest import file_digest
from shardinfer.contract.shard_file import ERROR_COLUMN, INDEX_COLUMN, file_name
from shardinfer.core.atomic import partial_path
from shardinfer.core.errors import ProofError

SNAKEMAKE_MARKER = ".snakemake_timestamp"  # Snakemake's own mark in a directory() output


def staging_folder(folder: str | Path) -> Path:
    """`results/files/.3.partial`: named as a partial file is (shardinfer.core.atomic)."""
    return partial_path(Path(folder))


def expected_name(index: int, column: str, suffixes: dict[str, str]) -> str:
    """`000001234.png`; with several file columns, `000001234.<column>.png` keeps them apart."""
    suffix = suffixes[column] if len(suffixes) == 1 else f".{column}{suffixes[column]}"
    return file_name(index, suffix)


def prove_files(table: pa.Table, folder: str, suffixes: dict[str, str], recorded: str | None = None) -> set[str]:
    """Every row that names a file has exactly that file: its own name (by index), size and SHA-256.
    A failed row (row_errors: record, its `error` set) has no file by design, and must name none.
    `recorded`: the folder the rows name when the files are still elsewhere (a resumed shard's
    staging folder); by default `folder`. Returns the names seen, so the caller can refuse files no
    row names. Raises ProofError naming the row."""
    index = table.column(INDEX_COLUMN).to_numpy()
    errors = table.column(ERROR_COLUMN).to_pylist() if ERROR_COLUMN in table.column_names else [None] * len(index)
    seen = set()
    for column in suffixes:
        for row, value, error in zip(index.tolist(), table.column(column).to_pylist(), errors):
            if value is not None and error is not None:
                raise ProofError(f"row {row} failed (its `{ERROR_COLUMN}` is set) but column `{column}` names a file")
            if value is None:
                continue
            name = expected_name(row, column, suffixes)
            path = Path(folder) / name
            if value["path"] != str(Path(recorded or folder) / name):
                raise ProofError(f"row {row}: column `{column}` names `{value['path']}`, not its own file "
                                 f"`{Path(recorded or folder) / name}`")
            if not path.is_file():
                raise ProofError(f"row {row}: file `{path}` is missing; rerun its shard")
            if path.stat().st_size != value["size"]:
                raise ProofError(f"row {row}: file `{path}` has {path.stat().st_size} bytes, its row records "
                                 f"{value['size']} (truncated or replaced); rerun its shard")
            if file_digest(str(path)) != f"sha256:{value['sha256']}":
                raise ProofError(f"row {row}: file `{path}` is not the file its row records (SHA-256 differs: "
                                 "altered or swapped); rerun its shard")
            seen.add(name)
    return seen


def refuse_unlisted(folder: str, seen: set[str]) -> None:
    """A file in a shard's folder that no row names (another run's, or one put there by hand)."""
    if not Path(folder).is_dir():
        raise ProofError(f"files folder `{folder}` is missing; rerun its shard")
    for entry in sorted(Path(folder).iterdir()):
        if entry.name not in seen and entry.name != SNAKEMAKE_MARKER:
            raise ProofError(f"file `{entry}` is in the shard's files folder but no row names it; "
                             "remove it or rerun the shard")
