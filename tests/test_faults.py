"""Faults injected into real `snakemake` runs; after each, the same command finishes the table
and it equals an undisturbed run row for row, or the run is refused with nothing written."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

import patience
import reference
from factory import (
    input_frame,
    prepare_workdir,
    read_predictions,
    run_workflow,
    run_workflows_ok,
    workflow_config,
    write_input,
)
from test_workflow import assert_refused, assert_same_rows, run_ok

pytestmark = pytest.mark.e2e  # every test here reads or remakes finished runs of the workflow

BIG = {"batch": {"max_tokens": 512, "max_rows": 32, "sort_window": 256}}


def start_workflow(workdir: Path, config: dict) -> subprocess.Popen:
    """The same command as run_workflow, in the background and its own process group."""
    command, env = prepare_workdir(workdir, config)
    return subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def wait_for_log(workdir: Path, text: str, running: subprocess.Popen) -> Path:
    """The first shard log that contains `text`, waited for while the run progresses (tests/patience.py)."""
    def said() -> Path | None:
        logs = sorted((workdir / "logs" / "infer").glob("*.log"))
        return next((log for log in logs if text in log.read_text(errors="replace")), None)

    return patience.until(said, [workdir], running, f"a shard log saying {text!r}")


def pid_writing(log: Path) -> int:
    """The process that holds `log` open: the shard job writing it."""
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(log.resolve()) for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
        except OSError:
            continue
    raise AssertionError(f"no process writes {log}")


@pytest.fixture(scope="module")
def references(models, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """This module's two finished runs, made at once: `undisturbed`, a 2-shard run long enough (12,000
    rows) to be killed in the middle of a shard, and `finished`, a short 2-shard run whose input path
    is relative, so that a copy of its folder is a run too."""
    undisturbed, finished = tmp_path_factory.mktemp("undisturbed"), tmp_path_factory.mktemp("finished")
    path = write_input(input_frame(12000, seed=11), undisturbed / "data" / "input.parquet")
    write_input(input_frame(50, seed=2), finished / "data" / "input.csv")
    runs = {"undisturbed": (undisturbed, workflow_config(path, models.classifier, shards=2, **BIG)),
            "finished": (finished, workflow_config("data/input.csv", models.classifier, shards=2))}
    run_workflows_ok(list(runs.values()))
    return runs


@pytest.fixture(scope="module")
def undisturbed(references):
    workdir, config = references["undisturbed"]
    return config["input"]["path"], config, read_predictions(workdir)


def shard_mtimes(workdir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (workdir / "results" / "shards").glob("*.parquet")}


def test_kill_a_shard_job_then_rerun(undisturbed, tmp_path):
    """SIGKILL in the middle of a shard, with part of its file written (the harder case than a kill
    before the first write, which leaves less behind)."""
    path, config, expected = undisturbed
    running = start_workflow(tmp_path, config)
    # the first progress line (`rows 256/4003 (6%), ...`), logged once a window is committed: part
    # of the shard written, the shard not done
    log = wait_for_log(tmp_path, " rows/s, ETA", running)
    os.kill(pid_writing(log), signal.SIGKILL)
    assert patience.wait(running, [tmp_path]) != 0
    killed = log.stem
    assert not (tmp_path / "results" / "shards" / f"{killed}.parquet").exists()
    assert not (tmp_path / "results" / "predictions.parquet").exists()
    before = shard_mtimes(tmp_path)
    result = run_workflow(tmp_path, config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert_same_rows(read_predictions(tmp_path), expected, float_columns={"probs"})
    if before:  # the terminal's speed is of the shards this run ran, not of the kept ones' earlier run
        said = f"{2 - len(before)} of 2 shards ran in this run ({len(before)} kept from earlier runs): "
        assert said in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
    after = shard_mtimes(tmp_path)
    assert all(after[name] == mtime for name, mtime in before.items())  # finished shards were not rerun
    assert set(after) == {"0.parquet", "1.parquet"}
    # the killed job had committed its first window (its progress line follows the commit): the
    # rerun kept it and computed only the rest
    entry = json.loads((tmp_path / "results" / "summary.json").read_text())["per_shard"][int(killed)]
    assert entry["resumed_rows"] > 0 and entry["rows"] > entry["resumed_rows"], entry
    log = (tmp_path / "logs" / "infer" / f"{killed}.log").read_text()
    assert f"({entry['resumed_rows']} rows kept)" in log and "resumed at row" in log, log[-3000:]


def test_kill_the_whole_snakemake_process_group_then_rerun(undisturbed, tmp_path):
    _, config, expected = undisturbed
    running = start_workflow(tmp_path, config)
    wait_for_log(tmp_path, "rows ", running)
    os.killpg(running.pid, signal.SIGKILL)
    running.wait()
    result = run_workflow(tmp_path, config)
    shown = result.stdout + result.stderr
    if "--unlock" in shown:  # a killed snakemake leaves its lock; Snakemake says how to lift it
        assert run_workflow(tmp_path, config, "--unlock").returncode == 0
        result = run_workflow(tmp_path, config)
    # no --rerun-incomplete: what the killed run left marked incomplete is settled (shardinfer.snakefile.incomplete)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_same_rows(read_predictions(tmp_path), expected, float_columns={"probs"})


@pytest.fixture(scope="module")
def finished_once(references):
    return references["finished"]


@pytest.fixture
def finished(finished_once, tmp_path):
    """A private copy of the finished run in `tmp_path` (files, mtimes and Snakemake's metadata),
    for a test that then changes it; the same as running it there, without the minutes."""
    workdir, config = finished_once
    shutil.copytree(workdir, tmp_path, dirs_exist_ok=True, symlinks=True)
    return tmp_path / "data" / "input.csv", copy.deepcopy(config)


def test_a_truncated_shard_is_refused_and_the_old_table_removed(finished, tmp_path):
    _, config = finished
    shard = tmp_path / "results" / "shards" / "1.parquet"
    shard.write_bytes(shard.read_bytes()[:200])
    result = run_workflow(tmp_path, config)
    assert_refused(result, tmp_path, "ERROR", "shard 1", "unreadable or truncated parquet")


def test_a_rerun_that_fails_after_the_input_changed_leaves_no_old_table(finished, tmp_path):
    """The input changed, so the plan is remade, and it fails (the text column is gone): the previous
    run's table and summary are gone, not left as if current. (A shard job withdraws them the same
    way: `jobs.run_job(outdated=)`, the param of plan and infer alike.)"""
    path, config = finished
    write_input(input_frame(50, seed=2).rename(columns={"text": "body"}), path)
    result = run_workflow(tmp_path, config)
    assert_refused(result, tmp_path, "input.text_column: column `text` is not in")
    assert not (tmp_path / "results" / "summary.json").exists()
    log = (tmp_path / "logs" / "plan.log").read_text()
    assert "removed results/predictions.parquet of the previous run: this run remakes it" in log


def test_a_changed_batch_size_keeps_every_finished_shard(finished, tmp_path):
    """max_rows and max_tokens decide how fast rows are computed, not what comes out."""
    _, config = finished
    before = shard_mtimes(tmp_path)
    config["batch"] = {"max_rows": 3, "max_tokens": 64}
    result = run_workflow(tmp_path, config)
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-3000:]
    assert "rule infer:" not in shown and "rule plan:" not in shown  # (gather reruns: the copy has new inodes)
    assert shard_mtimes(tmp_path) == before and len(before) == 2


def test_a_stray_file_is_refused(finished, tmp_path):
    _, config = finished
    (tmp_path / "results" / "shards" / "notes.parquet").write_text("not ours")
    result = run_workflow(tmp_path, config, "--forcerun", "gather")
    assert_refused(result, tmp_path, "stray file", "notes.parquet", "not part of the plan")


def test_a_replaced_input_with_an_older_mtime_is_replanned(finished, tmp_path, models):
    """What `cp -p`, `rsync -a` and `tar x` do: another table put in place with an mtime older than the
    plan's. Snakemake's mtime check alone answers "Nothing to be done" and keeps the old table. (An
    input edited the usual way, newer: the named inputs' `val`, tests/test_inputs.py.)"""
    path, config = finished
    plan = tmp_path / "results" / "plan.json"
    planned = json.loads(plan.read_text())["plan_id"]
    frame = input_frame(37, seed=7).assign(id=[f"new-{i}" for i in range(37)])
    write_input(frame, path)
    older = plan.stat().st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(older, older))
    got = run_ok(tmp_path, config)
    assert json.loads(plan.read_text())["plan_id"] != planned
    assert got["index"].tolist() == list(range(37)) and got["id"].tolist() == frame["id"].tolist()
    label_ids, probs = reference.classify(models.classifier, frame["text"].tolist(), max_length=32)
    assert got["label_id"].tolist() == label_ids.tolist()
    np.testing.assert_allclose(np.stack(got["probs"]), probs, atol=1e-5)


def test_changed_model_settings_rerun_every_shard(finished, tmp_path, models):
    path, config = finished
    before = shard_mtimes(tmp_path)
    config["model"]["max_length"] = 8
    got = run_ok(tmp_path, config)
    assert all(shard_mtimes(tmp_path)[name] != mtime for name, mtime in before.items())
    frame = input_frame(50, seed=2)
    _, probs = reference.classify(models.classifier, frame["text"].tolist(), max_length=8)
    np.testing.assert_allclose(np.stack(got["probs"]), probs, atol=1e-5)


def test_fewer_shards_remove_the_earlier_plans_files(finished, tmp_path):
    """`shards: auto` on a machine that resolves fewer (one core given): a new plan, never the old one's shards."""
    _, config = finished
    config["shards"] = "auto"
    result = run_workflow(tmp_path, config, "--cores", "1")
    shown = result.stdout + result.stderr
    assert result.returncode == 0, shown[-3000:]
    assert "shardinfer: shards: auto -> 1 (no GPU: 1 core, 1 thread per shard job)" in shown
    assert sorted(shard_mtimes(tmp_path)) == ["0.parquet"]
    assert read_predictions(tmp_path)["index"].tolist() == list(range(50))


def test_null_texts_are_reported_on_the_terminal_and_shell_syntax_in_paths_is_only_a_name(models, tmp_path):
    frame = input_frame(30)
    frame.loc[[4, 17], "text"] = None
    path = write_input(frame, tmp_path / "data" / "in put;$(touch PWNED)`touch PWNED2`'x.parquet")
    result = run_workflow(tmp_path, workflow_config(path, models.classifier, shards=2))
    assert_refused(result, tmp_path, "input.text_column `text` is null in 2 row(s) (first: 4, 17)")
    config = workflow_config(path, models.classifier, shards=2, input={"null_text": "empty"})
    got = run_ok(tmp_path, config)
    label_ids, _ = reference.classify(models.classifier, frame["text"].fillna("").tolist(), max_length=32)
    assert got["label_id"].tolist() == label_ids.tolist() and got["id"].tolist() == frame["id"].tolist()
    assert not list(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("folder", ["results", "results/shards", "logs/infer"])
def test_a_read_only_folder_the_run_writes_is_one_line_before_any_job(models, tmp_path, folder):
    """results/, or a folder below it or below logs/ that a rule writes into (the others writable):
    refused when the Snakefile loads, naming it, instead of a traceback at the first job that writes there."""
    # the folder is a read-only mount in a mount namespace of its own: the kernel refuses every
    # write there, root's too (a chmod would not stop root)
    path = write_input(input_frame(10), tmp_path / "data" / "input.parquet")
    (tmp_path / folder).mkdir(parents=True)
    command, env = prepare_workdir(tmp_path, workflow_config(path, models.classifier, shards=2))
    if shutil.which("unshare") is None and not os.environ.get("CI"):
        pytest.skip("unshare (util-linux) is not installed")
    mounted = ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o ro tmpfs {folder} && exec "$@"', "sh", *command]
    result = patience.run(mounted, cwd=tmp_path, env=env, watch=[tmp_path])
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if line.strip() and not line.startswith("Using workflow specific profile")]
    assert result.returncode == 1 and lines == [
        f"ERROR: `{folder}/` is not writable (Read-only file system): the workflow writes its plan, shards and "
        f"predictions under results/ and its logs under logs/; make `{folder}/` writable, or run from another folder"]

