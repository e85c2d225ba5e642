"""The GPU lease, with simulated device counts: no two live jobs share a device, a killed
holder's device is free again, and a scheduler's choice is used as given."""

import signal
import subprocess
import sys
import time

import pytest

from factory import python_env
from shardinfer.devices import LeaseTimeout, acquire_device

HOLDER = """
import time
from pathlib import Path
from shardinfer.devices import acquire_device
lease = acquire_device(env={{}}, lock_dir=Path({lock_dir!r}), count_gpus=lambda: {gpus}, poll_s=0.05)
print(lease.visible, flush=True)
time.sleep(3600)  # until the test kills it: a lifetime, not a limit a slow machine could reach
"""


def start_holder(lock_dir, gpus: int) -> subprocess.Popen:
    code = HOLDER.format(lock_dir=str(lock_dir), gpus=gpus)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=python_env())


def device_of(holder: subprocess.Popen) -> str:
    return holder.stdout.readline().strip()


@pytest.fixture
def holders():
    started = []
    yield started
    for holder in started:
        holder.kill()
        holder.wait()


def test_concurrent_holders_get_different_devices(tmp_path, holders):
    holders.extend(start_holder(tmp_path, gpus=3) for _ in range(3))
    assert sorted(device_of(h) for h in holders) == ["0", "1", "2"]


def test_a_job_waits_while_all_devices_are_leased_then_times_out(tmp_path, holders):
    holders.append(start_holder(tmp_path, gpus=1))
    assert device_of(holders[0]) == "0"
    started = time.monotonic()
    with pytest.raises(LeaseTimeout, match=r"no free GPU among 0 after"):
        acquire_device(env={}, lock_dir=tmp_path, count_gpus=lambda: 1, wait_s=0.5, poll_s=0.05)
    assert time.monotonic() - started >= 0.5


def test_a_killed_holder_frees_its_device(tmp_path, holders):
    holders.extend(start_holder(tmp_path, gpus=2) for _ in range(2))
    devices = {device_of(h): h for h in holders}
    devices["1"].send_signal(signal.SIGKILL)
    devices["1"].wait()
    lease = acquire_device(env={}, lock_dir=tmp_path, count_gpus=lambda: 2, wait_s=5, poll_s=0.05)
    assert lease.visible == "1" and lease.source == "lease"
    lease.release()


def test_a_waiting_job_gets_the_device_when_it_frees(tmp_path, holders):
    holders.append(start_holder(tmp_path, gpus=1))
    assert device_of(holders[0]) == "0"
    waiter = start_holder(tmp_path, gpus=1)
    holders.append(waiter)
    time.sleep(0.5)
    holders[0].kill()
    assert device_of(waiter) == "0"


def test_scheduler_choice_is_used_without_a_lock(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "3", "SLURM_JOB_ID": "42"}
    lease = acquire_device(env=env, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert (lease.visible, lease.source, lease.handle) == ("3", "scheduler", None)
    assert not any(tmp_path.iterdir())


def test_user_restricted_devices_are_the_pool(tmp_path):
    first = acquire_device(env={"CUDA_VISIBLE_DEVICES": "2,5"}, lock_dir=tmp_path, count_gpus=lambda: 8)
    second = acquire_device(env={"CUDA_VISIBLE_DEVICES": "2,5"}, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert (first.visible, second.visible) == ("2", "5")
    first.release()
    second.release()


@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": ""}])
def test_no_gpu_means_cpu(tmp_path, env):
    lease = acquire_device(env=env, lock_dir=tmp_path, count_gpus=lambda: 0)
    assert (lease.visible, lease.source) == ("", "none")


def test_a_multi_gpu_allocation_is_shared_out_not_piled_on_one_device(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "77"}
    first = acquire_device(env=env, lock_dir=tmp_path, count_gpus=lambda: 8)
    second = acquire_device(env=env, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert (first.visible, second.visible) == ("0", "1") and first.source == "lease"
    assert (tmp_path / "job-77").is_dir()  # another allocation's device 0 is another GPU
    other = acquire_device(env={**env, "SLURM_JOB_ID": "78"}, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert other.visible == "0"
    for lease in (first, second, other):
        lease.release()
