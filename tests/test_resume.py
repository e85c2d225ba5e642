"""Resume inside a shard, and SIGTERM as a clean stop (`shardinfer.shard.resume`, `.stop`).

A shard job commits each window as it goes. These tests stop real shard jobs part way, by a real
SIGTERM (in this process: the handler raises in the main thread) and by SIGKILL (a job in a
process of its own), then run the same job again: it keeps exactly the committed windows, computes
only the rest, and writes the same table, per-row files included, as a job never stopped. Windows
of other settings, or damaged ones, are never reused. The end-to-end run (SIGTERM to a shard job
under `snakemake`, then the same command again) is in tests/test_row_errors.py, where it also
carries the row-error counts across the resume.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import patience
import plugins
from factory import REPO, gather_job, input_frame, input_settings, python_env, write_input
from shardinfer.contract.shard_file import STATS_KEY
from shardinfer.core.errors import UserError
from shardinfer.plan.plan_file import remove_stale_shards, run_plan
from shardinfer.proof.gather import run_gather
from shardinfer.settings.config import BatchSettings, ModelSettings, Settings
from shardinfer.shard import job as job_module
from shardinfer.shard.job import run_shard
from shardinfer.shard.resume import windows_folder
from shardinfer.shard.runtime import ShardJob
from shardinfer.shard.tokenize_job import TokenizeJob, run_tokenize
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.snakefile.settings_digest import output_digest

ROWS = 60
# sort_window 16: windows [0, 1) (the short first one), [1, 17), [17, 33), [33, 49), [49, 60).
STOP_AT = 40  # the hook blocks on the batch holding this row: windows up to row 33 are committed

HOOK = '''
import os
import time
from pathlib import Path

class Predictor:
    outputs = {"blob": "file:.bin", "y": "float64"}

    def predict(self, table, index):
        with open("seen.txt", "a") as seen:
            seen.write("".join(f"{int(i)}\\n" for i in index))
        if int(os.environ.get("HOOK_STOP_AT", "-1")) in {int(i) for i in index}:
            Path("stopped.pid").write_text(str(os.getpid()))
            while True:  # a long model call, until the job is signalled
                time.sleep(0.02)
        return {"blob": [bytes([int(i)]) * 4 for i in index],
                "y": [float(v) * 2 for v in table.column("x").to_pylist()]}

def build(model_path, options, device):
    return Predictor()
'''


CONFIG = {"input": {"path": "data.csv", "columns": ["x"], "keep_columns": ["id"]},
          "model": {"task": "custom", "entrypoint": "hook.py:build", "path": None},
          "batch": {"max_rows": 8, "sort_window": 16}, "shards": 1}


def hook_job(folder: Path, make: bool = True) -> ShardJob:
    """The shard job of a custom hook writing a file and a value per row, over ROWS rows of
    data.csv, in `folder` (paths relative to it: run it there); `make`: write the data, the hook
    and the plan first."""
    from snakemake.utils import validate

    cwd = os.getcwd()
    os.chdir(folder)
    try:
        if make:
            Path("hook.py").write_text(HOOK)
            pd.DataFrame({"id": [f"r{i}" for i in range(ROWS)], "x": np.arange(ROWS) * 1.5}).to_csv("data.csv",
                                                                                                  index=False)
        config = json.loads(json.dumps(CONFIG))
        validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
        settings = settings_from_config(config)
        if make:
            run_plan(settings.input, 1, settings.model.max_length, "plan.json")
        return ShardJob(settings, "plan.json", 0, "shards/0.parquet", output_digest(settings), files="files/0")
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The table and files of the hook's shard job run once, never stopped."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    job = hook_job(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        run_shard(job)
    finally:
        os.chdir(cwd)
    return pq.read_table(folder / job.output), files_of(folder / job.files)


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def seen_rows() -> list[int]:
    return [int(line) for line in Path("seen.txt").read_text().split()]


def sigterm_when_blocked() -> dict:
    """SIGTERM to this process once the hook blocks (as Slurm sends it at a time limit); the
    returned dict gets the time it was sent."""
    sent = {}

    def watch() -> None:
        while not Path("stopped.pid").exists():
            time.sleep(0.01)
        sent["at"] = time.perf_counter()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    return sent


def stopped_by_sigterm(job: ShardJob, monkeypatch) -> float:
    """Run `job` until the hook blocks at STOP_AT and SIGTERM stops it; the seconds the stop took."""
    monkeypatch.setenv("HOOK_STOP_AT", str(STOP_AT))
    sent = sigterm_when_blocked()
    with pytest.raises(UserError) as caught:
        run_shard(job)
    stopped = time.perf_counter() - sent["at"]
    assert str(caught.value) == "shard 0: stopped by SIGTERM at row 33; rerun resumes there"
    Path("stopped.pid").unlink()
    monkeypatch.delenv("HOOK_STOP_AT")
    return stopped


def test_a_sigterm_stops_the_shard_at_once_and_the_rerun_computes_only_the_rest(tmp_path, monkeypatch, caplog,
                                                                               uninterrupted):
    job = hook_job(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert stopped_by_sigterm(job, monkeypatch) < 5  # within seconds, inside a model call that never returns
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the job's alone
    assert not Path(job.output).exists() and not Path(job.files).exists()  # no partial table, no files folder
    windows = windows_folder(job.output)
    assert sorted(p.name for p in windows.glob("*.parquet")) == [f"{row:012d}.parquet" for row in (0, 1, 17)]
    Path("seen.txt").unlink()
    caplog.set_level(logging.INFO)
    stats = run_shard(job)
    assert "resumed at row 33 (33 rows kept)" in caplog.text
    assert seen_rows() == list(range(33, ROWS))  # the kept rows were not computed again
    assert stats["rows"] == ROWS and stats["resumed_rows"] == 33
    assert json.loads(pq.read_metadata(job.output).metadata[STATS_KEY])["resumed_rows"] == 33
    table, files = uninterrupted
    assert pq.read_table(job.output).equals(table) and files_of(Path(job.files)) == files
    assert not windows.exists()  # the shard file is complete: its windows are gone
    settings = job.settings
    summary = run_gather(gather_job("plan.json", [job.output], settings.input, settings.to_dict()["model"],
                                    job.digest, "out.parquet", "out.json", files_folders=[job.files]))
    assert summary["per_shard"][0]["resumed_rows"] == 33 and summary["run"]["resumed_rows"] == 33


KILLED_JOB = """
from test_resume import hook_job, run_shard
from pathlib import Path
run_shard(hook_job(Path.cwd(), make=False))
"""


def test_a_killed_job_loses_at_most_the_window_it_was_computing(tmp_path, monkeypatch, caplog, uninterrupted):
    """SIGKILL (a lost node, OOM killer, a grace period over): no handler runs; the rerun keeps
    what the writer had committed and removes the rest (the files written ahead of their window)."""
    monkeypatch.chdir(tmp_path)
    hook_job(tmp_path)
    script = tmp_path / "job.py"
    script.write_text(KILLED_JOB)
    process = subprocess.Popen([sys.executable, str(script)], env=python_env(HOOK_STOP_AT=str(STOP_AT)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    window = windows_folder("shards/0.parquet") / f"{17:012d}.parquet"
    patience.until(lambda: Path("stopped.pid").exists() and window.exists(), [tmp_path], process, "the hook to block")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL and not Path("shards/0.parquet").exists()
    Path("seen.txt").unlink()
    caplog.set_level(logging.INFO)
    job = hook_job(tmp_path, make=False)
    stats = run_shard(job)
    assert "resumed at row 33 (33 rows kept)" in caplog.text and stats["resumed_rows"] == 33
    assert seen_rows() == list(range(33, ROWS))
    table, files = uninterrupted
    assert pq.read_table(job.output).equals(table) and files_of(Path(job.files)) == files


@pytest.mark.parametrize("change", ["settings digest", "plan", "damaged window"])
def test_windows_of_other_settings_or_plans_or_damaged_ones_are_not_reused(tmp_path, monkeypatch, caplog,
                                                                           uninterrupted, change):
    job = hook_job(tmp_path)
    monkeypatch.chdir(tmp_path)
    stopped_by_sigterm(job, monkeypatch)
    Path("seen.txt").unlink()
    if change == "settings digest":
        job = ShardJob(job.settings, job.plan_path, 0, job.output, "another digest", files=job.files)
    elif change == "plan":  # the same rows cut again: another plan id
        plan = json.loads(Path("plan.json").read_text())
        plan["plan_id"] = "another plan"
        Path("plan.json").write_text(json.dumps(plan))
    else:  # window [1, 17) damaged on disk: it and every window after it are computed again
        path = windows_folder(job.output) / f"{1:012d}.parquet"
        data = bytearray(path.read_bytes())
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))
    caplog.set_level(logging.INFO)
    stats = run_shard(job)
    if change == "damaged window":
        assert "resumed at row 1 (1 rows kept)" in caplog.text and seen_rows() == list(range(1, ROWS))
        assert "not keeping committed window 000000000001.parquet" in caplog.text
    else:
        assert "resumed at" not in caplog.text and seen_rows() == list(range(ROWS))
        assert "not keeping committed window 000000000000.parquet: made under another plan or settings" in caplog.text
        assert stats["resumed_rows"] == 0
    table, files = uninterrupted
    got = pq.read_table(job.output)
    assert got.to_pandas().equals(table.to_pandas()) and files_of(Path(job.files)) == files


def test_a_text_task_with_token_ids_made_ahead_resumes_to_the_same_rows_and_totals(models, tmp_path, monkeypatch,
                                                                                   caplog):
    """classify, reading the tokenize rule's file: the rerun reads token ids from the first row it
    computes, and the shard's stats (tokens, lengths, truncations) cover the kept rows too."""
    frame = input_frame(200, seed=5)
    frame.loc[150, "text"] = "long " * 100  # truncated, after the stop: counted by the second job
    frame.loc[3, "text"] = "long " * 100  # truncated, before the stop: counted in the kept windows
    inp = input_settings(write_input(frame, tmp_path / "in.parquet"), keep_columns=("id",))
    model = ModelSettings(path=str(models.classifier), adapter=None, task="classify", max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    settings = Settings(input=inp, model=model, batch=BatchSettings(512, 16, 32), shards=1)
    run_plan(inp, 1, 32, str(tmp_path / "plan.json"))
    tokens = str(tmp_path / "tokens.parquet")
    run_tokenize(TokenizeJob(settings, str(tmp_path / "plan.json"), 0, tokens, "key"))

    def job(name):
        return ShardJob(settings, str(tmp_path / "plan.json"), 0, str(tmp_path / name), "digest", tokens=tokens,
                        tokenizer_key="key")

    whole = run_shard(job("whole.parquet"))
    real_predict = job_module.predict_window

    def stop_at_row_100(task, window, device, errors):
        if window.window.first >= 100:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here, in the main thread
        return real_predict(task, window, device, errors)

    monkeypatch.setattr(job_module, "predict_window", stop_at_row_100)
    with pytest.raises(UserError, match=r"stopped by SIGTERM at row (\d+); rerun resumes there"):
        run_shard(job("resumed.parquet"))
    monkeypatch.setattr(job_module, "predict_window", real_predict)
    caplog.set_level(logging.INFO)
    resumed = run_shard(job("resumed.parquet"))
    # sort_window 32: windows [0, 2), [2, 34), ... [98, 130), [130, 162): stopped on the last
    assert resumed["resumed_rows"] == 130 and "resumed at row 130 (130 rows kept)" in caplog.text
    for key in ("rows", "real_tokens", "truncated", "first_truncated_rows", "token_lengths"):
        assert resumed[key] == whole[key], key
    assert resumed["padded_tokens"] >= resumed["real_tokens"]  # the batches differ: a window starts at the resume
    got, want = pq.read_table(job("resumed.parquet").output), pq.read_table(job("whole.parquet").output)
    assert got.select(["index", "id", "label"]).equals(want.select(["index", "id", "label"]))
    np.testing.assert_allclose(np.stack(got.column("probs").to_pylist()), np.stack(want.column("probs").to_pylist()),
                               atol=1e-5)


def test_a_new_plan_with_fewer_shards_removes_the_windows_of_shards_it_no_longer_has(tmp_path):
    shards = tmp_path / "shards"
    for name in ("1.parquet.windows", "3.parquet.windows"):
        (shards / f".{name}").mkdir(parents=True)
        (shards / f".{name}" / "000000000000.parquet").write_bytes(b"x")
    removed = remove_stale_shards(str(shards), 2)
    assert removed == [str(shards / ".3.parquet.windows")] and (shards / ".1.parquet.windows").is_dir()


def test_the_slurm_profile_asks_for_sigterm_ahead_of_the_time_limit():
    """The plugin passes `slurm_extra` to sbatch as it is (its own code, checked here): the shard
    jobs get SIGTERM 120 s before their time limit, time to commit and stop cleanly."""
    from types import SimpleNamespace

    import yaml

    plugins.importable()  # beside the venv (tests/install-plugins)
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    infer = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())["set-resources"]["infer"]
    # quoted twice, as the plugin's docs ask: Snakemake reads a resource's value as an expression
    assert infer["slurm_extra"] == "'--signal=TERM@120'"
    infer = {**infer, "slurm_extra": ast.literal_eval(infer["slurm_extra"])}
    resources = SimpleNamespace(**infer, get=lambda key, default=None: infer.get(key, default))
    job = SimpleNamespace(resources=resources, threads=8, is_group=lambda: False)
    validate_slurm_extra(job)  # not an option the plugin manages itself
    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "", "partition": "",
              "workdir": ".", "wildcard_str": "", "rule_name": "infer"}
    try:
        call = get_submit_command(job, params)
    except (AttributeError, TypeError, KeyError) as error:  # a job object it reads more of
        pytest.fail(f"the plugin's submit string needs more of the job: {error!r}")
    assert " --signal=TERM@120" in call
