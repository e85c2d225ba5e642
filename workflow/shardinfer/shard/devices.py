"""The GPUs of a job: use the scheduler's choice, or take an exclusive lease on free devices.

Snakemake's local executor only counts GPU jobs (`--resources gpu=N`); it never says which device
a job should use. So each job locks one file per device with `flock`: the lock is exclusive, and
the kernel drops it when the process exits, however it dies. A job whose engine spans several
devices takes them all or none: it tries the devices in one order without waiting, and when it
gets fewer than it needs it lets go of them before it waits, so two jobs can never each hold some
and wait for the rest. Knows nothing of models or torch.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import re
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from shardinfer.core.errors import UserError

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
    """Not enough devices became free within the allowed wait."""


@dataclass
class Lease:
    """The devices a job runs on; `visible` is what CUDA_VISIBLE_DEVICES was set to ('' for CPU)."""

    visible: str
    source: str
    handles: list[IO] = field(default_factory=list)

    @property
    def devices(self) -> list[str]:
        return [device for device in self.visible.split(",") if device]

    def release(self) -> None:
        for handle in self.handles:
            handle.close()
        self.handles = []

    def export(self) -> None:
        """Make the leased devices the only ones CUDA sees in this process (and the processes it starts)."""
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


def scheduler_given(env: Mapping[str, str]) -> list[str] | None:
    """The devices a batch-scheduler job was given (Slurm's --gpus=N); None outside one, or none given."""
    given = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return given if given and any(var in env for var in SCHEDULER_JOB_VARS) else None


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
    return handle


def _lock_together(lock_dir: Path, devices: list[str], count: int) -> tuple[list[str], list[IO]] | None:
    """`count` of `devices`, tried in their order without waiting: all of them, or none held."""
    taken: list[tuple[str, IO]] = []
    for device in devices:
        handle = _try_lock(lock_dir, device)
        if handle is not None:
            taken.append((device, handle))
        if len(taken) == count:
            return [device for device, _ in taken], [handle for _, handle in taken]
    for _, handle in taken:
        handle.close()
    return None


def _sign(handles: list[IO]) -> None:
    """Who holds each lock, for a person reading the lock files."""
    for handle in handles:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        handle.flush()


def too_few(count: int, devices: list[str], where: str, asked_by: str) -> UserError:
    shown = f" ({', '.join(devices)})" if devices else ""
    return UserError(f"{asked_by} is {count}: one engine spans {count} GPUs, but {where} {len(devices)}{shown}; "
                     f"lower it, or give each shard job {count} GPUs")


def acquire_devices(
    count: int = 1,
    env: Mapping[str, str] | None = None,
    lock_dir: Path | None = None,
    count_gpus: Callable[[], int] = detect_gpu_count,
    wait_s: float | None = None,
    poll_s: float = 1.0,
    asked_by: str = "the GPUs per engine",
) -> Lease:
    """Choose this job's `count` devices; the caller exports `lease.visible` before CUDA starts.

    A scheduler job given exactly `count` uses them as given; otherwise `count` free devices are
    leased together, waiting (and logging that it waits) while fewer are free; `wait_s` None waits
    for ever. `asked_by` names the setting `count` comes from, for the refusal when too few exist.
    """
    env = os.environ if env is None else env
    given = scheduler_given(env)
    if given is not None and len(given) == count:
        log.info("device: CUDA_VISIBLE_DEVICES=%s, given by the scheduler", ",".join(given))
        return Lease(visible=",".join(given), source="scheduler")
    if given is not None and len(given) < count:
        raise too_few(count, given, "the scheduler gave this job", asked_by)
    devices = candidate_devices(env, count_gpus)
    if not devices:
        log.info("device: no GPU found; running on CPU")
        return Lease(visible="", source="none")
    if len(devices) < count:
        raise too_few(count, devices, "this job sees", asked_by)
    return _wait_for_lease(allocation_lock_dir(lock_dir or default_lock_dir(), env), devices, count, wait_s, poll_s)


def _wait_for_lease(lock_dir: Path, devices: list[str], count: int, wait_s: float | None, poll_s: float) -> Lease:
    """Try for `count` devices together until they are free; between tries, hold none."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    started, last_notice, what = time.monotonic(), None, "a free GPU" if count == 1 else f"{count} free GPUs at once"
    while True:
        leased = _lock_together(lock_dir, devices, count)
        if leased is not None:
            _sign(leased[1])
            log.info("device: leased GPU %s (lock in %s)", ",".join(leased[0]), lock_dir)
            return Lease(visible=",".join(leased[0]), source="lease", handles=leased[1])
        waited = time.monotonic() - started
        if wait_s is not None and waited >= wait_s:
            raise LeaseTimeout(
                f"could not lease {what} among {', '.join(devices)} after {waited:.0f} s "
                f"(limit {WAIT_VAR}={wait_s:g}); other jobs hold them (see the lock files in {lock_dir})"
            )
        if last_notice is None or time.monotonic() - last_notice >= NOTICE_EVERY_S:
            log.info("waiting for %s among %s: other jobs lease them (locks in %s)", what, ", ".join(devices), lock_dir)
            last_notice = time.monotonic()
        time.sleep(poll_s * random.uniform(0.5, 1.5))  # jittered: two jobs that collided try apart next time
