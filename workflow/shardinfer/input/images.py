"""Images as an input column holds them (`input.image_column`): the Arrow types allowed (checked
at the plan), a row's value as a list of images, and each image read into RGB pixels with PIL (in
the shard's prepare stage: its own rows only). `shardinfer.tasks.generate.images` hands them to
the model's processor.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shardinfer.input.image_files import read_image_file


def image_kind_problem(kind: pa.DataType) -> str | None:
    """Why an Arrow type cannot hold images, or None: binary or string (a path), a {bytes, path}
    struct, or a list of those."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        kind = kind.value_type
    if kind == pa.null() or pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_string(kind) \
            or pa.types.is_large_string(kind):
        return None
    if pa.types.is_struct(kind) and {f.name for f in kind} & {"bytes", "path"}:
        return None
    return (f"holds {kind}, not images: encoded image bytes (binary), paths relative to the input (strings), "
            "{bytes, path} structs (Hugging Face datasets' Image), or lists of them")


def column_images(column: pa.Array) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """The plan's read of an image column: each row's count of images (what its cost adds) and the
    (position, name) of each image given by path (`shardinfer.input.image_files`). Bytes are counted,
    never copied out."""
    kind = column.type
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    inner = kind.value_type if listed else kind
    if inner == pa.null() or pa.types.is_binary(inner) or pa.types.is_large_binary(inner):
        if listed:
            counts = pc.fill_null(pc.list_value_length(column), 0) if inner != pa.null() else None
            return (np.zeros(len(column), dtype=np.int32) if counts is None
                    else counts.to_numpy(zero_copy_only=False).astype(np.int32)), []
        present = column.is_valid().to_numpy(zero_copy_only=False) if inner != pa.null() else np.zeros(len(column))
        return present.astype(np.int32), []
    counts, named = np.zeros(len(column), dtype=np.int32), []
    for position, value in enumerate(column.to_pylist()):
        images = row_images(value)
        counts[position] = len(images)
        named.extend((position, image) for image in images if isinstance(image, str))
    return counts, named


def row_images(value: Any) -> list:
    """One row's value as a list of images, each bytes or a path."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    found = []
    for item in values:
        if isinstance(item, dict):  # datasets' Image: the bytes when stored, else the path
            item = item.get("bytes") or item.get("path")
        if item is not None:
            found.append(item)
    return found


def input_folder(path: str) -> Path:
    """The folder image paths are relative to: the input's folder (a folder input: itself; a glob:
    the folder before its first wildcard)."""
    head = Path(path.split("*")[0].split("?")[0].split("[")[0])
    if "*" in path or "?" in path or "[" in path:
        return head if str(head).endswith("/") or head.is_dir() else head.parent
    return head if head.is_dir() else head.parent


def decoded(image: bytes | str, folder: Path, read: dict | None = None):
    """An image as PIL gives it, fully read and in RGB; ValueError saying why it cannot be. A file's
    identity as read goes into `read` under its name (`image_files.read_image_file`), for gather."""
    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(image, str):
            if "://" in image:
                raise ValueError(f"`{image}` is a URL; images are read from bytes or local paths only")
            data, identity = read_image_file(folder, image)
            if read is not None:
                read[image] = identity
        with Image.open(io.BytesIO(data if isinstance(image, str) else image)) as opened:
            return opened.convert("RGB")
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError, SyntaxError) as error:
        where = f"`{image}`" if isinstance(image, str) else f"{len(image)} bytes"
        raise ValueError(f"cannot read the image ({where}: {str(error).strip() or type(error).__name__})") from None
