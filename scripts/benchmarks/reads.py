"""The bytes-read and bytes-downloaded checks of `benchmarks.load_check`: one table of about
`--read-gb` GB in every input format, planned into `--shards` ranges and read as the shard jobs read
it, counting what they read (/proc/self/io rchar), and what each shard job downloads without a
shared filesystem (the plan file, its own cut, the model's copies).
"""

from __future__ import annotations

import time
from pathlib import Path

import tiny_workflow as tiny
from benchmarks import REPO
from benchmarks.timing import timed


def big_table(gigabytes: float, seed: int = 0):
    """About `gigabytes` of text in rows of 20 to 400 characters: random letters and spaces, with a
    comma, a quote or a newline now and then, so CSV quotes some values and JSONL escapes them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer((b"abcdefghijklmnopqrstuvwxyz" * 9 + b" " * 50)[:253] + b',"\n', np.uint8)  # 256
    lengths = rng.integers(20, 400, size=int(gigabytes * 1e9 / 210))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    chars = alphabet[rng.integers(0, 256, size=int(offsets[-1]), dtype=np.uint8)]
    text = pa.LargeStringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(chars)).cast(pa.string())
    ids = pc.binary_join_element_wise("row-", pc.cast(pa.array(np.arange(len(lengths))), pa.string()), "")
    return pa.table({"id": ids, "text": text})


BLOCK_BYTES = 64 << 20  # the blocks each format is written in (row groups, batches, stripes)


def write_formats(folder: Path, gigabytes: float) -> dict[str, Path]:
    """The same table in every format (its own writer), each compressible one gzipped too, and a
    Parquet file of one row group (what pandas writes)."""
    import gzip
    import shutil

    from shardinfer.input.formats import all_formats, format_named

    table = big_table(gigabytes)
    folder.mkdir(parents=True, exist_ok=True)
    block_rows = max(1, table.num_rows * BLOCK_BYTES // max(table.nbytes, 1))
    paths = {}
    for fmt in all_formats().values():
        paths[fmt.name] = folder / f"input{fmt.extensions[0] if fmt.extensions else '-' + fmt.name}"
        fmt.write(table, str(paths[fmt.name]), block_rows)
        if fmt.compressible:
            paths[f"{fmt.name}.gz"] = packed = folder / f"{paths[fmt.name].name}.gz"
            with open(paths[fmt.name], "rb") as plain, gzip.open(packed, "wb", compresslevel=1) as sink:
                shutil.copyfileobj(plain, sink, 1 << 22)
    paths["parquet, one row group"] = folder / "one-group.parquet"
    format_named("parquet").write(table, str(paths["parquet, one row group"]), table.num_rows)
    return paths


def settings_of(path: Path):
    """The input settings of one written file or folder, its format and parts resolved."""
    from shardinfer.input.discovery import resolve_input
    from shardinfer.settings.config import InputSettings

    fmt, parts = resolve_input(str(path))
    return InputSettings(path=str(path), format=fmt, parts=parts, text_column="text", keep_columns=("id",),
                         null_text="error")


def size_of(path: Path) -> int:
    """A file's bytes, or a folder's files' together."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measured(figures: dict, name: str, function, *args):
    """Run `function`, recording the bytes it read (`<name>_bytes`) and its seconds (`<name>_s`)."""
    before, started = tiny.bytes_read(), time.perf_counter()
    result = function(*args)
    figures.update({f"{name}_bytes": tiny.bytes_read() - before, f"{name}_s": time.perf_counter() - started})
    return result


def read_all_shards(settings, plan) -> None:
    """Every shard's rows, one shard after another, as the shard jobs read them."""
    rows = sum(batch.num_rows for shard in range(plan.shards) for _, batch in plan.shard_rows(settings, shard))
    assert rows == plan.rows, (rows, plan.rows)


def read_like_the_shards(path: Path, shards: int) -> dict:
    """Plan the file into `shards` ranges (staging it where the shards could not read it by range,
    as the plan rule does by default), then read each range as its shard job does (from its span,
    or its row groups; from the staged copy if any); bytes read (page cache included) and seconds.
    A staged file is also read in place, all shards, as it would be without its copy."""
    import dataclasses
    import shutil

    from shardinfer.plan.plan_file import make_plan

    settings = settings_of(path)
    figures = {"size": size_of(path)}
    plan = measured(figures, "plan", make_plan, settings, shards, 512, str(path.parent / f"staged-{path.name}"))
    staged = plan.parts[0].staged
    figures.update(rows=plan.rows, staged=staged and staged.size)
    measured(figures, "shard", read_all_shards, settings, plan)
    if staged:
        in_place = dataclasses.replace(plan, parts=(dataclasses.replace(plan.parts[0], staged=None),))
        in_place = dataclasses.replace(in_place, pieces=tuple(
            tuple(dataclasses.replace(piece, part=in_place.parts[0]) for piece in pieces) for pieces in plan.pieces))
        measured(figures, "in_place", read_all_shards, settings, in_place)
    elif len(settings.files) == 1:  # a folder of parts: its last shard reads its own parts anyway
        measured(figures, "unspanned", read_last_from_the_start, settings, plan)
    shutil.rmtree(path.parent / f"staged-{path.name}")
    return figures


def read_last_from_the_start(settings, plan) -> None:
    """The last shard read from the file's start, as before spans (JSONL: with the types this process
    already knows; a shard job without its span also reads the whole file once more to type it)."""
    from shardinfer.input.formats import format_named
    from shardinfer.input.parts import one_file

    start, end = plan.ranges[-1]
    rows = format_named(settings.format).read_range(one_file(settings, settings.files[0]), start, end)
    assert sum(batch.num_rows for _, batch in rows) == end - start


def report_reads(folder: Path, gigabytes: float, shards: int) -> None:
    import shutil

    paths = timed(f"write {gigabytes:g} GB in every format, gzipped too, and as one-row-group parquet", write_formats,
                  folder, gigabytes)
    print(f"bytes read with {shards} shards (/proc/self/io rchar, page cache included; x = times the file's size; "
          "a staged file: times its copy's size, and in place times the file's):")
    for fmt, path in paths.items():
        f = read_like_the_shards(path, shards)
        size, read = f["size"], f["staged"] or f["size"]
        copy = f", staged a {f['staged'] / 1e9:.2f} GB copy" if f["staged"] else ""
        line = (f"  {fmt:9} {size / 1e9:.2f} GB, {f['rows']} rows: plan {f['plan_bytes'] / size:.2f}x in "
                f"{f['plan_s']:.1f} s (scan, digest{copy}); all {shards} shards {f['shard_bytes'] / read:.2f}x "
                f"in {f['shard_s']:.1f} s")
        if f["staged"]:
            line += (f"; read in place instead: {f['in_place_bytes'] / size:.2f}x in {f['in_place_s']:.1f} s "
                     f"({f['in_place_s'] / f['shard_s']:.1f}x the time)")
        elif "unspanned_bytes" in f:
            line += (f"; the last shard alone from the start, without its span: {f['unspanned_bytes'] / size:.2f}x "
                     f"in {f['unspanned_s']:.1f} s")
        print(line, flush=True)
    report_downloads(paths, shards)
    for path in paths.values():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def report_downloads(paths: dict[str, Path], shards: int) -> None:
    """Without a shared filesystem, what each shard job downloads: the plan file and its own cut
    (`shardinfer.input.shard_cuts`), which the plan job writes as the plan rule does there."""
    import shutil

    from shardinfer.plan.plan_file import make_plan, write_plan

    print(f"bytes downloaded per shard job without a shared filesystem ({shards} shards: plan.json + its cut; "
          "x = all shard jobs together, times the input's size):")
    for fmt, path in paths.items():
        folder = path.parent / f"cuts-{path.name}"
        folder.mkdir(exist_ok=True)
        settings = settings_of(path)
        started = time.perf_counter()
        plan = make_plan(settings, shards, 512).write_cuts(settings, [str(folder / f"{k}.parquet")
                                                                      for k in range(shards)])
        seconds = time.perf_counter() - started
        write_plan(plan, str(folder / "plan.json"))
        plan_bytes, cuts = (folder / "plan.json").stat().st_size, sorted(cut.size for cut in plan.cuts)
        size = size_of(path)
        print(f"  {fmt:9} {size / 1e9:.2f} GB: per shard job {plan_bytes / 1e3:.0f} kB of plan + a cut of "
              f"{cuts[0] / 1e6:.1f}..{cuts[-1] / 1e6:.1f} MB (median {cuts[len(cuts) // 2] / 1e6:.1f}); all "
              f"{(shards * plan_bytes + sum(cuts)) / size:.2f}x; plan with cuts {seconds:.1f} s", flush=True)
        shutil.rmtree(folder)
    report_model_downloads(shards)


def report_model_downloads(shards: int) -> None:
    """Beside its rows, each shard job downloads the model's copies once (`shardinfer.snakefile.stored_model`):
    the demo's model's files, as rule stage_model stages them; a tokenize job the tokenizer's alone."""
    import yaml

    from shardinfer.core.errors import UserError
    from shardinfer.hf.tokenizer_files import is_tokenizer_side
    from shardinfer.snakefile.configure import resolve_model_path
    from shardinfer.snakefile.settings_digest import directory_fingerprint

    configured = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["model"]["path"]
    try:
        files = directory_fingerprint(resolve_model_path(configured))
    except UserError as error:  # the demo's model package is not installed here
        print(f"  the model: not measured ({error})")
        return
    model = sum(size for _, size, _ in files)
    tokenizer = sum(size for name, size, _ in files if is_tokenizer_side(name))
    print(f"  and the model's copies, once per shard job: the demo's {configured} is {model / 1e6:.1f} MB "
          f"({len(files)} files), {shards} shard jobs {shards * model / 1e9:.2f} GB in all; a tokenize job "
          f"{tokenizer / 1e6:.1f} MB (the tokenizer's files)", flush=True)
