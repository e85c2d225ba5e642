"""A shard file's content digest: the proof at gather covers values, not only rows.

The shard job hashes every table it writes; the digest goes into the file's metadata under
CONTENT_KEY when the file is closed (the identity under IDENTITY_KEY is fixed before the first
row is written, so it cannot hold it). Gather hashes what it reads back, row group by row group
while it concatenates, and refuses a shard whose values no longer hash the same.

The hash is of a canonical form that depends on the values only, never on their layout in
memory: the table as written (slices of windows, offsets into shared buffers) and the same table
read back from Parquet (other chunks, fresh buffers, bitmaps dropped or rebuilt) hash the same.
Each column is split into streams, each hashed on its own, so that any split of the rows into
chunks feeds each stream the same bytes:

- `valid`: one byte per row (1 valid, 0 null); what lies under a null is never hashed;
- fixed-width values (integers, floats, temporals, decimals): the valid values' bytes;
- booleans: one byte per valid value;
- strings and binaries (any offset width, views): the valid values' lengths as int64, and their bytes;
- lists (any offset width, fixed size, views): the valid lists' lengths as int64, then their items
  as a column of their own; structs: each field as a column of its own; maps: as lists of
  (key, value) structs;
- dictionaries: decoded first, so the index width and dictionary order do not matter;
- anything else: each valid value's Python repr, one per line (slow, but correct).

A stream fed no bytes at all is left out, so an empty table adds nothing either way. The digest
is SHA-256 over each stream's name and SHA-256, in name order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CONTENT_KEY = b"shardinfer.content"  # shard file metadata, added at close: {"digest", "rows"}
ALGORITHM = "sha256"


def _is_binary(kind: pa.DataType) -> bool:
    return any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                       pa.types.is_large_binary, pa.types.is_string_view, pa.types.is_binary_view))


def _is_list(kind: pa.DataType) -> bool:
    return any(test(kind) for test in (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
                                       pa.types.is_list_view, pa.types.is_large_list_view))


def _fixed_width(kind: pa.DataType) -> bool:
    """Values of a whole number of bytes each in one values buffer (not booleans: one bit each)."""
    try:
        return kind.bit_width % 8 == 0 and not pa.types.is_union(kind)
    except ValueError:  # not a fixed-width type
        return False


def _binary_pieces(valid: pa.Array, path: str) -> Iterator[tuple[str, bytes | memoryview]]:
    """Lengths and bytes of the (non-null) values, read through one offsets layout whatever the input's."""
    values = valid.cast(pa.large_binary())
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset: values.offset + len(values) + 1]
    yield f"{path}\0len", np.diff(offsets).tobytes()
    if len(values) and values.buffers()[2] is not None:
        yield f"{path}\0data", memoryview(values.buffers()[2])[offsets[0]: offsets[-1]]


def _fixed_pieces(valid: pa.Array, path: str) -> Iterator[tuple[str, bytes | memoryview]]:
    """The (non-null) values' bytes, from the values buffer at the array's own offset."""
    if pa.types.is_boolean(valid.type):
        yield f"{path}\0data", valid.to_numpy(zero_copy_only=False).astype(np.uint8).tobytes()
        return
    width = valid.type.bit_width // 8
    buffer = valid.buffers()[1]
    if buffer is not None:
        yield f"{path}\0data", memoryview(buffer)[valid.offset * width: (valid.offset + len(valid)) * width]


def column_pieces(array: pa.Array, path: str) -> Iterator[tuple[str, bytes | memoryview]]:
    """(stream name, bytes) pairs of one array in the canonical form (module docstring)."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_map(array.type):  # a map is a list of (key, value) structs, and digests as one
        array = array.cast(pa.list_(pa.struct([array.type.key_field, array.type.item_field])))
    kind = array.type
    yield f"{path}\0valid", array.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8).tobytes()
    valid = array.drop_null() if array.null_count else array
    if pa.types.is_null(kind):
        return
    if _is_binary(kind):
        yield from _binary_pieces(valid, path)
    elif _is_list(kind):
        yield f"{path}\0len", pc.list_value_length(valid).cast(pa.int64()).to_numpy().tobytes()
        yield from column_pieces(pc.list_flatten(valid), f"{path}\0item")
    elif pa.types.is_struct(kind):
        for field, child in zip(kind, valid.flatten()):
            yield from column_pieces(child, f"{path}\0.{field.name}")
    elif pa.types.is_boolean(kind) or _fixed_width(kind):
        yield from _fixed_pieces(valid, path)
    else:
        yield f"{path}\0repr", "".join(f"{value!r}\n" for value in valid.to_pylist()).encode()


class ContentHasher:
    """Feed it tables (or record batches) of the same columns in row order; `digest()` is the same for
    any split of the rows into tables and chunks. Columns are taken by position (and named in the
    streams), so every column counts, whatever its name."""

    def __init__(self) -> None:
        self.rows = 0
        self.streams: dict[str, hashlib._Hash] = {}

    def update(self, table: pa.Table | pa.RecordBatch) -> None:
        for position, (name, column) in enumerate(zip(table.schema.names, table.columns)):
            for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
                for stream, data in column_pieces(chunk, f"{position}:{name}"):
                    if len(data):
                        self.streams.setdefault(stream, hashlib.new(ALGORITHM)).update(data)
        self.rows += table.num_rows

    def digest(self) -> str:
        total = hashlib.new(ALGORITHM)
        for stream in sorted(self.streams):
            total.update(f"{stream}\0{self.streams[stream].hexdigest()}\n".encode())
        return f"{ALGORITHM}:{total.hexdigest()}"

    def metadata(self) -> dict[bytes, bytes]:
        """The key-value metadata to add to the file when it is closed."""
        return {CONTENT_KEY: json.dumps({"digest": self.digest(), "rows": self.rows}).encode()}


def table_digest(table: pa.Table | pa.RecordBatch) -> str:
    """The content digest of one table: what a shard job records for the rows it wrote."""
    hasher = ContentHasher()
    hasher.update(table)
    return hasher.digest()
