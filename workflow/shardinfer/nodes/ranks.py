"""The shard job's side of an engine over several node ranks (rank 0: the engine itself, with the
proof's feeding): where its ranks run and what each takes (checked before vLLM is imported), then
the other ranks started and vLLM's arguments for rank 0 (`node_rank`, `master_addr`, `master_port`:
from the scheduler's environment and a free port, never from the user).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from shardinfer.nodes.launch import start_ranks
from shardinfer.nodes.placement import Placement, free_port, place_ranks
from shardinfer.nodes.share import RankShare, take_share
from shardinfer.nodes.span import NODES_SETTING, NodeSpan


@dataclass(frozen=True)
class NodeRanks:
    """One engine's node ranks: where each runs and its share of its host."""

    placement: Placement
    shares: tuple[RankShare, ...]

    def where(self) -> str:
        """What the engine spans, for the shard log."""
        ranks = ", ".join(f"rank {share.rank} on {self.placement.where(share.rank)}" for share in self.shares)
        return (f"{len(self.shares)} node ranks ({NODES_SETTING}), {self.shares[0].workers} {self.shares[0].device} "
                f"worker(s) each: {ranks}; master address {self.placement.master_addr}")

    def start(self, arguments: dict) -> dict:
        """Ranks 1.. started, rank 0's share taken in this process (whose vLLM workers inherit it);
        returns the arguments that make `vllm.LLM(**arguments)` node rank 0."""
        port = free_port()
        start_ranks(self.placement, list(self.shares), arguments, port)
        take_share(self.shares[0])
        return {"node_rank": 0, "master_addr": self.placement.master_addr, "master_port": port}


def node_ranks(arguments: dict, device_type: str, threads: int, env: Mapping[str, str] = os.environ
               ) -> NodeRanks | None:
    """The node ranks of the engine that `vllm.LLM(**arguments)` describes (None: one node), each
    rank on this host checked to have its share before anything starts."""
    nodes = int(arguments.get("nnodes") or 1)
    if nodes == 1:
        return None
    pipeline = int(arguments.get("pipeline_parallel_size") or 1)
    span = NodeSpan(nodes, int(arguments.get("tensor_parallel_size") or 1) * pipeline)
    placement = place_ranks(nodes, env)
    shares = tuple(RankShare(rank, *placement.share(rank), span.per_node, device_type, threads, pipeline)
                   for rank in range(nodes))
    for share in shares:
        if placement.hosts[share.rank] == placement.hosts[0]:
            take_share(share, dict(env))  # a check only: refused before vLLM is imported
    return NodeRanks(placement, shares)


def devices_here(section: dict, workers: int, env: Mapping[str, str] = os.environ) -> int:
    """The GPUs the shard job needs on its own host (what it leases, or finds given): all the engine's
    on one node; with several node ranks, those of the ranks placed on this host."""
    span = NodeSpan.of(section, workers)
    if span.nodes == 1:
        return workers
    placement = place_ranks(span.nodes, env)
    return span.per_node * placement.share(0)[1]
