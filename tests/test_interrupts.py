"""Interrupts: Ctrl-C in the terminal (SIGINT to Snakemake's process group, every job included) and
SIGINT to Snakemake alone, which then waits for its running jobs and exits without marking their
outputs complete. Either way each job says one line, and the same command again resumes: finished
shards kept, a stopped shard going on from its committed windows (`shardinfer.snakefile.incomplete`,
`shardinfer.core.jobs`, `shardinfer.shard.stop`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import patience
from factory import prepare_workdir, python_env, read_predictions
from shardinfer.snakefile.incomplete import marks, settle, unmark
from shardinfer.snakefile.layout import Layout

ROWS = 48  # shard 0: rows [0, 24); shard 1: [24, 48), windows [24, 25), [25, 41), [41, 48) (sort_window 16)
STOP_AT = 44  # the hook blocks on the batch holding this row: shard 1 has committed the windows up to row 41

HOOK = '''
import os
import time
from pathlib import Path


def wait_while(path):
    while Path(path).exists():
        time.sleep(0.02)


class Predictor:
    outputs = {"blob": "file:.bin", "y": "float64"}

    def predict(self, table, index):
        rows = {int(i) for i in index}
        if int(os.environ.get("HOOK_STOP_AT", "-1")) in rows:
            Path("stopped.pid").write_text(str(os.getpid()))
            wait_while("stopped.pid")  # a long model call: until the job is signalled
        if os.environ.get("HOOK_HOLD"):  # the first call waits until the test lets it go
            Path("holding.pid").write_text(str(os.getpid()))
            wait_while(os.environ.pop("HOOK_HOLD"))
        with open("seen.txt", "a") as seen:
            seen.write("".join(f"{row}\\n" for row in sorted(rows)))
        values = table.column("x").to_pylist()
        return {"blob": [bytes([int(i)]) * 4 for i in index], "y": [float(v) * 2 for v in values]}


def build(model_path, options, device):
    return Predictor()
'''


def hook_run(folder: Path) -> tuple[list[str], dict]:
    """A custom hook writing a file and a value per row, over ROWS rows in 2 shards, in `folder`."""
    (folder / "hook.py").write_text(HOOK)
    pd.DataFrame({"id": [f"r{i}" for i in range(ROWS)], "x": np.arange(ROWS) * 1.5}).to_csv(folder / "data.csv",
                                                                                           index=False)
    config = {"input": {"path": "data.csv", "columns": ["x"], "keep_columns": ["id"]},
              "model": {"task": "custom", "entrypoint": "hook.py:build", "path": None},
              "batch": {"max_rows": 8, "sort_window": 16}, "shards": 2}
    return prepare_workdir(folder, config)


def start(folder: Path, command: list[str], env: dict, **extra: str) -> patience.Started:
    """The run in a process group of its own, as a terminal starts it (Ctrl-C signals the group),
    with SIGINT handled as a terminal leaves it: a suite started in the background of a
    non-interactive shell inherits SIGINT ignored, and Snakemake would then never hear it."""
    return patience.Started(command, [folder], merged=True, cwd=folder, env={**env, **extra}, start_new_session=True,
                            preexec_fn=terminal_signals)


def terminal_signals() -> None:
    """In the child, before it runs: SIGINT's default, as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def shard_mtimes(folder: Path) -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in (folder / "results" / "shards").glob("*.parquet")}


def seen_rows(folder: Path) -> list[int]:
    """The rows the hook computed, in all runs so far."""
    return sorted(int(row) for row in (folder / "seen.txt").read_text().split())


def ctrl_c_while_shard_1_computes(folder: Path, command: list[str], env: dict) -> str:
    """The run, until shard 0 is done (Snakemake saw it finish) and shard 1 is in a model call;
    then SIGINT to the process group, as Ctrl-C in a terminal sends it. What the terminal showed."""
    run = start(folder, command, env, HOOK_STOP_AT=str(STOP_AT))
    done = folder / "results" / "shards" / "0.parquet"
    patience.until(lambda: (folder / "stopped.pid").exists() and done.exists()
                   and "results/shards/0.parquet" not in marks(folder / ".snakemake"),
                   [folder], run.process, "shard 0 done and shard 1 in its model call")
    os.killpg(run.process.pid, signal.SIGINT)
    ended = run.finish("the interrupted run")
    assert ended.returncode != 0
    return ended.stdout


def sigint_to_snakemake_while_shard_1_computes(folder: Path, command: list[str], env: dict) -> None:
    """The run, until shard 1 is in its first model call; then SIGINT to Snakemake alone, which waits
    for the job, let go once Snakemake said so."""
    (folder / "hold").touch()
    run = start(folder, command, env, HOOK_HOLD=str(folder / "hold"))
    patience.until(lambda: (folder / "holding.pid").exists(), [folder], run.process, "shard 1 resumed")
    os.kill(run.process.pid, signal.SIGINT)
    patience.until(lambda: "Terminating processes on user request" in run.output(), [folder], run.process,
                   "Snakemake to notice")
    (folder / "hold").unlink()
    assert run.finish("the run stopped by SIGINT to Snakemake").returncode != 0


@pytest.mark.e2e
def test_an_interrupted_run_resumes_by_the_same_command_keeping_every_finished_shard(tmp_path):
    """Ctrl-C while shard 1 is in a model call (shard 0 done): each job says one line, shard 1
    commits its windows. The same command, stopped by SIGINT to Snakemake alone while shard 1 runs:
    Snakemake lets it finish but leaves its outputs marked incomplete. The same command again keeps
    both shard files (no shard job runs) and gathers; every row was computed once, but for the
    batch in flight at Ctrl-C."""
    command, env = hook_run(tmp_path)
    shown = ctrl_c_while_shard_1_computes(tmp_path, command, env)
    assert "shard 1: stopped by SIGINT at row 41; rerun resumes there" in shown, shown[-4000:]
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown, shown[-6000:]
    assert seen_rows(tmp_path) == list(range(41)) and list(shard_mtimes(tmp_path)) == ["0.parquet"]

    sigint_to_snakemake_while_shard_1_computes(tmp_path, command, env)
    assert "resumed at row 41 (17 rows kept)" in (tmp_path / "logs" / "infer" / "1.log").read_text()
    assert {"results/shards/1.parquet", "results/files/1"} <= set(marks(tmp_path / ".snakemake"))
    kept = shard_mtimes(tmp_path)
    assert sorted(kept) == ["0.parquet", "1.parquet"]

    third = patience.run(command, [tmp_path], cwd=tmp_path, env=env)
    shown = third.stdout + third.stderr
    assert third.returncode == 0, shown[-4000:]
    assert ("shardinfer: kept results/shards/1.parquet: its job finished in a run that was interrupted, and it "
            "proves complete") in shown
    assert "rule infer:" not in shown and "IncompleteFilesException" not in shown, shown[-4000:]
    assert shard_mtimes(tmp_path) == kept
    # recorded as finished, as Snakemake records a job it saw finish: a change of settings reruns it
    record = persistence(tmp_path)._read_record("results/shards/1.parquet")
    assert record is not None and record.rule == "infer" and record.params
    assert seen_rows(tmp_path) == list(range(ROWS))  # the kept shards' rows were not computed again
    table = read_predictions(tmp_path)
    assert table["index"].tolist() == list(range(ROWS)) and table["id"].tolist() == [f"r{i}" for i in range(ROWS)]
    assert table["y"].tolist() == [i * 3.0 for i in range(ROWS)]


def persistence(folder: Path):
    """Snakemake's own file persistence in `folder`/.snakemake, which writes and reads the marks."""
    from snakemake.persistence.file import FilePersistence

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return FilePersistence(nolock=True)
    finally:
        os.chdir(cwd)


def test_marks_are_read_as_snakemake_writes_them(tmp_path):
    """The path of each output Snakemake marks, long ones (cut into folders) included, and a mark removed
    as Snakemake removes it; read by Snakemake itself after."""
    store = persistence(tmp_path)
    long = "results/" + "x" * 400 + ".parquet"
    for key in ("results/shards/0.parquet", long, "results/files/3"):
        store._mark_incomplete(key, None)
    found = marks(tmp_path / ".snakemake")
    assert sorted(found) == sorted(["results/shards/0.parquet", long, "results/files/3"])
    unmark(found[long], tmp_path / ".snakemake")
    unmark(found["results/files/3"], tmp_path / ".snakemake")
    assert sorted(marks(tmp_path / ".snakemake")) == ["results/shards/0.parquet"]
    left = [path.name for path in (tmp_path / ".snakemake" / "incomplete").iterdir()]
    assert left == [found["results/shards/0.parquet"].name]
    store._clear_cache()
    assert store._filter_incomplete_keys([long, "results/shards/0.parquet"]) == {"results/shards/0.parquet"}


def test_what_an_interrupted_run_left_unproven_is_removed_to_run_again_and_nothing_while_locked(tmp_path, monkeypatch):
    """A plan cut short is removed, and the shard file made under it too (not proven: the plan was cut
    short); a table is removed; a mark of a missing output, or outside results/, is left to Snakemake."""
    monkeypatch.chdir(tmp_path)
    layout = Layout({None: SimpleNamespace(shards=2, digest="d")})
    for path in ("results/plan.json", "results/shards/0.parquet", "results/predictions.parquet", "mine.txt"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("written before the interrupt")
    store = persistence(tmp_path)
    for key in ("results/plan.json", "results/shards/0.parquet", "results/shards/1.parquet",
                "results/predictions.parquet", "mine.txt"):
        store._mark_incomplete(key, None)
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").write_text("another run")
    assert settle(layout).lines == [] and len(marks()) == 5
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").unlink()
    settled = settle(layout)
    assert settled.kept == [] and settled.lines == [
        "shardinfer: removed results/plan.json, left by a job an interrupted run did not see finish; it runs again",
        "shardinfer: removed results/predictions.parquet, left by a job an interrupted run did not see finish; it "
        "runs again",
        "shardinfer: removed results/shards/0.parquet, left by a job an interrupted run did not see finish: its plan "
        "was cut short too; it runs again"]
    assert sorted(marks()) == ["mine.txt", "results/shards/1.parquet"] and Path("mine.txt").exists()
    assert not list(Path("results").rglob("*.*"))


STARTING = """
import time
from shardinfer.core.jobs import quiet_interrupt, run_job
quiet_interrupt("plan")
print("importing", flush=True)
if {running!r}:
    run_job("job.log", time.sleep, 600)
time.sleep(600)  # the imports of a job's script: seconds
"""


@pytest.mark.parametrize("running", [False, True])
def test_a_job_interrupted_starting_or_running_says_one_line(tmp_path, running):
    code = STARTING.format(running=running)
    job = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=python_env())
    assert job.stdout.readline() == "importing\n"
    if running:
        patience.until(lambda: (tmp_path / "job.log").exists(), [tmp_path], job, "the job's log")
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=patience.HANG_S)
    assert job.returncode == 1
    if running:
        log = (tmp_path / "job.log").read_text().splitlines()
        assert err == "" and len(log) == 1 and log[0].endswith(
            "ERROR interrupted (SIGINT) before it finished: it wrote none of its outputs; rerun the same command")
    else:
        assert err == "shardinfer: the plan job was interrupted (SIGINT) while it started; it wrote nothing\n"
