"""The devices one vLLM engine spans (`generate.vllm.tensor_parallel_size` x
`pipeline_parallel_size`): its arguments, the check that it has them, and where its workers run.

On GPUs the shard job leased the N devices together and exported them as CUDA_VISIBLE_DEVICES
before CUDA started (`shardinfer.shard.devices`); vLLM's worker of local rank r takes the r-th visible
device. The engine itself stays in the job's process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and drives
one worker process per device (the "mp" executor, never Ray, which would place workers anywhere in
its cluster). Workers are spawned: each re-imports the job's script as `__mp_main__`, whose body
runs under its `__main__` guard only (scripts/infer.py), so the shard runs once.

On vLLM's CPU build the workers are bound to cores of their own (VLLM_CPU_OMP_THREADS_BIND,
"0|1"), taken from the CPUs this job may run on, as many as its threads; vLLM's "auto" wants a
NUMA node per worker, which most machines lack. Pipeline parallel on CPU runs compiled: in the
eager mode the CPU build otherwise starts in (`engine.cpu_defaults`), it skips the warm-up that
allocates the inputs of every stage beyond the first, whose workers then fail at the first step
(`check_cpu_pipeline`). Tensor and pipeline parallel on CPU are a correctness check, not a
speed-up (each layer's all-reduce, each stage's hand-over, costs more than it saves).
"""

from __future__ import annotations

import os

from shardinfer.core.errors import UserError
from shardinfer.engines.vllm.checks import SPANS_SETTING, Span

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"


def parallel_arguments(span: Span) -> dict:
    """LLM(...) arguments beyond the sizes (which come with the user's generate.vllm)."""
    return {"distributed_executor_backend": "mp"} if span.workers > 1 else {}


def place_workers(span: Span, device_type: str, threads: int) -> str:
    """Check that this job has what `span` needs, bind its CPU workers (before vLLM starts them),
    and say what the engine spans, for the shard log."""
    if device_type == "cuda":
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if torch.cuda.device_count() != span.workers:
            raise UserError(f"{SPANS_SETTING} is {span.workers}, but CUDA sees {torch.cuda.device_count()} GPU(s) in "
                            f"this job (CUDA_VISIBLE_DEVICES={visible!r}); one engine needs one GPU per worker")
        return f"{span.workers} GPU(s) (CUDA_VISIBLE_DEVICES={visible}): {span.sizes()}"
    if span.workers == 1:
        return f"1 worker on this job's {threads} CPU thread(s): {span.sizes()}"
    binding = cpu_binding(span.workers, threads, sorted(os.sched_getaffinity(0)))
    os.environ[BIND_VAR] = binding
    return f"{span.workers} CPU workers, one per core group ({BIND_VAR}={binding}): {span.sizes()}"


def cpu_binding(workers: int, threads: int, allowed: list[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `workers` CPU workers: the first `threads` of the CPUs this job
    may use (`allowed`), split into equal groups, one per worker ("0|1", "0,1|2,3")."""
    usable = allowed[:threads]
    if len(usable) < workers:
        raise UserError(f"{SPANS_SETTING} is {workers}: on CPU each of the engine's {workers} workers needs a core of "
                        f"its own, but this job has {threads} thread(s) on {len(allowed)} allowed CPU(s); give it at "
                        f"least {workers} (--set-threads infer={workers}, or more --cores)")
    each = len(usable) // workers
    return "|".join(",".join(map(str, usable[k * each:(k + 1) * each])) for k in range(workers))


def check_cpu_pipeline(arguments: dict) -> None:
    """Pipeline parallel on vLLM's CPU build runs compiled only: eager mode skips the warm-up that
    allocates a later stage's inputs (vLLM 0.32's `CPUModelRunner.warming_up_model`), and its
    workers fail at the first step; refused before the engine starts, naming the setting."""
    pipeline = int(arguments.get("pipeline_parallel_size") or 1)
    if pipeline > 1 and arguments.get("enforce_eager"):
        raise UserError(f"generate.vllm.enforce_eager is true with pipeline_parallel_size {pipeline}: on vLLM's CPU "
                        "build a pipeline stage beyond the first runs only compiled (eager mode skips the warm-up that "
                        "allocates its inputs); leave enforce_eager out")
