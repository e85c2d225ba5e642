"""What one node rank takes of its host: its GPUs, or on vLLM's CPU build its cores, set in its
environment before vLLM starts the rank's workers (one per GPU, or per core group).

A rank alone on its node takes all it was given there (the step's CUDA_VISIBLE_DEVICES; the first
`threads` of the CPUs it may run on). Ranks sharing a host (`shardinfer.nodes.placement`: a
one-node test Slurm, or `snakemake --cores`) split it into equal consecutive parts, one each, so
that no two bind the same core or GPU. Pipeline parallel is refused on CPU, as on one node
(`shardinfer.engines.vllm.parallel`): measured with two ranks on vLLM's CPU build 0.32.0, its
scheduler fails at the first step (KeyError on a request id in `update_from_output`).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

from shardinfer.core.errors import UserError
from shardinfer.nodes.span import NODES_SETTING

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class RankShare:
    """Rank `rank`, `slot`-th of the `count` ranks on its host, runs `workers` of the engine's workers
    on `device` ("cuda" or "cpu"), with `threads` CPU threads (the shard job's)."""

    rank: int
    slot: int
    count: int
    workers: int
    device: str
    threads: int
    pipeline: int = 1

    def part(self, items: list) -> list:
        """This rank's equal, consecutive part of its host's `items`."""
        each = len(items) // self.count
        return items[self.slot * each:(self.slot + 1) * each]


def take_share(share: RankShare, env: MutableMapping[str, str] | None = None, allowed: list[int] | None = None) -> str:
    """Set the rank's devices in `env` (this process's, which vLLM's worker processes inherit) and
    say what it took; refused in one line when its part of the host is too small."""
    env = os.environ if env is None else env
    if share.device == "cuda":
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        mine = share.part(visible)
        if len(mine) != share.workers:
            raise UserError(f"{NODES_SETTING}: rank {share.rank} runs {share.workers} of the engine's workers, one per "
                            f"GPU, but its part of its host's GPUs (CUDA_VISIBLE_DEVICES={','.join(visible)!r}, "
                            f"shared by {share.count} rank(s)) is {len(mine)}")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        return f"rank {share.rank}: {share.workers} GPU(s) (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})"
    allowed = sorted(os.sched_getaffinity(0)) if allowed is None else allowed
    cores = share.part(allowed[:share.threads])
    if len(cores) < share.workers:
        given = min(len(allowed), share.threads)
        raise UserError(f"{NODES_SETTING}: on CPU each of rank {share.rank}'s {share.workers} worker(s) needs a core "
                        f"of its own, but {share.count} rank(s) share the {given} core(s) this host gives the job "
                        f"({share.threads} thread(s)); give it at least "
                        f"{share.workers * share.count} (--set-threads infer=N, or more --cores)")
    each = len(cores) // share.workers
    env[BIND_VAR] = "|".join(",".join(map(str, cores[k * each:(k + 1) * each])) for k in range(share.workers))
    env["OMP_NUM_THREADS"] = str(each)
    return f"rank {share.rank}: {share.workers} CPU worker(s) ({BIND_VAR}={env[BIND_VAR]})"
