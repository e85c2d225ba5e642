"""Images as an input column holds them (`input.image_column`): the Arrow types allowed (checked
at the plan), a row's value as a list of images, and each image read into RGB pixels with PIL (in
the shard's prepare stage: its own rows only). `shardinfer.tasks.generate_images` hands them to
the model's processor.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa


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


def decoded(image: bytes | str, folder: Path):
    """An image as PIL gives it, fully read and in RGB; ValueError saying why it cannot be."""
    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(image, str):
            if "://" in image:
                raise ValueError(f"`{image}` is a URL; images are read from bytes or local paths only")
            with Image.open(folder / image) as opened:
                return opened.convert("RGB")
        with Image.open(io.BytesIO(image)) as opened:
            return opened.convert("RGB")
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError, SyntaxError) as error:
        where = f"`{image}`" if isinstance(image, str) else f"{len(image)} bytes"
        raise ValueError(f"cannot read the image ({where}: {str(error).strip() or type(error).__name__})") from None
