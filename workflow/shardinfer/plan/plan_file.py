"""The plan: contiguous row ranges covering the input exactly, and the input's identity.

The plan file is the contract that gather proves the shard files against. Planning never
imports torch and reads the input once, streaming, part by part (a single file is one part;
`shardinfer.input.parts`), each part's content digest computed alongside (`shardinfer.input.identity`). It
records every part (path, first row, rows, size, mtime, digest) and, per shard, its pieces: the
part rows it holds and, for a format with positions, where they lie in the file (`Span`: the
format's own positions to start and stop at, which the plan stores and never reads), plus the
read columns' types over all parts (`Format.fields`), so that a shard reads only its part of the
input. A
part that shards could not read by range (a gzipped CSV/JSONL, a Parquet file of huge row groups)
is copied once into the plan's staged folder so that they can (`shardinfer.input.staging`); the plan
records the copy with its part.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from shardinfer.core.atomic import write_json_atomic
from shardinfer.core.errors import UserError
from shardinfer.input.formats import format_named
from shardinfer.input.formats.base import Span
from shardinfer.input.formats.text_blocks import span_of_plan_v6
from shardinfer.input.image_files import refuse_in_bucket, shard_images
from shardinfer.input.images import input_folder
from shardinfer.input.parts import Part, PartsScan, Piece, check_same_parts, iter_pieces, one_file, scan_parts
from shardinfer.input.shard_cuts import Cut, cut_part, cut_pieces, read_as_cut, whole_parts, write_cuts
from shardinfer.input.staging import stage_part, staged_name, wants_staging
from shardinfer.plan.balance import COST_ESTIMATE, balanced_ranges, estimated_tokens
from shardinfer.settings.config import InputSettings

log = logging.getLogger(__name__)
# 3: the input's content digest; 4: each shard's span (CSV/JSONL) and the JSONL fields;
# 5: the input's parts (path, first row, rows, size, mtime, digest) and each shard's pieces of them;
# 6: each part's staged copy (path, size, mtime, digest) or null; `input.fields` (was jsonl_fields), for
# Parquet parts of differing types too (and, since, each shard's `cut` or null: absent reads as null; and
# its `images`, absent without images named by path);
# 7: a span is the format's own positions {row, at, stop} (6: a text span {row, line, byte, stop_byte}),
# and `input.options` the format's options as configured (6: `input.split`). Version 6 is still read.
PLAN_VERSION = 7
READ_VERSIONS = (6, 7)


def fields_to_json(fields: pa.Schema) -> dict:
    """The parts' types for the plan file: readable types, and the Arrow schema itself (IPC, base64)."""
    return {"types": {f.name: str(f.type) for f in fields},
            "arrow_schema": base64.b64encode(fields.serialize().to_pybytes()).decode()}


def fields_from_json(data: dict) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["arrow_schema"])))


@dataclass(frozen=True)
class Plan:
    plan_id: str
    input_path: str  # input.path as configured: a file, a directory or a glob
    parts: tuple[Part, ...]  # its files in row order, each with its identity when planned
    rows: int
    ranges: tuple[tuple[int, int], ...]
    costs: tuple[int, ...]  # estimated tokens per shard (COST_ESTIMATE)
    pieces: tuple[tuple[Piece, ...], ...]  # per shard, its rows in each part it overlaps
    fields: pa.Schema | None = None  # the types every part is read in (`Format.fields`)
    # The format's options as an input section (`{"hf_dataset": {"split": "test"}}`; a plan of version 6:
    # `{"split": ...}`), with which `input_path` resolves to its parts again.
    options: dict = dataclasses.field(default_factory=dict)
    # Per shard, its rows written out for jobs without a shared filesystem (shardinfer.input.shard_cuts);
    # None: the shards read the input's parts.
    cuts: tuple[Cut, ...] | None = None
    reads_cut: bool = False  # as a shard job reads it: its `parts` are its own cut (`reading_cut`)
    # Per shard, the image files its rows name and their stats' digest (`image_files.shard_images`);
    # None: no image is given by path.
    images: tuple[dict, ...] | None = None

    @property
    def shards(self) -> int:
        return len(self.ranges)

    def _as_read(self, inp: InputSettings) -> InputSettings:
        return read_as_cut(inp) if self.reads_cut else inp

    def shard_rows(self, inp: InputSettings, shard: int, from_row: int = 0) -> Iterator[tuple[int, pa.RecordBatch]]:
        """A shard's rows as (the input's row number of the batch's first row, batch), in the
        plan's types over all parts; from row `from_row` on when a resumed shard keeps those before."""
        return iter_pieces(self._as_read(inp), self.pieces[shard], self.fields, from_row)

    def no_rows(self, inp: InputSettings) -> pa.RecordBatch:
        """The read columns without rows, in the types a read gives them (`Format.no_rows`, of the first
        part): for the shard files of an input that has no rows, which no shard's rows can type."""
        inp = self._as_read(inp)
        return format_named(inp.format).no_rows(one_file(inp, self.parts[0].read_path), self.fields)

    def for_shard(self, shard: int, cut: str | None = None) -> Plan:
        """The plan as shard `shard`'s job reads it: from `cut`, its copy of the shard's cut (a job
        without a shared filesystem), else from the input's parts, refused if any changed since planning."""
        if cut is not None:
            return self.reading_cut(shard, cut)
        self.check_input_unchanged()
        return self

    def reading_cut(self, shard: int, path: str) -> Plan:
        """The plan as a job without the input's files reads shard `shard`: its rows from its cut, the
        local copy `path` (refused unless its bytes are the planned ones), none of the other shards'."""
        if self.cuts is None:
            raise UserError(f"plan {self.plan_id} has no shard cuts (planned with a shared filesystem); rerun the plan")
        self.cuts[shard].check(path, shard)
        part = cut_part(self.cuts[shard], path, self.ranges[shard][0])
        return dataclasses.replace(self, parts=(part,), pieces=cut_pieces(part, shard, self.shards), reads_cut=True)

    def named_as(self, names: tuple[str, ...]) -> Plan:
        """The plan with its parts named `names` (the input's paths as configured) instead of where the
        plan job found their storage copies, so that the plan file says which objects were planned; and
        without the copies' mtimes, which are the download's: the same objects always plan alike."""
        renamed = {part.path: dataclasses.replace(part, path=name, mtime_ns=0) for part, name in zip(self.parts, names)}
        pieces = tuple(tuple(dataclasses.replace(piece, part=renamed[piece.part.path]) for piece in shard)
                       for shard in self.pieces)
        parts = tuple(renamed.values())
        return dataclasses.replace(self, parts=parts, pieces=pieces,
                                   plan_id=plan_id_of(self.input_path, parts, self.rows, self.ranges))

    def write_cuts(self, inp: InputSettings, paths: list[str]) -> Plan:
        """Write each shard's rows to its cut (`paths`, in shard order); the plan recording them."""
        if len(paths) != self.shards:
            raise UserError(f"the plan rule got {len(paths)} cut paths for {self.shards} shards; rerun the plan")
        rows = iter_pieces(inp, whole_parts(self.pieces), self.fields)
        return dataclasses.replace(self, cuts=write_cuts(rows, self.ranges, self.no_rows(inp).schema, paths))

    def check_input_unchanged(self) -> None:
        """Refuse to use a plan whose input has changed since planning: a part added, removed or
        renamed (the input resolved again), or one of another size or mtime; or a staged copy
        removed or of another size or mtime."""
        check_same_parts(self.input_path, self.parts, self.options)
        for part in self.parts:
            part.check_unchanged()


def make_plan(inp: InputSettings, shards: int, max_length: int, staged_dir: str | None = None,
              overhead: int = 0, image_cost: int = 0, in_bucket: bool = False) -> Plan:
    """Scan the input and cut it into `shards` ranges of about equal estimated cost (each row's
    tokens plus the task's `overhead`, what its batches pay: `PlanCost.overhead`, plus
    `image_cost` tokens per image: `PlanCost.image_params`); an unusable input is refused, one
    without rows gives empty shards. Parts that the shards could not read by range are staged into
    `staged_dir` (`input.stage`; None: none is). Images named by path are refused `in_bucket`."""
    scan = scan_parts(inp)
    check_rows(inp, scan)
    named = scan.image_names()
    if in_bucket:
        refuse_in_bucket(inp.image_columns[0] if inp.image_columns else "", named)
    row_costs = estimated_tokens(scan.chars(), max_length) + overhead
    images = scan.images()
    if images is not None:
        row_costs = row_costs + images.astype(np.int64) * image_cost
    ranges = tuple(balanced_ranges(row_costs, shards))
    costs = tuple(int(row_costs[s:e].sum()) for s, e in ranges)
    plan_id = plan_id_of(inp.path, scan.parts, scan.rows, ranges)
    pieces = scan.pieces(list(ranges))
    if staged_dir is not None:
        scan = dataclasses.replace(scan, parts=staged_parts(inp, scan.parts, pieces, staged_dir))
        pieces = scan.pieces(list(ranges))  # the same pieces, of the parts with their copies
    options = {format_named(inp.format).options_section: inp.options} if inp.options else {}
    return Plan(plan_id=plan_id, input_path=inp.path, parts=scan.parts, rows=scan.rows, ranges=ranges, costs=costs,
                pieces=pieces, fields=scan.fields, options=options,
                images=shard_images(named, ranges, input_folder(inp.path)) if named else None)


def plan_id_of(input_path: str, parts: tuple[Part, ...], rows: int, ranges: tuple[tuple[int, int], ...]) -> str:
    """What names a plan: a digest of the input's parts (each with its identity) and the ranges."""
    body = {"input_path": input_path, "parts": [asdict(part) for part in parts], "rows": rows, "ranges": ranges}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def staged_parts(inp: InputSettings, parts: tuple[Part, ...], pieces: tuple[tuple[Piece, ...], ...], folder: str
                 ) -> tuple[Part, ...]:
    """The parts, each with its staged copy in `folder` where its shards (their `pieces`) could not
    read it by range."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    held_by_part: dict[str, list[tuple[int, int]]] = {}
    for piece in (piece for shard in pieces for piece in shard):
        held_by_part.setdefault(piece.part.path, []).append((piece.start, piece.end))
    staged = []
    for position, part in enumerate(parts):
        held = held_by_part.get(part.path, [])
        if wants_staging(inp, part.path, part.rows, part.size, held):
            target = Path(folder) / staged_name(position, inp.format)
            part = dataclasses.replace(part, staged=stage_part(inp, part.path, part.digest, held, target))
            log.info("staged %s as %s (%d bytes), for its %d shards to read by range", part.path,
                     part.staged.path, part.staged.size, len(held))
        staged.append(part)
    return tuple(staged)


def check_rows(inp: InputSettings, scan: PartsScan) -> None:
    """Refuse null texts unless the config runs them as "". An input without rows is no error (a daily
    job on an empty split): every shard is empty, and gather proves and writes an empty table."""
    if scan.rows == 0:
        log.warning("WARNING input `%s` has no rows: every shard is empty, and the table will have none", inp.path)
    if scan.null_texts and inp.null_text == "error":
        listed = ", ".join(map(str, scan.first_null_rows()))
        named = " or ".join(f"{key} `{column}`" for column, key in zip(inp.task_columns, inp.column_keys)
                            if column in (*inp.text_columns, *inp.conversation_columns))
        raise UserError(f"{named} is null in {scan.null_texts} row(s) (first: {listed}); "
                        "fix the input or set input.null_text: empty")


def write_plan(plan: Plan, path: str) -> None:
    """The plan file. Each part is {path, first_row, rows, size, mtime_ns, digest, staged: null or
    its copy's {path, size, mtime_ns, digest, columns}}; each shard's
    pieces are {part (its position in `input.parts`), start, end (the part's own row numbers),
    span}. A piece's `span` (null for a format without positions) is {row, at, stop}: read from the
    format's position `at`, where the part's row `row` begins, and stop before position `stop`
    (null: the end); a text format's positions are {line, byte}. The JSONL fields (or the types of
    Parquet parts that differ) are written once, under `input.fields`; the format's options as
    configured under `input.options`. With images named by path, each shard's `images`:
    {paths (the files its rows name), stats (a digest of their sizes and mtimes)}:
    `shardinfer.input.image_files`."""
    position = {part.path: k for k, part in enumerate(plan.parts)}
    fields = {"fields": fields_to_json(plan.fields)} if plan.fields is not None else {}
    write_json_atomic(
        path,
        {
            "version": PLAN_VERSION,
            "plan_id": plan.plan_id,
            "input": {"path": plan.input_path, "options": plan.options,
                      "parts": [asdict(part) for part in plan.parts], **fields},
            "rows": plan.rows,
            "cost": {"estimate": COST_ESTIMATE, "total": sum(plan.costs)},
            "shards": [{"shard": i, "start": s, "end": e, "rows": e - s, "cost": c,
                        "pieces": [{"part": position[piece.part.path], "start": piece.start, "end": piece.end,
                                    "span": piece.span and piece.span.to_json()} for piece in pieces],
                        "cut": plan.cuts and asdict(plan.cuts[i]),
                        **({"images": plan.images[i]} if plan.images else {})}
                       for i, ((s, e), c, pieces) in enumerate(zip(plan.ranges, plan.costs, plan.pieces))],
        },
    )


def read_plan(path: str) -> Plan:
    data = json.loads(Path(path).read_text())
    version = data.get("version")
    if version not in READ_VERSIONS:
        raise UserError(f"plan `{path}` has version {version!r}, expected {PLAN_VERSION}; rerun the plan")
    shards = data["shards"]
    fields = fields_from_json(data["input"]["fields"]) if "fields" in data["input"] else None
    parts = tuple(Part.from_json(part) for part in data["input"]["parts"])
    span_of = Span.from_json if version == PLAN_VERSION else span_of_plan_v6

    def piece(entry: dict) -> Piece:
        span = entry["span"] and span_of(entry["span"], fields)
        return Piece(parts[entry["part"]], entry["start"], entry["end"], span)

    return Plan(
        plan_id=data["plan_id"],
        input_path=data["input"]["path"],
        parts=parts,
        rows=data["rows"],
        ranges=tuple((s["start"], s["end"]) for s in shards),
        costs=tuple(s["cost"] for s in shards),
        pieces=tuple(tuple(piece(p) for p in s["pieces"]) for s in shards),
        fields=fields,
        options=data["input"]["options"] if version == PLAN_VERSION else _v6_options(data["input"]),
        cuts=tuple(Cut.from_json(s["cut"]) for s in shards) if shards and shards[0].get("cut") else None,
        images=tuple(s["images"] for s in shards) if shards and "images" in shards[0] else None,
    )


def _v6_options(recorded: dict) -> dict:
    """A version 6 plan's format options: its `split`, as the flat key it was."""
    return {"split": recorded["split"]} if recorded.get("split") is not None else {}


def remove_stale_shards(shard_dir: str, shards: int, files_dir: str | None = None) -> list[str]:
    """Delete shard files numbered beyond the new plan (with their pieces, `.N.parquet.data` and
    `N.k.parquet`, and records, `.N.record.json`: shardinfer.contract.pieces), a stopped job's committed windows
    (`.N.parquet.windows`), and their files folders (`files_dir/N`, and a stopped job's
    `files_dir/.N.partial`): they belong to an earlier plan.

    Files of shards the new plan has are remade by Snakemake (the plan is newer than they are);
    their committed windows are another plan's, which resuming removes.
    """
    pattern = r"(\d+)\.parquet|(\d+)\.\d+\.parquet|\.(\d+)\.parquet\.(?:data|windows)|\.(\d+)\.record\.json"
    stale = [p for p in _numbered(shard_dir, pattern) if p[0] >= shards]
    for _, path in stale:
        _remove(path)
        log.info("removed %s, a shard of an earlier plan", path)
    folders = [p for p in _numbered(files_dir, r"(\d+)|\.(\d+)\.partial") if p[0] >= shards] if files_dir else []
    for _, path in folders:
        _remove(path)
        log.info("removed %s, the files of a shard of an earlier plan", path)
    return [str(path) for _, path in stale + folders]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _numbered(folder: str, pattern: str) -> list[tuple[int, Path]]:
    """(shard number, path) of each entry of `folder` whose whole name matches `pattern` (one group set)."""
    if not Path(folder).is_dir():
        return []
    matches = ((re.fullmatch(pattern, entry.name), entry) for entry in sorted(Path(folder).iterdir()))
    return [(int(next(g for g in match.groups() if g is not None)), entry) for match, entry in matches if match]


def run_plan(inp: InputSettings, shards: int, max_length: int, plan_path: str, shard_dir: str | None = None,
             files_dir: str | None = None, staged_dir: str | None = None, overhead: int = 0,
             local_parts: list[str] | None = None, cut_paths: list[str] | None = None, image_cost: int = 0) -> Plan:
    """The plan rule: scan, cut, stage, write; logs the ranges. Without a shared filesystem the job
    reads its storage copies of the parts (`local_parts`, in the input's order) and writes each shard's
    rows to its cut (`cut_paths`: shardinfer.input.shard_cuts) instead of staging any part, and refuses
    images named by path (`image_files.refuse_in_bucket`)."""
    read = dataclasses.replace(inp, parts=tuple(local_parts)) if local_parts else inp
    plan = make_plan(read, shards, max_length, staged_dir, overhead, image_cost, in_bucket=cut_paths is not None)
    if cut_paths is not None:
        plan = plan.write_cuts(read, cut_paths)
        log.info("cut the shards' rows into %d files, %d bytes in all (the input: %d bytes)", plan.shards,
                 sum(cut.size for cut in plan.cuts), sum(part.size for part in plan.parts))
    if local_parts:
        plan = plan.named_as(inp.files)
    if shard_dir is not None:
        remove_stale_shards(shard_dir, shards, files_dir)
    write_plan(plan, plan_path)
    sizes = [e - s for s, e in plan.ranges]
    parts = f" ({len(plan.parts)} parts)" if len(plan.parts) > 1 else ""
    log.info("planned %d rows of %s%s into %d shards (rows %d..%d, estimated cost in tokens %d..%d), plan %s",
             plan.rows, inp.path, parts, plan.shards, min(sizes), max(sizes), min(plan.costs), max(plan.costs),
             plan.plan_id)
    return plan
