"""`scripts/benchmark.py --task generate --variants`: what the generation features cost, same prompts,
one run, each variant on the shard job (vLLM engine, and the transformers engine unless
`--engines vllm`) and on bare vLLM `LLM.generate` with the same `SamplingParams` per row:

- `sampled`: do_sample, temperature 1, one completion per row (the base of the others);
- `n4`: 4 completions per row (goal: at most 4 rows' time, less with the shared prompt);
- `logprobs`: the chosen token's and the top 5 log-probabilities (goal: at most 10% slower);
- `json`: a JSON schema (goal: at least 0.8x the rows/s once the grammar is compiled; the
  compile time, the first request with the schema less an unconstrained one, on a line of its own).

Each shard job and each bare engine runs in a process of its own (`benchmarks.child`); the figures
are their generating seconds (the shard job's device stage; the bare engine's `generate` call):
the fastest of `--repeats` rounds, and the shard job against bare as the median of the rounds'
ratios (`paired`). The bare runs' SamplingParams and one-time compile are `benchmarks.bare`'s.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

from benchmarks import engine_counts
from benchmarks.child import child, generating
from benchmarks.paired import median_ratio

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["yes", "no", "maybe"]},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "ok": {"type": "boolean"}},
          "required": ["label", "age", "ok"], "additionalProperties": False}
BASE = {"do_sample": True, "temperature": 1.0, "seed": 0}
VARIANTS = {"sampled": {}, "n4": {"n": 4}, "logprobs": {"logprobs": 5},
            "json": {"structured": {"json": SCHEMA, "whitespace": "compact"}}}


def bench_variants(settings, work: Path, device: str, engines: list[str], vllm_args: dict, repeats: int = 1,
                   names: list[str] | None = None) -> None:
    """Every variant (or those `names`, sampled always) on each engine's shard job and on bare vLLM,
    `repeats` rounds of all of them in turn (a burst of load on a shared machine slows them alike),
    the fastest generating time of each counting; then the table and the goals."""
    runs = {}
    for name, options in VARIANTS.items():
        if names and name != "sampled" and name not in names:
            continue
        section = {**BASE, **options}
        if "vllm" in engines:
            vllm = dataclasses.replace(settings, task_settings={"engine": "vllm", "vllm": vllm_args, **section})
            runs[name, "vllm"] = partial(child, "shard", vllm, work, device, f"-{name}")
            runs[name, "bare"] = partial(child, "bare", vllm, work, device, f"-{name}")
        if "transformers" in engines:
            runs[name, "transformers"] = partial(child, "shard", dataclasses.replace(settings, task_settings=section),
                                                 work, device, f"-{name}")
    every = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            every[key].append(run())
    results = {key: min(found, key=generating) for key, found in every.items()}
    print_variants(results, rows=settings_rows(settings), every=every)


def settings_rows(settings) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(settings.input.path).metadata.num_rows


def generated_tokens(run: dict) -> int:
    return run["stats"]["generated_tokens"] if "stats" in run else run["generated"]


def print_variants(results: dict, rows: int, every: dict) -> None:
    """The fastest run of each (variant, run kind), with every repeat's generating seconds after it."""
    print(f"\n{'variant':10}{'run':34}{'generating s':>13}{'rows/s':>9}{'gen tok/s':>11}{'vs sampled':>12}"
          f"{'shard/bare':>12}   repeats")
    names = {"vllm": "shard job, vLLM engine", "bare": "bare LLM.generate", "transformers": "shard job, transformers"}
    for (variant, run), result in results.items():
        seconds, base = generating(result), generating(results["sampled", run])
        versus = f"{seconds / base:.2f}x" if variant != "sampled" else ""
        bare = results.get((variant, "bare"))
        against = f"{seconds / generating(bare):.2f}x" if run == "vllm" and bare else ""
        print(f"{variant:10}{names[run]:34}{seconds:>13.1f}{rows / seconds:>9.1f}"
              f"{generated_tokens(result) / seconds:>11.0f}{versus:>12}{against:>12}   "
              + "/".join(f"{generating(r):.2f}" for r in every[variant, run]))
    for run in ("vllm", "bare", "transformers"):
        if ("sampled", run) in results:
            print_goals(results, run, names[run], rows)
    print_paired(every)


def print_paired(every: dict) -> None:
    """The shard job against bare vLLM per variant, each round's ratio (they ran a minute apart)
    and their median; the log-probabilities' and the grammar's one-time compile stays in it, as
    the shard job pays it in its first window and bare vLLM paid it before its timed call."""
    for variant in dict.fromkeys(variant for variant, _ in every):
        if (variant, "vllm") in every and (variant, "bare") in every:
            shard = [generating(run) for run in every[variant, "vllm"]]
            bare = [generating(run) + run.get("compile_s", 0.0) for run in every[variant, "bare"]]
            print(f"{variant}: shard job / bare vLLM (its compile counted), paired: {median_ratio(shard, bare)}")
            print(f"  engine work, shard job: {engine_counts.line(every[variant, 'vllm'][-1].get('engine'))}; bare: "
                  f"{engine_counts.line(every[variant, 'bare'][-1].get('engine'))}")


def print_goals(results: dict, run: str, name: str, rows: int) -> None:
    """Each variant's goal, met or not, for one run kind (the variants that ran)."""
    base = generating(results["sampled", run])
    goals = []
    if ("n4", run) in results:
        goals.append(f"n=4 takes {generating(results['n4', run]) / base:.2f}x one sample's time (goal <= 4)")
    if ("logprobs", run) in results:
        goals.append(f"logprobs {generating(results['logprobs', run]) / base - 1:+.0%} in all")
    for variant, what in (("logprobs", "logprobs {:+.0%} after vLLM's one-time compile (goal <= +10%)"),
                          ("json", "json {:.2f}x the rows/s after compiling (goal >= 0.8)")):
        if (variant, run) not in results:
            continue
        # the vLLM shard job compiles in its first window; bare vLLM compiled before its timed call, and
        # the transformers engine has nothing to compile (logprobs) or compiled when its task loaded (json)
        compiled = generating(results[variant, run]) - (once(results, variant) if run == "vllm" else 0.0)
        goals.append(what.format(compiled / base - 1 if variant == "logprobs" else base / max(compiled, 1e-9)))
        if run == "vllm" and (variant, "bare") in results:
            goals.append(f"{variant} shard job / bare after it {compiled / generating(results[variant, 'bare']):.2f}x")
    print(f"{name}: " + "; ".join(goals))
    for variant, what in (("json", "grammar compile"), ("logprobs", "log-probabilities' compile")):
        if run == "bare" and once(results, variant):
            print(f"{what} (bare vLLM, first requests asking it less the same without): "
                  f"{once(results, variant):.2f} s, once per engine")


def once(results: dict, variant: str) -> float:
    """Bare vLLM's measured one-time cost of a variant (0 when it did not run)."""
    return results[variant, "bare"].get("compile_s", 0.0) if (variant, "bare") in results else 0.0
