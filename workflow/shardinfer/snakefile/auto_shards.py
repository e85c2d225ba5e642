"""`shards: auto` (the default): a shard count that fits the machine the run is on.

Each shard job pays a fixed cost (starting Python, torch and transformers and loading the model:
seconds), so shards beyond what runs at once buy nothing but start-ups: on a 2-core machine
without a GPU, four shards run two by two and pay four start-ups. `auto` asks for as many shards
as engines run at once: one per GPU given by `--resources gpu=N`, one per job slot (`--jobs`) on a
cluster executor, one per GPU this machine shows, and without a GPU one per core (at most
CPU_SHARDS); an engine that spans several devices (vLLM's tensor parallel) counts once.
`--resources gpu=N` on a machine that shows no GPU (the local executor: its jobs run here) counts
the cores, as without it: N shards of a GPU's threads would run one at a time on the CPU
(`missing_gpus` says so when the run starts).

The output is the same for any shard count (gather proves every row), so the count may follow the
machine. A plan may not: the resolved count is a param of the plan rule, so a machine that
resolves another count replans, and the old plan's shards are removed
(`plan.remove_stale_shards`), never reused or mixed with the new ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from shardinfer.core.errors import UserError
from shardinfer.shard.devices import candidate_devices, detect_gpu_count

AUTO = "auto"
# The count the main Snakemake process resolved, for its jobs on other machines: they parse the
# Snakefile again (on a node with one GPU, `auto` would say 1), and their plan and shard targets
# must be the main process's. Executors pass the submitting environment on (Slurm's sbatch does).
RESOLVED_VAR = "SHARDINFER_AUTO_SHARDS"
# `auto` never asks for more (more than 1,000 shards is refused above the input's rows).
MOST = 1000
# Without a GPU, at most this many shard jobs share the cores: each holds its own copy of the model.
CPU_SHARDS = 8


@dataclass(frozen=True)
class Machine:
    """What the run has: `gpus` from `--resources gpu=N` (None: not given), the cores Snakemake
    may use, `job_slots` on a cluster executor (`--jobs`; None on the local one), the GPUs this
    machine shows, and the threads a shard job was given by `--set-threads infer=N` (None: not)."""

    gpus: int | None
    cores: int
    job_slots: int | None
    visible_gpus: int
    set_threads: int | None = None


@dataclass(frozen=True)
class AutoShards:
    """What `auto` resolved to: the shard count, the threads of each shard job, and why."""

    count: int
    threads: int
    reason: str


def auto_shards(machine: Machine, gpu_threads: int, per_engine: int = 1) -> AutoShards:
    """The shards for `machine`: one per engine that runs at once, where each engine spans
    `per_engine` devices (`Engine.devices`: GPUs, or cores on CPU). With GPUs (or a cluster's nodes),
    each shard job keeps `gpu_threads` to feed its GPUs. Without, the cores are split between at
    most CPU_SHARDS jobs of at least `per_engine` threads: on 2 cores, two 1-thread shard jobs take
    0.8x the wall time of one 2-thread job (the demo, 3,000 texts), since each job's start-up and
    tokenizing run on a core of their own."""
    per_engine = max(per_engine, 1)  # an engine on no device of the job's (a server's) counts as one
    each = f", {per_engine} per engine" if per_engine > 1 else ""
    if machine.gpus and (machine.visible_gpus or machine.job_slots):
        return AutoShards(min(max(1, machine.gpus // per_engine), MOST), machine.set_threads or gpu_threads,
                          f"--resources gpu={machine.gpus}{each}")
    if machine.job_slots:
        return AutoShards(min(machine.job_slots, MOST), machine.set_threads or gpu_threads,
                          f"--jobs {machine.job_slots} on a cluster executor")
    if machine.visible_gpus:
        return AutoShards(min(max(1, machine.visible_gpus // per_engine), MOST), machine.set_threads or gpu_threads,
                          f"{machine.visible_gpus} GPU(s) on this machine{each}")
    threads = machine.set_threads or max(per_engine, machine.cores // CPU_SHARDS)
    count = max(1, min(machine.cores // threads, CPU_SHARDS))
    cores, said = plural(machine.cores, "core"), plural(threads, "thread")
    given = f"; --resources gpu={machine.gpus} set aside: this machine shows no GPU" if machine.gpus else ""
    return AutoShards(count, threads, f"no GPU: {cores}, {said} per shard job{given}")


def check_gpus_given(gpus: int | None, per_engine: int, setting: str) -> None:
    """`--resources gpu=N` fewer than one engine's GPUs is refused: Snakemake would cut each shard
    job's request down to N, while the job still needs (and leases) `per_engine`."""
    if gpus is not None and gpus < per_engine:
        raise UserError(f"--resources gpu={gpus} is fewer than the {per_engine} GPUs one engine spans ({setting} is "
                        f"{per_engine}); give at least gpu={per_engine}, or lower {setting}")


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def resource_value(value) -> int | None:
    """A Snakemake resource as an int: 9.x holds `--resources gpu=4` as an object with `.value`."""
    value = getattr(value, "value", value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def machine_of(workflow, env: Mapping[str, str] = os.environ) -> Machine:
    """The Machine of a Snakemake `workflow` object (read by duck typing: this module imports no
    Snakemake). Job slots: `--jobs`, which Snakemake keeps only for a cluster executor (on the local
    one it stands for --cores); its executor itself is not known yet while the Snakefile loads."""
    resources = workflow.global_resources
    cores = resource_value(resources.get("_cores")) or os.cpu_count() or 1  # None: a dry run without --cores
    gpus, slots = resource_value(resources.get("gpu")), resource_value(resources.get("_nodes"))
    # Counting the machine's GPUs may run nvidia-smi: not for a cluster, whose jobs run elsewhere.
    visible = 0 if slots else len(candidate_devices(env, detect_gpu_count))
    return Machine(gpus=gpus, cores=cores, job_slots=slots, visible_gpus=visible,
                   set_threads=resource_value(workflow.resource_settings.overwrite_threads.get("infer")))


def missing_gpus(workflow, env: Mapping[str, str] = os.environ) -> str | None:
    """The warning, when the run starts, for `--resources gpu=N` where the shard jobs will find no
    GPU (the local executor on a machine that shows none), rather than only after the run."""
    if not resource_value(workflow.global_resources.get("gpu")):
        return None
    machine = machine_of(workflow, env)
    if machine.job_slots or machine.visible_gpus:
        return None
    return (f"shardinfer: WARNING --resources gpu={machine.gpus}, but this machine shows no GPU (no CUDA device "
            "visible): the shard jobs will run on the CPU")


def resolve_auto_shards(workflow, gpu_threads: int, env: MutableMapping[str, str] = os.environ,
                        per_engine: int = 1) -> AutoShards:
    """`auto` for this run: resolved in the main process and handed on in RESOLVED_VAR
    ("count,threads") to the jobs that parse the Snakefile again elsewhere, which take it as it is."""
    handed = env.get(RESOLVED_VAR, "").split(",")
    if not workflow.is_main_process and len(handed) == 2 and all(part.isdigit() for part in handed):
        return AutoShards(int(handed[0]), int(handed[1]), "as the main Snakemake process resolved it")
    resolved = auto_shards(machine_of(workflow, env), gpu_threads, per_engine)
    if workflow.is_main_process:
        env[RESOLVED_VAR] = f"{resolved.count},{resolved.threads}"
    return resolved


def uses_auto(config: dict) -> bool:
    """Whether any input of the config takes its shard count from `auto`."""
    inputs = config.get("inputs") or {None: config.get("input") or {}}
    return any(inp.get("shards", config.get("shards")) == AUTO for inp in inputs.values() if isinstance(inp, dict))
