"""The plan: contiguous row ranges covering the input exactly, and the input's identity.

The plan file is the contract that gather proves the shard files against. Planning never
imports torch and reads the input once, streaming, with its content digest computed alongside
(`shardinfer.identity`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardinfer.atomic import write_json_atomic
from shardinfer.config import InputSettings
from shardinfer.errors import UserError
from shardinfer.identity import digest_alongside
from shardinfer.tables import scan_input

log = logging.getLogger(__name__)
PLAN_VERSION = 3  # 3: the input's content digest


CHARS_PER_TOKEN = 4
SPECIAL_TOKENS = 2
COST_ESTIMATE = f"tokens per row ~ ceil(characters / {CHARS_PER_TOKEN}) + {SPECIAL_TOKENS}, at most max_length"


def estimated_tokens(chars: np.ndarray, max_length: int) -> np.ndarray:
    """A row's cost before any tokenizer is loaded: its characters over ~4 per token, plus the
    special tokens, cut at max_length as the tokenizer will cut it. Never below one."""
    tokens = -(-chars.astype(np.int64) // CHARS_PER_TOKEN) + SPECIAL_TOKENS
    return np.clip(tokens, 1, max(max_length, 1))


def balanced_ranges(costs: np.ndarray, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous [start, end) ranges over the rows, each holding about the same total cost.

    Each cut goes to the row boundary nearest its share of the running total, so a shard's cost
    is off its share by at most one row's cost; equal costs give sizes within one row. No shard
    is empty while there are at least as many rows as shards (one very long row gets a shard of
    its own instead); with fewer rows, the extra shards are empty.
    """
    if shards < 1:
        raise UserError(f"shards must be an integer >= 1; got {shards!r}")
    rows = len(costs)
    before = np.concatenate([[0], np.cumsum(costs, dtype=np.int64)])  # before[i]: cost of rows < i
    targets = before[-1] * np.arange(1, shards) / shards
    after = np.searchsorted(before, targets, side="left").clip(max=rows)
    nearer_before = (after > 0) & (targets - before[np.maximum(after - 1, 0)] < before[after] - targets)
    cuts = np.maximum.accumulate(np.where(nearer_before, after - 1, after)).tolist()
    if rows >= shards:
        for k in range(len(cuts)):  # cut k ends shard k: at least one row before it and after it
            lowest = cuts[k - 1] + 1 if k else 1
            cuts[k] = min(max(cuts[k], lowest), rows - (shards - 1 - k))
    bounds = [0, *(int(c) for c in cuts), rows]
    return list(zip(bounds[:-1], bounds[1:]))


def fingerprint(path: str) -> dict:
    """Size and modification time: cheap to recheck before every shard and at gather."""
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


@dataclass(frozen=True)
class Plan:
    plan_id: str
    input_path: str
    input_fingerprint: dict
    input_digest: str  # `sha256:<hex>` of the input's bytes when it was planned (shardinfer.identity)
    rows: int
    ranges: tuple[tuple[int, int], ...]
    costs: tuple[int, ...]  # estimated tokens per shard (COST_ESTIMATE)

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


def make_plan(inp: InputSettings, shards: int, max_length: int) -> Plan:
    """Scan the input and cut it into `shards` ranges of about equal estimated cost; an empty or
    unusable input is refused."""
    stamp = fingerprint(inp.path)
    with digest_alongside(inp.path) as digest:
        scan = scan_input(inp)
    content = digest.result()
    if fingerprint(inp.path) != stamp:
        raise UserError(f"input `{inp.path}` changed while it was being planned; rerun the plan once it is complete")
    if scan.rows == 0:
        raise UserError(f"input `{inp.path}` has no rows; there is nothing to run")
    if scan.null_texts and inp.null_text == "error":
        listed = ", ".join(map(str, scan.first_null_rows))
        raise UserError(
            f"input.text_column `{inp.text_column}` is null in {scan.null_texts} row(s) (first: {listed}); "
            "fix the input or set input.null_text: empty"
        )
    row_costs = estimated_tokens(scan.chars, max_length)
    ranges = tuple(balanced_ranges(row_costs, shards))
    costs = tuple(int(row_costs[s:e].sum()) for s, e in ranges)
    body = {"input_path": inp.path, "input_fingerprint": stamp, "input_digest": content, "rows": scan.rows,
            "ranges": ranges}
    plan_id = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return Plan(plan_id=plan_id, input_path=inp.path, input_fingerprint=stamp, input_digest=content, rows=scan.rows,
                ranges=ranges, costs=costs)


def write_plan(plan: Plan, path: str) -> None:
    write_json_atomic(
        path,
        {
            "version": PLAN_VERSION,
            "plan_id": plan.plan_id,
            "input": {"path": plan.input_path, **plan.input_fingerprint, "digest": plan.input_digest},
            "rows": plan.rows,
            "cost": {"estimate": COST_ESTIMATE, "total": sum(plan.costs)},
            "shards": [{"shard": i, "start": s, "end": e, "rows": e - s, "cost": c}
                       for i, ((s, e), c) in enumerate(zip(plan.ranges, plan.costs))],
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
        input_digest=data["input"]["digest"],
        rows=data["rows"],
        ranges=tuple((s["start"], s["end"]) for s in shards),
        costs=tuple(s["cost"] for s in shards),
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


def run_plan(inp: InputSettings, shards: int, max_length: int, plan_path: str, shard_dir: str | None = None) -> Plan:
    """The plan rule: scan, cut, write; logs the ranges."""
    plan = make_plan(inp, shards, max_length)
    if shard_dir is not None:
        remove_stale_shards(shard_dir, shards)
    write_plan(plan, plan_path)
    sizes = [e - s for s, e in plan.ranges]
    log.info("planned %d rows of %s into %d shards (rows %d..%d, estimated tokens %d..%d), plan %s",
             plan.rows, inp.path, plan.shards, min(sizes), max(sizes), min(plan.costs), max(plan.costs), plan.plan_id)
    return plan
