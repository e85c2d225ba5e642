"""What a shard job is given (`ShardJob`: the infer rule's inputs, outputs and params) and what it
runs with once started (`Runtime`): the device and precision it chose, the engine (and the task
around it) loaded on them and the batch budget resolved for that device.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import pyarrow as pa
import torch

from shardinfer.engines import engine_of
from shardinfer.engines.base import Engine
from shardinfer.hf.batching import batch_budget
from shardinfer.hf.models import choose_device, choose_dtype
from shardinfer.nodes.ranks import devices_here
from shardinfer.settings.config import BatchSettings, Settings
from shardinfer.shard.devices import Lease, acquire_devices, default_wait_s
from shardinfer.tasks import task_class
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
    engine: Engine  # what runs the rows: `engine.task` prepares them and writes their columns
    device: torch.device
    where: str
    dtype: str
    batch: BatchSettings  # batch.max_tokens resolved for this device (`auto`)

    @property
    def task(self) -> Task:
        return self.engine.task


def lease_devices(settings: Settings) -> Lease:
    """This job's devices: as many as its engine spans (`Engine.devices`: the infer rule's
    `resources: gpu`), leased together, or the scheduler's; none for an engine on no device of the
    job's (a server's)."""
    engine = engine_of(settings)
    # With several node ranks (generate.vllm.nnodes), those of the ranks on this host only.
    count = devices_here(settings.task_settings, engine.devices(settings.task_settings))
    if count == 0:
        return Lease(visible="", source="none")
    return acquire_devices(count, wait_s=default_wait_s(), asked_by=engine.devices_setting or "the GPUs per engine")


def import_pandas_now() -> None:
    """pyarrow imports pandas, where installed, at its first conversion of Python values
    (`pa.array`): in a shard job, the writer's first window, on a thread beside the device's work
    (on a CPU, beside the engine's threads on the same cores). Taken here, before the model loads."""
    pa.array([0])


def start_runtime(job: ShardJob, lease: Lease) -> Runtime:
    """Pick device and precision, then load the engine and the task (its model, tokenizer or the user's code)."""
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
    engine = engine_of(settings).load(task_class(settings.model.task), LoadContext(settings, device, dtype, job.tokens))
    what = settings.model.path or settings.model.entrypoint
    adapter = f" + adapter {settings.model.adapter}" if settings.model.adapter else ""
    log.info("loaded %s%s (task %s, engine %s) in %.1f s", what, adapter, settings.model.task, engine.name,
             time.perf_counter() - loaded_at)
    budget = batch_budget(settings.batch.max_tokens, device.type == "cuda", torch.get_num_threads(),
                          engine.task.one_pass)
    if not engine.own_batches:
        log.info("batches of at most %d padded tokens (batch.max_tokens: %s) and %d rows", budget,
                 settings.batch.max_tokens, settings.batch.max_rows)
    batch = dataclasses.replace(settings.batch, max_tokens=budget)
    return Runtime(engine, device, where, str(dtype).replace("torch.", ""), batch)
