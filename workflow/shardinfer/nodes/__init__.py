"""One engine over several machines (`generate.vllm.nnodes`): the nodes and GPUs a shard job asks the
scheduler for, where each of the engine's node ranks runs (the Slurm allocation's nodes, or this host),
each rank's share of its host, and the launcher that starts the ranks beyond the first, watches them
and stops them. Imports only `core`; torch and vLLM only inside the worker rank's functions."""
