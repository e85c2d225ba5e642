"""The proof: the shard files add up to the input, row for row, before gather writes anything.

The plan says what must exist. Every check holds or gather writes nothing: the input is unchanged
(the same parts, each of the planned size, mtime, content digest and rows), each planned shard's
files belong to this plan and these settings, and their `index` column is exactly its planned
range, in order (`shardinfer.proof.shards`). A shard whose files are no longer as its job left them
has its bytes or values checked again before they are used (`shardinfer.proof.values`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from shardinfer.contract.pieces import record_path
from shardinfer.contract.row_files import staging_folder
from shardinfer.contract.shard_file import IMAGES_READ
from shardinfer.core.errors import ProofError
from shardinfer.input.identity import digest_alongside
from shardinfer.input.image_files import image_changed
from shardinfer.input.images import input_folder
from shardinfer.input.parts import Part, one_file, refuse_other_parts
from shardinfer.input.scan import count_rows
from shardinfer.plan.plan_file import Plan
from shardinfer.proof.shards import ShardFile, prove_recorded, prove_shard
from shardinfer.settings.config import InputSettings

log = logging.getLogger(__name__)


def refuse_stray_files(shards: list[ShardFile]) -> None:
    """Anything in the shard folder that the plan did not ask for: not a planned shard's file, piece or
    record (a job's `.partial` leftover aside)."""
    planned = {Path(piece.path).resolve() for shard in shards for piece in shard.files_in_order}
    planned |= {record_path(shard.path).resolve() for shard in shards}
    for folder in sorted({Path(shard.path).resolve().parent for shard in shards}):
        for entry in sorted(folder.iterdir()):
            if entry.resolve() not in planned and not (entry.name.startswith(".") and entry.name.endswith(".partial")):
                raise ProofError(f"stray file `{entry}` in the shard folder is not part of the plan; remove it")


def refuse_stray_folders(files_folders: list[str]) -> None:
    """Anything in the files root (`results/files`) that is not a planned shard's files folder (a
    job's `.<shard>.partial` staging leftover aside): another plan's folder, or one made by hand."""
    planned = {Path(p).absolute() for p in files_folders}
    allowed = planned | {staging_folder(p) for p in planned}
    for root in sorted({path.parent for path in planned if path.parent.is_dir()}):
        for entry in sorted(root.iterdir()):
            if entry not in allowed:
                raise ProofError(f"stray entry `{entry}` in the files folder is not a planned shard's; remove it")


def prove(plan: Plan, shard_paths: list[str], inp: InputSettings, digest: str,
          files_folders: list[str] | None = None, local_parts: list[str] | None = None,
          part_names: list[str] | None = None, records: list[str] | None = None) -> list[ShardFile]:
    """Every proof that must hold before anything is written; returns the proven shards in order.
    `files_folders`: each shard's expected files folder, when the task may write files. `local_parts`:
    the job's storage copies of the parts, in the input's order (no shared filesystem), proven by
    their content alone: a copy's path and mtime are not the original's; `part_names`: their names
    as this job's listing of the bucket found them, which must be the planned ones. `records`: without
    a shared filesystem, each shard's record, by which gather proves the parts the shard jobs wrote
    into the bucket (`shard_paths`: their names) without downloading them."""
    prove_input(plan, inp, local_parts, part_names)
    if len(shard_paths) != plan.shards:
        raise ProofError(f"gather got {len(shard_paths)} shard files but the plan has {plan.shards} shards")
    if records is not None:
        return [prove_recorded(plan, i, record, name, digest)
                for i, (record, name) in enumerate(zip(records, shard_paths))]
    folders = list(files_folders or [None] * plan.shards)
    if len(folders) != plan.shards:
        raise ProofError(f"gather got {len(folders)} files folders but the plan has {plan.shards} shards")
    shards = [prove_shard(plan, i, path, digest, folder) for i, (path, folder) in enumerate(zip(shard_paths, folders))]
    refuse_stray_files(shards)
    refuse_changed_images(shards, inp)
    if files_folders:
        refuse_stray_folders(files_folders)
    with_rows = [s for s in shards if s.rows]  # an empty shard never loaded the task: custom columns unknown
    for shard in with_rows[1:]:
        if not shard.schema.equals(with_rows[0].schema):
            raise ProofError(f"shard {shard.shard} (`{shard.path}`): columns {shard.schema} differ from shard "
                             f"{with_rows[0].shard}'s {with_rows[0].schema}")
    total = sum(s.rows for s in shards)
    if total != plan.rows:
        raise ProofError(f"shards hold {total} rows in all, the input {plan.rows}")
    return shards


def refuse_changed_images(shards: list[ShardFile], inp: InputSettings) -> None:
    """Every image file a shard job read by path (its stats' IMAGES_READ) is still what it read
    (`image_files.image_changed`: a stat each, the bytes only of a file whose stats moved); a file
    replaced after its shard read it would leave a stale row in the table."""
    folder = input_folder(inp.path)
    for shard in shards:
        for name, read in sorted((shard.stats.get(IMAGES_READ) or {}).items()):
            why = image_changed(folder, name, read)
            if why is not None:
                raise ProofError(f"input.image_column `{inp.image_columns[0]}`: image `{name}` (row {read['row']}) "
                                 f"{why} since shard {shard.shard} read it; rerun that shard (snakemake --forcerun "
                                 f"{shard.path})")


def prove_input(plan: Plan, inp: InputSettings, local_parts: list[str] | None = None,
                part_names: list[str] | None = None) -> None:
    """The input is the one planned: each part unchanged, by its content (see `prove`)."""
    if local_parts is None:
        plan.check_input_unchanged()
    else:
        refuse_other_parts(plan.input_path, part_names or [], plan.parts)
        if len(local_parts) != len(plan.parts):
            raise ProofError(f"gather got {len(local_parts)} input parts but the plan has {len(plan.parts)}")
        log.info("proving the input by its content: %d part(s) downloaded from storage", len(local_parts))
    for part, path in zip(plan.parts, local_parts or [part.path for part in plan.parts]):
        check_part(plan, part, inp, path)


def check_part(plan: Plan, part: Part, inp: InputSettings, path: str | None = None) -> None:
    """Read a part once, counting its rows with its content digest alongside (a second thread):
    refuse one whose bytes are not those planned, though its size and mtime are (an edit with the
    mtime put back, or a same-sized file copied over with `cp -p`), or that holds other rows; and
    one whose staged copy, which its shards read, is not the one the plan wrote."""
    copy = path not in (None, part.path)  # read where this job finds its storage copy
    path = path or part.path
    with digest_alongside(path) as content:
        rows = count_rows(one_file(inp, path), plan.fields)
    if content.result() != part.digest:
        same = "" if copy else "same size and mtime, "
        raise ProofError(f"input `{part.path}` changed since planning: {same}other content "
                         f"({part.digest} -> {content.result()}); rerun the plan (snakemake --forcerun plan)")
    if rows != part.rows:
        raise ProofError(f"input `{part.path}` now has {rows} rows, the plan {part.rows}; rerun the plan")
    if part.staged:
        part.staged.check_content(part.path)
