"""The machines one engine spans (`generate.vllm.nnodes`, vLLM's own `--nnodes`) and what its shard
job asks the scheduler for.

The node count is a setting, not derived from the parallel sizes and the GPUs per node: those are the
cluster's, unknown where the Snakefile loads (a profile's business), while the count decides how
vLLM lays the engine's ranks out (each node holds `tensor x pipeline / nnodes` consecutive workers:
tensor parallel 8 x pipeline parallel 2 on 2 nodes puts one pipeline stage on each node, its
all-reduces inside the node), so it belongs with the sizes it divides. Refused when the Snakefile
loads: a count that does not divide the workers, one above 1 on the transformers engine, or without a
shared filesystem (every node's rank reads the model folder itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardinfer.core.errors import UserError

NODES_SETTING = "generate.vllm.nnodes"
WORKERS_SETTING = "generate.vllm.tensor_parallel_size x pipeline_parallel_size"


@dataclass(frozen=True)
class NodeSpan:
    """One engine's `nodes` node ranks, each holding `workers / nodes` of its workers (GPUs)."""

    nodes: int = 1
    workers: int = 1

    @classmethod
    def of(cls, section: dict, workers: int) -> NodeSpan:
        """From a task's config section (`vllm.nnodes`, default 1) and the engine's workers."""
        value = (section.get("vllm") or {}).get("nnodes")
        if value is None:
            return cls(1, workers)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{NODES_SETTING} must be an integer >= 1 (the machines one engine spans); got {value!r}")
        if workers % value:
            raise UserError(f"{NODES_SETTING} is {value}, which does not divide the {workers} worker(s) of one engine "
                            f"({WORKERS_SETTING}); each node holds the same number of them (e.g. 16 on 2 nodes of 8)")
        return cls(value, workers)

    @property
    def per_node(self) -> int:
        return self.workers // self.nodes

    def resources(self) -> dict:
        """The infer rule's resources, as snakemake-executor-plugin-slurm turns them into sbatch flags.

        One node: `gpu=N` (`--gpus=N`), counted by the local executor's `--resources gpu=`. Several:
        `nodes=N` (`--nodes=N`) and `gres="gpu:K"` (`--gres=gpu:K`: K GPUs on each node; `--gpus` is
        the job's total, which Slurm may split unevenly, and the plugin would repeat it on the rule's
        own step, `srun -n1`, which lands on the first node alone and cannot hold them all). The job
        runs its command once, on the first node (the plugin's `srun -n1`: Slurm warns that it sets
        nnodes to 1); that step gets its node's GPUs, and the launcher starts a step on each other node.
        """
        if self.nodes == 1:
            return {"gpu": self.workers}
        return {"nodes": self.nodes, "gres": f"gpu:{self.per_node}"}


def engine_nodes(config: dict, workers: int, storage: bool) -> NodeSpan:
    """The NodeSpan of a validated config, refused in one line when it cannot run: nodes above 1
    need `generate.engine: vllm` and a shared filesystem."""
    task = config["model"]["task"]
    section = config.get(task) or {}
    span = NodeSpan.of(section, workers)
    if span.nodes == 1:
        return span
    engine = section.get("engine", "transformers")
    if engine != "vllm":
        raise UserError(f"{NODES_SETTING} is {span.nodes}, but {task}.engine {engine} runs a model on one device; set "
                        "generate.engine: vllm to spread a model over several machines")
    if storage:
        raise UserError(f"{NODES_SETTING} is {span.nodes}, which needs a shared filesystem (every node's rank reads "
                        "model.path itself); without one (shared-fs-usage: none) run the model on one node")
    return span
