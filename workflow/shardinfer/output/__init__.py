"""What gather writes from the proven rows: the output writers, one module each behind one interface
(`base.py`: read it first): the Parquet table, JSON Lines, the OpenAI batch output and error files.
Every module of this package that defines `WRITERS` (a tuple of `base.Writer` instances) adds them;
`output.writers` chooses among them (by default the table, and the files an input's format asks
for), and the docs' list of writers is written from this registry (scripts/config_docs.py).
Imports the rooms below it; never torch.
"""

from __future__ import annotations

import functools
import os

from shardinfer.core.errors import UserError
from shardinfer.core.plugins import discover
from shardinfer.output.base import Writer
from shardinfer.settings.config import InputSettings, OutputSettings

TABLE = "parquet"  # the writer every run has unless output.writers leaves it out


@functools.cache
def all_writers() -> dict[str, Writer]:
    """Every writer, by name, from the package's modules in name order."""
    return discover(__name__, __path__, "WRITERS")


def writer_named(name: str) -> Writer:
    """The writer `output.writers` names; an unknown name is refused, naming those there are."""
    writers = all_writers()
    if name not in writers:
        raise UserError(f"output.writers: `{name}` is not a writer; known: {', '.join(writers)}")
    return writers[name]


def default_writers(input_format: str) -> list[str]:
    """The writers of a run without output.writers: the table, and those the input's format asks
    for (an OpenAI batch file's output and error files), in that order."""
    return [TABLE, *(name for name, writer in all_writers().items()
                     if input_format in writer.default_for and name != TABLE)]


def chosen_writers(output: OutputSettings, inp: InputSettings, storage: bool = False) -> list[Writer]:
    """The writers of an input's run, in the order given (the first is the one the terminal names);
    each refused in one line where it cannot write this input or layout. `storage`: no shared
    filesystem, where the parts layout's parts are the shard jobs' own, in the bucket."""
    names = list(output.writers) if output.writers is not None else default_writers(inp.format)
    writers = [writer_named(name) for name in names]
    for writer in writers:
        if writer.formats is not None and inp.format not in writer.formats:
            raise UserError(f"output.writers {writer.name} writes for input.format {' or '.join(writer.formats)}; "
                            f"input `{inp.path}` is {inp.format}, so leave {writer.name} out")
        if output.parts and not writer.parts:
            raise UserError(f"output.writers {writer.name} cannot write output.layout parts; use output.layout: file, "
                            f"or leave {writer.name} out")
        if output.parts and storage and writer.reads_values(True):
            raise UserError(f"output.writers {writer.name} with output.layout parts without a shared filesystem: it "
                            "writes from every value, and the parts are the shard jobs' own, in the bucket, which "
                            "gather does not download; use output.layout: file, or leave it out")
    return writers


def writer_files(writers: list[Writer], parts: bool, folder: str) -> dict[str, str]:
    """Every file of `writers` in the layout, by output name, under the results `folder` (a folder's
    path without its `/`, as Snakemake names it)."""
    return {key: os.path.join(folder, name).rstrip("/") for writer in writers
            for key, name in writer.files(parts).items()}


def stale_paths(writers: list[Writer], parts: bool, folder: str) -> list[str]:
    """What a writer of another run left under the results `folder` and this run's writers do not
    write (a writer switched off, the other layout's file or folder): removed when gather runs, so
    that no file of an earlier run is presented as current. Folders end in `/`."""
    written = {name for writer in writers for name in writer.leaves(parts)}
    every = {name for writer in all_writers().values() for layout in (False, True) for name in writer.leaves(layout)}
    folders = [name for name in written if name.endswith("/")]
    return [os.path.join(folder, name) for name in sorted(every - written)
            if not any(name.startswith(kept) for kept in folders)]
