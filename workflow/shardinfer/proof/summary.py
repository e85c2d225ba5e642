"""results/summary.json: the proven run in figures, made of the shard files' stats (what each
job recorded: `shardinfer.shard.stats`) and the plan. The report and the terminal read it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from shardinfer.contract.shard_file import IMAGES_READ, computed
from shardinfer.plan.plan_file import Plan
from shardinfer.proof.prove import ShardFile
from shardinfer.settings.config import InputSettings
from shardinfer.tasks import task_totals


def _total(shards: list[ShardFile], key: str) -> int:
    return sum(s.stats.get(key) or 0 for s in shards)


def _computed(shards: list[ShardFile], key: str) -> int:
    """Over the shard jobs that finished the shards: what rates over their span divide."""
    return sum(computed(s.stats, key) for s in shards)


def wall_clock(shards: list[ShardFile]) -> tuple[float, float] | None:
    """The run's span: first shard job's start to last shard's end (epoch seconds), or None when a
    shard file predates these stats (a shard kept from an earlier version of the workflow)."""
    starts, ends = [s.stats.get("started") for s in shards], [s.stats.get("ended") for s in shards]
    if not shards or None in starts or None in ends:
        return None
    return min(starts), max(ends)


def run_facts(plan: Plan, shards: list[ShardFile], model: dict) -> dict:
    """The run at a glance: what ran where, and rows/s and real tokens/s over its wall time, not
    over summed shard seconds, so idle slots and start-up count against it as a user sees them."""
    real, padded, span = _total(shards, "real_tokens"), _total(shards, "padded_tokens"), wall_clock(shards)
    wall = round(span[1] - span[0], 3) if span else None
    rows, tokens = _computed(shards, "rows"), _computed(shards, "real_tokens")
    return {
        "rows": plan.rows, "shards": plan.shards, "task": model.get("task"), "model": model.get("path"),
        "adapter": model.get("adapter"), "max_length": model.get("max_length"),
        "devices": sorted({s.stats["device"] for s in shards if s.stats.get("device")}),
        "dtype": ", ".join(sorted({s.stats["dtype"] for s in shards if s.stats.get("dtype")})),
        "started": span[0] if span else None, "ended": span[1] if span else None, "wall_s": wall,
        "rows_per_s": round(rows / wall, 2) if wall else None,
        "real_tokens_per_s": round(tokens / wall, 2) if wall else None, "resumed_rows": plan.rows - rows,
        "real_tokens": real, "padded_tokens": padded,
        "padding_ratio": round(padded / real, 4) if real else None, "truncated": _total(shards, "truncated"),
        **totals_facts(shards, wall, task_totals(model.get("task"))),
    }


def totals_facts(shards: list[ShardFile], wall: float | None, totals: Iterable[str]) -> dict:
    """Each of the task's running totals that its shards recorded (`Reporting.totals`: generated tokens)
    over the run, and per second over the run's wall time (`<total>_per_s`)."""
    facts = {}
    for name in totals:
        if any(name in s.stats for s in shards):
            per_s = _computed(shards, name) / wall if wall else None
            facts.update({name: _total(shards, name), f"{name}_per_s": round(per_s, 2) if wall else None})
    return facts


def token_lengths(shards: list[ShardFile]) -> dict[str, int]:
    """Rows per real token length over all shards (sparse, by length): the report's histogram."""
    total: Counter = Counter()
    for shard in shards:
        total.update({int(length): count for length, count in (shard.stats.get("token_lengths") or {}).items()})
    return {str(length): total[length] for length in sorted(total)}


# A shard job's stats that the summary holds once for the run (the histogram), beside them (rows), or
# not at all (the image files read, one entry per file: gather proves them). Every other stat a job
# records (a task's own, such as generated_tokens or engine_start_s) is in its per_shard entry as
# recorded: no list of them to keep here.
PER_SHARD_AGGREGATED = ("rows", "token_lengths", IMAGES_READ)


def summarize(plan: Plan, shards: list[ShardFile], inp: InputSettings, model: dict) -> dict:
    run = run_facts(plan, shards, model)
    return {
        "rows": plan.rows,
        "shards": plan.shards,
        "plan_id": plan.plan_id,
        "input": inp.path,
        "model": model,
        "truncated": run["truncated"],
        "padding_ratio": run["padding_ratio"],
        "per_shard": [
            {"shard": s.shard, "start": plan.ranges[s.shard][0], "end": plan.ranges[s.shard][1], "rows": s.rows,
             "estimated_tokens": plan.costs[s.shard],
             **{k: v for k, v in s.stats.items() if k not in PER_SHARD_AGGREGATED}}
            for s in shards
        ],
        "run": run,
        "token_lengths": token_lengths(shards),
    }
