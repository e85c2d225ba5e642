"""The GPU lease, with simulated device counts: no two live jobs share a device, a killed
holder's device is free again, and a scheduler's choice is used as given; jobs whose engine spans
several devices take them together, never deadlock and never share one, however many compete."""

import signal
import subprocess
import sys
import time

import pytest

from factory import python_env
from shardinfer.core.errors import UserError
from shardinfer.shard.devices import LeaseTimeout, acquire_devices

HOLDER = """
import time
from pathlib import Path
from shardinfer.shard.devices import acquire_devices
lease = acquire_devices({count}, env={{}}, lock_dir=Path({lock_dir!r}), count_gpus=lambda: {gpus}, poll_s=0.05)
print(lease.visible, flush=True)
time.sleep(3600)  # until the test kills it: a lifetime, not a limit a slow machine could reach
"""


def start_holder(lock_dir, gpus: int, count: int = 1) -> subprocess.Popen:
    code = HOLDER.format(lock_dir=str(lock_dir), gpus=gpus, count=count)
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
    with pytest.raises(LeaseTimeout, match=r"could not lease a free GPU among 0 after"):
        acquire_devices(env={}, lock_dir=tmp_path, count_gpus=lambda: 1, wait_s=0.5, poll_s=0.05)
    assert time.monotonic() - started >= 0.5


def test_a_killed_holder_frees_its_device(tmp_path, holders):
    holders.extend(start_holder(tmp_path, gpus=2) for _ in range(2))
    devices = {device_of(h): h for h in holders}
    devices["1"].send_signal(signal.SIGKILL)
    devices["1"].wait()
    lease = acquire_devices(env={}, lock_dir=tmp_path, count_gpus=lambda: 2, wait_s=5, poll_s=0.05)
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
    lease = acquire_devices(env=env, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert (lease.visible, lease.source, lease.handles) == ("3", "scheduler", [])
    assert not any(tmp_path.iterdir())


def test_user_restricted_devices_are_the_pool(tmp_path):
    first = acquire_devices(env={"CUDA_VISIBLE_DEVICES": "2,5"}, lock_dir=tmp_path, count_gpus=lambda: 8)
    second = acquire_devices(env={"CUDA_VISIBLE_DEVICES": "2,5"}, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert (first.visible, second.visible) == ("2", "5")
    first.release()
    second.release()


@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": ""}])
def test_no_gpu_means_cpu(tmp_path, env):
    lease = acquire_devices(env=env, lock_dir=tmp_path, count_gpus=lambda: 0)
    assert (lease.visible, lease.source) == ("", "none")


def test_a_multi_gpu_allocation_is_shared_out_not_piled_on_one_device(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "77"}
    first = acquire_devices(env=env, lock_dir=tmp_path, count_gpus=lambda: 8)
    second = acquire_devices(env=env, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert (first.visible, second.visible) == ("0", "1") and first.source == "lease"
    assert (tmp_path / "job-77").is_dir()  # another allocation's device 0 is another GPU
    other = acquire_devices(env={**env, "SLURM_JOB_ID": "78"}, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert other.visible == "0"
    for lease in (first, second, other):
        lease.release()


# A job that leases `count` of `gpus` devices `rounds` times. While it holds them it marks each one
# in `held/` with O_EXCL: a device another live job holds too makes that fail, and the job exits 3.
COMPETITOR = """
import os, sys, time, random
from pathlib import Path
from shardinfer.shard.devices import acquire_devices
held = Path({held!r})
for _ in range({rounds}):
    lease = acquire_devices({count}, env={{}}, lock_dir=Path({lock_dir!r}), count_gpus=lambda: {gpus}, poll_s=0.01)
    assert len(lease.devices) == {count}, lease.visible
    try:
        marks = [os.open(held / device, os.O_CREAT | os.O_EXCL) for device in lease.devices]
    except FileExistsError:
        sys.exit(3)
    time.sleep(random.uniform(0.001, 0.02))
    for device, mark in zip(lease.devices, marks):
        os.close(mark)
        os.unlink(held / device)
    lease.release()
print("done", flush=True)
"""


def test_jobs_of_two_devices_each_on_four_never_deadlock_nor_share_one(tmp_path):
    """8 processes, each leasing 2 of 4 devices 25 times at random intervals: all finish (no job
    holds some devices while it waits for others, so none waits for ever) and no device is ever
    held by two of them at once."""
    (tmp_path / "held").mkdir()
    code = COMPETITOR.format(held=str(tmp_path / "held"), rounds=25, count=2,
                             lock_dir=str(tmp_path / "locks"), gpus=4)
    jobs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=python_env())
            for _ in range(8)]
    try:
        outcomes = [(job.wait(timeout=240), job.stdout.read().strip()) for job in jobs]
    finally:
        for job in jobs:
            job.kill()
    assert outcomes == [(0, "done")] * 8


def test_a_job_waiting_for_two_devices_holds_none_meanwhile(tmp_path, holders):
    """With device 0 leased, a job that needs 2 of 2 waits; meanwhile device 1 stays free for any
    other job, and the waiting job gets both once they are free."""
    holders.append(start_holder(tmp_path, gpus=2))
    assert device_of(holders[0]) == "0"
    waiter = start_holder(tmp_path, gpus=2, count=2)
    holders.append(waiter)
    time.sleep(0.5)
    other = acquire_devices(env={}, lock_dir=tmp_path, count_gpus=lambda: 2, wait_s=5, poll_s=0.01)
    assert other.visible == "1"
    holders[0].kill()
    time.sleep(0.3)
    other.release()
    assert device_of(waiter) == "0,1"


def test_a_scheduler_job_uses_exactly_its_devices_or_leases_among_more(tmp_path):
    given = {"CUDA_VISIBLE_DEVICES": "4,5", "SLURM_JOB_ID": "9"}
    lease = acquire_devices(2, env=given, lock_dir=tmp_path, count_gpus=lambda: 8)
    assert (lease.visible, lease.source, lease.devices) == ("4,5", "scheduler", ["4", "5"])
    more = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_JOB_ID": "10"}
    first, second = (acquire_devices(2, env=more, lock_dir=tmp_path, count_gpus=lambda: 8) for _ in range(2))
    assert (first.visible, second.visible, first.source) == ("0,1", "2,3", "lease")
    for held in (first, second):
        held.release()


@pytest.mark.parametrize("env,says", [
    ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_ID": "9"}, "but the scheduler gave this job 1 (0)"),
    ({"CUDA_VISIBLE_DEVICES": "3"}, "but this job sees 1 (3)"),
    ({}, "but this job sees 1 (0)"),
])
def test_fewer_devices_than_an_engine_spans_is_refused_in_one_line(tmp_path, env, says):
    with pytest.raises(UserError) as refused:
        acquire_devices(2, env=env, lock_dir=tmp_path, count_gpus=lambda: 1, asked_by="generate.vllm.x")
    message = str(refused.value)
    assert message.startswith("generate.vllm.x is 2: one engine spans 2 GPUs, ") and says in message
    assert "\n" not in message


def test_an_engine_of_two_devices_without_a_gpu_runs_on_cpu(tmp_path):
    lease = acquire_devices(2, env={}, lock_dir=tmp_path, count_gpus=lambda: 0)
    assert (lease.visible, lease.source, lease.devices) == ("", "none", [])
