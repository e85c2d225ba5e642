"""The input formats, one module each: every module of this package that defines `FORMATS` (a
tuple of `base.Format` instances) adds them. Adding a format is one module plus its tests; no
stage names a format (`base.py` is the interface: read it first), and the docs' lists of formats
are written from this registry (scripts/config_docs.py).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from shardinfer.core.errors import UserError
from shardinfer.core.plugins import discover
from shardinfer.input.formats.base import COMPRESSED_SUFFIXES, Format
from shardinfer.settings.config import FLAT_OPTIONS


@functools.cache
def all_formats() -> dict[str, Format]:
    """Every format, by name, from the package's modules in name order."""
    return discover(__name__, __path__, "FORMATS")


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


def compressible_names() -> list[str]:
    """The formats whose files may be compressed (`x.csv.gz`), in registry order."""
    return [fmt.name for fmt in all_formats().values() if fmt.compressible]


def folder_format(folder: str, section: dict | None = None) -> tuple[Format, tuple[str, ...]] | None:
    """A folder laid out in a format's own way (a Hugging Face dataset) and its parts, or None;
    each format looks with its options as the input `section` sets them."""
    for fmt in all_formats().values():
        parts = fmt.folder_parts(folder, fmt.options_type(**dict(_given(section or {}, fmt))))
        if parts is not None:
            return fmt, parts
    return None


def _given(section: dict, fmt: Format) -> list[tuple[str, object]]:
    """(option, value) of each of `fmt`'s options that an input section sets (not null): in its own
    section (`input.csv.delimiter`) and as today's flat key (`input.delimiter`)."""
    own = [(name, value) for name, value in (section.get(fmt.options_section) or {}).items() if value is not None]
    names = {field.name for field in dataclasses.fields(fmt.options_type)}
    return own + [(name, section[name]) for name in FLAT_OPTIONS if name in names and section.get(name) is not None]


def _key(fmt: Format, section: dict, option: str) -> str:
    """An option's key as the section sets it: `input.csv.delimiter`, or today's flat `input.delimiter`."""
    nested = (section.get(fmt.options_section) or {}).get(option) is not None
    return f"input.{fmt.options_section}.{option}" if nested else f"input.{option}"


def options_in(section: dict, fmt: Format) -> dict:
    """The options that an input section (`input`, or one of `inputs`) sets for its format `fmt`,
    checked by the format's options type; the options of the input's other formats are refused in
    one line, and so is an option set twice (nested and flat) to two values."""
    for other in all_formats().values():
        given = _given(section, other) if other.options_section != fmt.options_section else []
        if given:
            owners = ", ".join(f.name for f in all_formats().values() if f.options_section == other.options_section)
            raise UserError(f"{_key(other, section, given[0][0])} is for {owners}; input `{section['path']}` is "
                            f"{fmt.name}, so leave it out")
    options: dict = {}
    for name, value in _given(section, fmt):
        if options.setdefault(name, value) != value:
            raise UserError(f"input.{fmt.options_section}.{name} {options[name]!r} and input.{name} {value!r} differ; "
                            f"give one (input.{name} is its older spelling)")
    fmt.options_type(**options).check(lambda option: _key(fmt, section, option))
    return options
