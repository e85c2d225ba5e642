"""The input formats, one module each: every module of this package that defines `FORMATS` (a
tuple of `base.Format` instances) adds them. Adding a format is one module plus its tests; no
stage names a format (`base.py` is the interface: read it first).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path

from shardinfer.errors import UserError
from shardinfer.input.formats.base import COMPRESSED_SUFFIXES, Format


@functools.cache
def all_formats() -> dict[str, Format]:
    """Every format, by name, from the package's modules in name order."""
    found: dict[str, Format] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        for fmt in getattr(importlib.import_module(f"{__name__}.{module}"), "FORMATS", ()):
            found[fmt.name] = fmt
    return found


def format_named(name: str) -> Format:
    """The format `input.format` names; an unknown name is refused, naming those there are."""
    formats = all_formats()
    if name not in formats:
        raise UserError(f"input.format `{name}` is not a format; allowed: auto, {', '.join(formats)}")
    return formats[name]


def extensions() -> dict[str, Format]:
    """Each table extension (lower case, with its dot) and its format."""
    return {suffix: fmt for fmt in all_formats().values() for suffix in fmt.extensions}


def format_of(path: str) -> Format | None:
    """The format a file name says, or None. A compression suffix (.gz, .bz2, .lz4, .zst) is
    looked through for a format whose files Arrow may decompress by the name (CSV, JSONL), and
    for no other: `x.parquet.gz` names no format."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        fmt = extensions().get(suffixes[-2]) if len(suffixes) > 1 else None
        return fmt if fmt is not None and fmt.compressible else None
    return extensions().get(suffixes[-1]) if suffixes else None


def folder_format(folder: str, split: str | None) -> tuple[Format, tuple[str, ...]] | None:
    """A folder laid out in a format's own way (a Hugging Face dataset) and its parts, or None."""
    for fmt in all_formats().values():
        parts = fmt.folder_parts(folder, split)
        if parts is not None:
            return fmt, parts
    return None
