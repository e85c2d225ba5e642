"""Where each node rank of one engine runs, from the scheduler's environment, never the user's.

Inside a Slurm job (SLURM_JOB_ID set) the ranks go to the job's nodes (SLURM_JOB_NODELIST, expanded
by `scontrol show hostnames`): rank 0, the shard job itself, on the node it runs on (SLURMD_NODENAME),
rank r on the r-th of the others. The rule asks for as many nodes as ranks, so each rank has a node;
a job given fewer (a one-node test Slurm, `set-resources: infer: nodes: 1`) places the ranks in
blocks, several on a node, each with its share of the node (`shardinfer.nodes.share`): launched as on
many nodes, `srun` steps beside the job's own. Outside Slurm (`snakemake --cores`, and any executor
whose job runs on one host) every rank runs on this host, as a local process.

The master address is rank 0's node as Slurm names it (its other nodes resolve it; `127.0.0.1`
when all ranks share this host), and the master port a free one on it, chosen when the ranks start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shardinfer.core.errors import UserError, first_line
from shardinfer.nodes.span import NODES_SETTING

SLURM_JOB_VAR = "SLURM_JOB_ID"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Placement:
    """The host of each rank (rank 0, this process, first) and the scheduler that starts the others:
    `slurm` (an `srun` step each, in job `job`) or `local` (a process on this host)."""

    hosts: tuple[str, ...]
    scheduler: str = "local"
    job: str | None = None

    def share(self, rank: int) -> tuple[int, int]:
        """(its place among the ranks on its host, how many ranks its host holds)."""
        same = [r for r, host in enumerate(self.hosts) if host == self.hosts[rank]]
        return same.index(rank), len(same)

    @property
    def master_addr(self) -> str:
        return LOOPBACK if len(set(self.hosts)) == 1 else self.hosts[0]

    def where(self, rank: int) -> str:
        """`node vm` (Slurm) or `this host`, for the log and the one-line errors."""
        return f"node {self.hosts[rank]}" if self.scheduler == "slurm" else "this host"


def rank_hosts(ranks: int, nodes: list[str], here: str) -> tuple[str, ...]:
    """Rank 0 on `here`, the others on the allocation's other nodes in order; with fewer nodes than
    ranks, consecutive ranks share a node (in blocks, rank 0's block on `here`)."""
    ordered = [here, *(node for node in nodes if node != here)]
    if len(ordered) >= ranks:
        return tuple(ordered[:ranks])
    return tuple(ordered[rank * len(ordered) // ranks] for rank in range(ranks))


def slurm_nodes(env: Mapping[str, str], run: Callable = subprocess.run) -> list[str]:
    """The job's nodes, expanded: SLURM_JOB_NODELIST (set in the rule's step), else `squeue`'s."""
    listing = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    try:
        if not listing:
            listing = run(["squeue", "-h", "-j", env[SLURM_JOB_VAR], "-o", "%N"], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()
        names = run(["scontrol", "show", "hostnames", listing], capture_output=True, text=True, timeout=60,
                    check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as error:
        raise UserError(f"{NODES_SETTING}: cannot list the nodes of Slurm job {env[SLURM_JOB_VAR]} "
                        f"({first_line(error)})") from None
    if not names:
        raise UserError(f"{NODES_SETTING}: Slurm job {env[SLURM_JOB_VAR]} lists no nodes ({listing!r})")
    return names


def place_ranks(ranks: int, env: Mapping[str, str] = os.environ, run: Callable = subprocess.run) -> Placement:
    """Where the engine's `ranks` node ranks run: the Slurm job's nodes, or this host."""
    if SLURM_JOB_VAR not in env:
        return Placement((socket.gethostname(),) * ranks)
    if shutil.which("srun", path=env.get("PATH")) is None:
        raise UserError(f"{NODES_SETTING} is {ranks}: this job runs in Slurm job {env[SLURM_JOB_VAR]} but finds no "
                        "`srun` on its PATH to start the engine's other ranks")
    nodes = slurm_nodes(env, run)
    here = env.get("SLURMD_NODENAME") or next((node for node in nodes if node == socket.gethostname().split(".")[0]),
                                              nodes[0])
    return Placement(rank_hosts(ranks, nodes, here), "slurm", env[SLURM_JOB_VAR])


def free_port(host: str = "") -> int:
    """A TCP port free on this host now (the master port: rank 0's torch.distributed store binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
