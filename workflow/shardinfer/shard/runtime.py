"""What a shard job is given (`ShardJob`: the infer rule's inputs, outputs and params) and what it
runs with once started (`Runtime`): the device and precision it chose, the task loaded on them and
the batch budget resolved for that device.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import pyarrow as pa
import torch

from shardinfer.hf.batching import batch_budget
from shardinfer.hf.models import choose_device, choose_dtype
from shardinfer.nodes.ranks import devices_here
from shardinfer.settings.config import BatchSettings, Settings
from shardinfer.shard.devices import Lease, acquire_devices, default_wait_s
from shardinfer.tasks import engine_class
from shardinfer.tasks.base import LoadContext, Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardJob:
    settings: Settings
    plan_path: str
    shard: int
    output: str
    digest: str
    threads: int = 1
    tokens: str | None = None  # the tokenize rule's file for this shard, when tokenizing ahead
    tokenizer_key: str | None = None
    files: str | None = None  # the shard's folder of per-row files (results/files/<shard>), when the task may write any
    cut: str | None = None  # the shard's cut, read instead of the input without a shared filesystem (input.shard_cuts)
    part_bytes: int | None = None  # output.layout parts: a new piece once one holds this many bytes (None: one file)
    record: str | None = None  # where the shard's record goes (None: beside the shard file, contract.pieces)


@dataclass
class Runtime:
    task: Task
    device: torch.device
    where: str
    dtype: str
    batch: BatchSettings  # batch.max_tokens resolved for this device (`auto`)


def lease_devices(settings: Settings) -> Lease:
    """This job's devices: as many as one engine of its task spans (`Task.devices`: the infer rule's
    `resources: gpu`), leased together, or the scheduler's."""
    engine = engine_class(settings)
    # With several node ranks (generate.vllm.nnodes), those of the ranks on this host only.
    count = devices_here(settings.task_settings, engine.devices(settings.task_settings))
    return acquire_devices(count, wait_s=default_wait_s(), asked_by=engine.devices_setting or "the GPUs per engine")


def import_pandas_now() -> None:
    """pyarrow imports pandas, where installed, at its first conversion of Python values
    (`pa.array`): in a shard job, the writer's first window, on a thread beside the device's work
    (on a CPU, beside the engine's threads on the same cores). Taken here, before the model loads."""
    pa.array([0])


def start_runtime(job: ShardJob, lease: Lease) -> Runtime:
    """Pick device and precision, then load the task (its model, tokenizer or the user's code)."""
    settings = job.settings
    device = choose_device(job.threads)
    dtype = choose_dtype(settings.model.dtype, device)
    if device.type == "cuda":
        count = torch.cuda.device_count()
        name = torch.cuda.get_device_name(device) if count == 1 else f"{count} x {torch.cuda.get_device_name(device)}"
        where = f"cuda (CUDA_VISIBLE_DEVICES={lease.visible}, {name})"
    else:
        where = f"cpu ({torch.get_num_threads()} threads)"
    log.info("running on %s in %s", where, dtype)
    import_pandas_now()
    loaded_at = time.perf_counter()
    task = engine_class(settings).load(LoadContext(settings, device, dtype, job.tokens))
    what = settings.model.path or settings.model.entrypoint
    adapter = f" + adapter {settings.model.adapter}" if settings.model.adapter else ""
    log.info("loaded %s%s (task %s) in %.1f s", what, adapter, settings.model.task, time.perf_counter() - loaded_at)
    budget = batch_budget(settings.batch.max_tokens, device.type == "cuda", torch.get_num_threads(), task.one_pass)
    if not task.own_batches:
        log.info("batches of at most %d padded tokens (batch.max_tokens: %s) and %d rows", budget,
                 settings.batch.max_tokens, settings.batch.max_rows)
    batch = dataclasses.replace(settings.batch, max_tokens=budget)
    return Runtime(task, device, where, str(dtype).replace("torch.", ""), batch)
