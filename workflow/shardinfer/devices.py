"""One GPU per job: use the scheduler's choice, or take an exclusive lease on a free device.

Snakemake's local executor only counts GPU jobs (`--resources gpu=N`); it never says which device
a job should use. So each job locks one file per device with `flock`: the lock is exclusive, and
the kernel drops it when the process exits, however it dies. Knows nothing of models or torch.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shardinfer.errors import UserError

log = logging.getLogger(__name__)

# Set inside a batch job that was given devices; Snakemake's Slurm plugin strips most SLURM_*
# variables from a rule's job but keeps the GPU ones.
SCHEDULER_JOB_VARS = (
    "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID",
)
LOCK_DIR_VAR = "SHARDINFER_GPU_LOCK_DIR"
WAIT_VAR = "SHARDINFER_GPU_WAIT_S"
NOTICE_EVERY_S = 60.0


class LeaseTimeout(UserError):
    """No device became free within the allowed wait."""


@dataclass
class Lease:
    """The device a job runs on; `visible` is what CUDA_VISIBLE_DEVICES was set to ('' for CPU)."""

    visible: str
    source: str
    handle: IO | None = None

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def export(self) -> None:
        """Make the leased device the only one CUDA sees in this process."""
        os.environ["CUDA_VISIBLE_DEVICES"] = self.visible


def default_lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_VAR) or f"/tmp/shardinfer-gpu-locks-{os.getuid()}")


def default_wait_s() -> float | None:
    value = os.environ.get(WAIT_VAR)
    return float(value) if value else None


def detect_gpu_count() -> int:
    """Count NVIDIA devices without starting CUDA (which would fix the visible set too early)."""
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return len(list(proc.iterdir()))
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


def candidate_devices(env: Mapping[str, str], count_gpus: Callable[[], int]) -> list[str]:
    """Devices this job may lease: the user's CUDA_VISIBLE_DEVICES if set, else every detected one."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    return [str(i) for i in range(count_gpus())]


def scheduler_assigned(env: Mapping[str, str]) -> bool:
    """True inside a batch-scheduler job that was given exactly one device (Slurm's --gpus=1).

    A job given several (snakemake itself running inside one multi-GPU allocation) still leases
    among them, so that its concurrent shard jobs spread over the devices.
    """
    given = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return len(given) == 1 and any(var in env for var in SCHEDULER_JOB_VARS)


def allocation_lock_dir(lock_dir: Path, env: Mapping[str, str]) -> Path:
    """Schedulers number an allocation's devices from 0: keep each allocation's locks apart."""
    job = next((env[v] for v in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID") if v in env), None)
    return lock_dir / f"job-{re.sub(r'[^A-Za-z0-9_.-]', '_', job)}" if job else lock_dir


def _try_lock(lock_dir: Path, device: str) -> IO | None:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    handle = open(lock_dir / f"gpu-{name}.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    handle.flush()
    return handle


def acquire_device(
    env: Mapping[str, str] | None = None,
    lock_dir: Path | None = None,
    count_gpus: Callable[[], int] = detect_gpu_count,
    wait_s: float | None = None,
    poll_s: float = 1.0,
) -> Lease:
    """Choose this job's device; the caller exports `lease.visible` before CUDA starts.

    Waits (logging that it waits) while every device is leased; `wait_s` None waits for ever.
    """
    env = os.environ if env is None else env
    if scheduler_assigned(env):
        log.info("device: CUDA_VISIBLE_DEVICES=%s, given by the scheduler", env["CUDA_VISIBLE_DEVICES"])
        return Lease(visible=env["CUDA_VISIBLE_DEVICES"], source="scheduler")
    devices = candidate_devices(env, count_gpus)
    if not devices:
        log.info("device: no GPU found; running on CPU")
        return Lease(visible="", source="none")
    lock_dir = allocation_lock_dir(lock_dir or default_lock_dir(), env)
    lock_dir.mkdir(parents=True, exist_ok=True)
    started, last_notice = time.monotonic(), None
    while True:
        for device in devices:
            handle = _try_lock(lock_dir, device)
            if handle is not None:
                log.info("device: leased GPU %s (lock in %s)", device, lock_dir)
                return Lease(visible=device, source="lease", handle=handle)
        waited = time.monotonic() - started
        if wait_s is not None and waited >= wait_s:
            raise LeaseTimeout(
                f"no free GPU among {', '.join(devices)} after {waited:.0f} s (limit {WAIT_VAR}={wait_s:g}); "
                f"other jobs hold them (see the lock files in {lock_dir})"
            )
        if last_notice is None or time.monotonic() - last_notice >= NOTICE_EVERY_S:
            log.info("waiting for a free GPU: all of %s are leased (locks in %s)", ", ".join(devices), lock_dir)
            last_notice = time.monotonic()
        time.sleep(poll_s)
