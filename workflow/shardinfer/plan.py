"""The plan: contiguous row ranges covering the input exactly, and the input's fingerprint.

The plan file is the contract that gather proves the shard files against. Planning never
imports torch and reads the input once, streaming.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from shardinfer.atomic import write_json_atomic
from shardinfer.config import InputSettings
from shardinfer.errors import UserError
from shardinfer.tables import scan_input

log = logging.getLogger(__name__)
PLAN_VERSION = 1


def split_ranges(rows: int, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous [start, end) ranges over 0..rows whose sizes differ by at most one."""
    if shards < 1:
        raise UserError(f"shards must be an integer >= 1; got {shards!r}")
    base, extra = divmod(rows, shards)
    ranges, start = [], 0
    for shard in range(shards):
        end = start + base + (1 if shard < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def fingerprint(path: str) -> dict:
    """Size and modification time: cheap to recheck before every shard and at gather."""
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


@dataclass(frozen=True)
class Plan:
    plan_id: str
    input_path: str
    input_fingerprint: dict
    rows: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def shards(self) -> int:
        return len(self.ranges)

    def check_input_unchanged(self) -> None:
        """Refuse to use a plan whose input file has changed since planning."""
        if not Path(self.input_path).is_file():
            raise UserError(f"input `{self.input_path}` has disappeared since planning; rerun the plan")
        now = fingerprint(self.input_path)
        if now != self.input_fingerprint:
            raise UserError(
                f"input `{self.input_path}` changed since planning (size/mtime {self.input_fingerprint} -> {now}); "
                "rerun the plan (snakemake reruns it when the input is newer)"
            )


def make_plan(inp: InputSettings, shards: int) -> Plan:
    """Scan the input and cut it into `shards` ranges; an empty or unusable input is refused."""
    stamp = fingerprint(inp.path)
    scan = scan_input(inp)
    if scan.rows == 0:
        raise UserError(f"input `{inp.path}` has no rows; there is nothing to run")
    if scan.null_texts and inp.null_text == "error":
        listed = ", ".join(map(str, scan.first_null_rows))
        raise UserError(
            f"input.text_column `{inp.text_column}` is null in {scan.null_texts} row(s) (first: {listed}); "
            "fix the input or set input.null_text: empty"
        )
    ranges = tuple(split_ranges(scan.rows, shards))
    body = {"input_path": inp.path, "input_fingerprint": stamp, "rows": scan.rows, "ranges": ranges}
    plan_id = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return Plan(plan_id=plan_id, input_path=inp.path, input_fingerprint=stamp, rows=scan.rows, ranges=ranges)


def write_plan(plan: Plan, path: str) -> None:
    write_json_atomic(
        path,
        {
            "version": PLAN_VERSION,
            "plan_id": plan.plan_id,
            "input": {"path": plan.input_path, **plan.input_fingerprint},
            "rows": plan.rows,
            "shards": [{"shard": i, "start": s, "end": e} for i, (s, e) in enumerate(plan.ranges)],
        },
    )


def read_plan(path: str) -> Plan:
    data = json.loads(Path(path).read_text())
    if data.get("version") != PLAN_VERSION:
        raise UserError(f"plan `{path}` has version {data.get('version')!r}, expected {PLAN_VERSION}; rerun the plan")
    shards = data["shards"]
    return Plan(
        plan_id=data["plan_id"],
        input_path=data["input"]["path"],
        input_fingerprint={"size": data["input"]["size"], "mtime_ns": data["input"]["mtime_ns"]},
        rows=data["rows"],
        ranges=tuple((s["start"], s["end"]) for s in shards),
    )


def remove_stale_shards(shard_dir: str, shards: int) -> list[str]:
    """Delete shard files numbered beyond the new plan: they belong to an earlier plan.

    Files of shards the new plan has are remade by Snakemake (the plan is newer than they are).
    """
    folder = Path(shard_dir)
    stale = [p for p in folder.glob("*.parquet") if p.stem.isdigit() and int(p.stem) >= shards] if folder.is_dir() else []
    for path in stale:
        path.unlink()
        log.info("removed %s, a shard of an earlier plan", path)
    return [str(p) for p in stale]


def run_plan(inp: InputSettings, shards: int, plan_path: str, shard_dir: str | None = None) -> Plan:
    """The plan rule: scan, cut, write; logs the ranges."""
    plan = make_plan(inp, shards)
    if shard_dir is not None:
        remove_stale_shards(shard_dir, shards)
    write_plan(plan, plan_path)
    sizes = [e - s for s, e in plan.ranges]
    log.info("planned %d rows of %s into %d shards (sizes %d..%d), plan %s",
             plan.rows, inp.path, plan.shards, min(sizes), max(sizes), plan.plan_id)
    return plan
