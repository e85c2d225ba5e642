"""Task custom: a user's own PyTorch code with a file per row, proven at gather like the rows.

Two real `snakemake` runs of the image-transfer example (1 and 3 shards) are shared by the
end-to-end checks; tampering with files is checked by calling gather on copies of the 3-shard
run, and the hook's faults by running single shard jobs, both without starting Snakemake again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from factory import REPO, gather_job, python_env, read_predictions, run_workflows_ok
from shardinfer.contract.shard_file import IDENTITY_KEY
from shardinfer.core.errors import ProofError, UserError
from shardinfer.plan.plan_file import remove_stale_shards, run_plan
from shardinfer.proof.gather import run_gather
from shardinfer.settings.config import Settings
from shardinfer.shard.job import run_shard
from shardinfer.shard.resume import resume_row, windows_folder
from shardinfer.shard.runtime import ShardJob
from shardinfer.snakefile.configure import settings_from_config
from shardinfer.snakefile.settings_digest import output_digest

EXAMPLE = REPO / "examples" / "image-transfer"
ROWS = 13


def example_config(shards: int, **model) -> dict:
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    config["shards"] = shards
    config["model"]["options"] = {"steps": 3, "seed": 0}
    config["model"].update(model)
    config["batch"] = {"max_rows": 4}
    return config


@pytest.fixture(scope="module")
def made_example(tmp_path_factory) -> Path:
    """What `python make_example.py` writes (fewer rows), made once: it is seeded, so every build
    writes the same bytes, and each test copies it (`build_example`) instead of running it again."""
    folder = tmp_path_factory.mktemp("made-example")
    subprocess.run([sys.executable, str(EXAMPLE / "make_example.py"), "--rows", str(ROWS), "--out", str(folder)],
                   check=True, capture_output=True)
    return folder


def build_example(workdir: Path, made: Path) -> Path:
    """The example folder as a user has it after `python make_example.py` (fewer rows and steps)."""
    shutil.copytree(EXAMPLE / "hooks", workdir / "hooks")
    shutil.copytree(made, workdir, dirs_exist_ok=True)
    return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, made_example):
    """{shards: workdir} for finished runs with 1 and 3 shards, made at once (the 3-shard run's report
    is read)."""
    done = {shards: build_example(tmp_path_factory.mktemp(f"custom-{shards}"), made_example) for shards in (1, 3)}
    run_workflows_ok([(workdir, example_config(shards)) for shards, workdir in done.items()], report=True)
    return done


def file_bytes(workdir: Path, described: dict) -> bytes:
    return (workdir / described["path"]).read_bytes()


@pytest.mark.e2e
def test_every_row_has_its_file_equal_to_the_hook_run_directly(runs):
    workdir = runs[3]
    got = read_predictions(workdir)
    assert got["index"].tolist() == list(range(ROWS)) and got["id"].tolist() == [f"img-{i:05d}" for i in range(ROWS)]
    sys.path.insert(0, str(EXAMPLE))
    from make_example import load_hook

    hook = load_hook(workdir / "hooks" / "transfer.py")
    import torch

    predictor = hook.build(str(workdir / "models"), {"steps": 3, "seed": 0}, torch.device("cpu"))
    table = pq.read_table(workdir / "data" / "images.parquet", columns=["img", "cond"])
    want = predictor.predict(table, np.arange(ROWS, dtype=np.int64))
    for row, described in enumerate(got["image"]):
        shard = next(s for s in range(3) if f"results/files/{s}/" in described["path"])
        assert described["path"] == f"results/files/{shard}/{row:09d}.png"
        data = file_bytes(workdir, described)
        assert data == want["image"][row]
        assert described["size"] == len(data) and described["sha256"] == hashlib.sha256(data).hexdigest()
    np.testing.assert_allclose(got["mean_change"], want["mean_change"], rtol=1e-6)
    names = sorted(p.name for p in (workdir / "results" / "files").rglob("*.png"))
    assert names == [f"{i:09d}.png" for i in range(ROWS)]  # one file per row, none twice, none else
    # The report fits the task: custom rows are no texts, so no token-length figure and no padding.
    report = sorted(p.name for p in (workdir / "results" / "report").iterdir())
    assert report == ["rows_per_s.png", "run.html", "shards.html", "stages.png"]
    assert "padding ratio" not in (workdir / "results" / "report" / "shards.html").read_text()


@pytest.mark.e2e
def test_one_and_three_shards_give_byte_identical_files(runs):
    one, three = read_predictions(runs[1]), read_predictions(runs[3])
    assert one["index"].tolist() == three["index"].tolist()
    for a, b in zip(one["image"], three["image"]):
        assert file_bytes(runs[1], a) == file_bytes(runs[3], b) and a["sha256"] == b["sha256"]
    np.testing.assert_array_equal(one["mean_change"], three["mean_change"])


def gather_copy(workdir: Path, tmp_path: Path, tamper) -> Path:
    """Copy a finished run, change it, and run gather's own function on the copy, handing it the
    files folders as the gather rule does."""
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, symlinks=True)
    os.chdir(copy)
    tamper(copy / "results" / "files")
    settings = settings_from_config(json_roundtrip(example_config(3)))
    shards = [f"results/shards/{i}.parquet" for i in range(3)]
    run_gather(gather_job("results/plan.json", shards, settings.input, settings.to_dict()["model"],
                          output_digest(settings), "results/out.parquet", "results/out.json",
                          files_folders=[f"results/files/{i}" for i in range(3)]))
    return copy


def json_roundtrip(config: dict) -> dict:
    """A config as the Snakefile hands it on: validated with defaults filled."""
    from snakemake.utils import validate

    config = json.loads(json.dumps(config))
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return config


def swap(folder: Path) -> None:
    a, b = folder / "1" / f"{5:09d}.png", folder / "1" / f"{6:09d}.png"
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def flip_a_byte(folder: Path) -> None:
    path = folder / "1" / f"{7:09d}.png"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("tamper,message", [
    (lambda f: (f / "1" / f"{5:09d}.png").unlink(), r"row 5: file `results/files/1/000000005.png` is missing"),
    (lambda f: (f / "2" / f"{10:09d}.png").write_bytes((f / "2" / f"{10:09d}.png").read_bytes()[:-9]),
     r"row 10: file `.*000000010.png` has \d+ bytes, its row records \d+ \(truncated"),
    (swap, r"row 5: file `.*000000005.png` (has \d+ bytes, its row records \d+|is not the file its row records)"),
    (flip_a_byte,
     r"row 7: file `.*000000007.png` is not the file its row records \(SHA-256 differs: altered or swapped"),
    (lambda f: (f / "0" / "000000099.png").write_bytes(b"x"),
     r"file `.*000000099.png` is in the shard's files folder but no row names it"),
    (lambda f: shutil.copytree(f / "1", f / "3"),
     r"stray entry `.*results/files/3` in the files folder is not a planned shard's"),
    (lambda f: (f / ".4.partial").mkdir(), r"stray entry `.*results/files/\.4\.partial` in the files folder"),
    (lambda f: set_files_identity(f.parent / "shards" / "1.parquet", folder="results/files/0"),
     r"shard 1 \(`results/shards/1.parquet`\): names files folder `results/files/0`, expected `results/files/1`"),
    (lambda f: set_files_identity(f.parent / "shards" / "1.parquet", files=None),
     r"shard 1 .*: names no files folder, expected `results/files/1`"),
    (lambda f: set_files_identity(f.parent / "shards" / "1.parquet", columns={}),
     r"shard 1 .*: its metadata names file columns \[\], its schema has \['image'\]"),
])
@pytest.mark.e2e
def test_a_missing_truncated_swapped_or_extra_file_is_refused(runs, tmp_path, tamper, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProofError, match=message) as caught:
        gather_copy(runs[3], tmp_path, tamper)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "copy" / "results" / "out.parquet").exists()


def set_files_identity(path: Path, **change) -> None:
    """Rewrite a shard file with its identity's `files` changed (`files=None`: removed), values kept."""
    table = pq.read_table(path)
    metadata = {k: v for k, v in pq.read_metadata(path).metadata.items() if k != b"ARROW:schema"}
    identity = json.loads(metadata[IDENTITY_KEY])
    if "files" in change and change["files"] is None:
        del identity["files"]
    else:
        identity["files"].update(change)
    metadata[IDENTITY_KEY] = json.dumps(identity).encode()
    pq.write_table(table.replace_schema_metadata(metadata), path)


@pytest.mark.e2e
def test_the_untouched_copy_gathers(runs, tmp_path, monkeypatch):
    """A killed job's staging leftover of a planned shard (`.1.partial`) is allowed beside the folders."""
    monkeypatch.chdir(tmp_path)
    copy = gather_copy(runs[3], tmp_path, lambda folder: (folder / ".1.partial").mkdir())
    assert pq.read_table(copy / "results" / "out.parquet").num_rows == ROWS


def test_replanning_to_fewer_shards_removes_the_extra_shards_files(tmp_path):
    """5 -> 3 shards: shard files 3 and 4, their files folders and their staging leftovers go; the
    planned shards' own (remade by Snakemake) and anything not numbered stay."""
    shards, files = tmp_path / "shards", tmp_path / "files"
    for name in ("0", "2", "3", "4", ".1.partial", ".4.partial", "notes"):
        (files / name).mkdir(parents=True)
        (files / name / "000000001.png").write_bytes(b"x")
    shards.mkdir()
    for k in range(5):
        (shards / f"{k}.parquet").write_bytes(b"x")
    removed = remove_stale_shards(str(shards), 3, str(files))
    assert sorted(Path(p).name for p in removed) == [".4.partial", "3", "3.parquet", "4", "4.parquet"]
    assert sorted(p.name for p in files.iterdir()) == [".1.partial", "0", "2", "notes"]
    assert sorted(p.name for p in shards.iterdir()) == ["0.parquet", "1.parquet", "2.parquet"]


HOOK = '''
import os, signal, time
import numpy as np

class Predictor:
    outputs = {{"blob": "file:.bin", "score": "float32"}}

    def predict(self, batch, index):
        {body}
        return {{"blob": [bytes([int(i) % 251]) * 10 for i in index], "score": [float(i) for i in index]}}

def build(model_path, options, device):
    return Predictor()
'''


def shard_job_with(tmp_path: Path, made: Path, body: str, shard: int = 1) -> ShardJob:
    """A 3-shard plan of the example's input (shard 1: rows 4..8) and shard `shard`'s job running a
    hook with `body`, in windows of 4 rows so that a window is written before the next is run."""
    (tmp_path / "hook.py").write_text(HOOK.format(body=body))
    if not (tmp_path / "data").exists():
        build_example(tmp_path, made)
    config = example_config(3, entrypoint="hook.py:build", path=None)
    config["batch"] = {"max_rows": 4, "sort_window": 4}
    settings = settings_from_config(json_roundtrip(config))
    run_plan(settings.input, 3, settings.model.max_length, "plan.json")
    return ShardJob(Settings.from_dict(settings.to_dict()), "plan.json", shard, f"shards/{shard}.parquet", "d",
                    files=f"files/{shard}")


@pytest.mark.parametrize("body,message", [
    ("raise RuntimeError('bad pixel')",
     r"predict failed on row 4: .*RuntimeError: bad pixel.*traceback in this shard's log"),
    ("return {'blob': [b'x'], 'score': [1.0]}", r"column `blob` has 1 value\(s\) for [14] rows"),
    ("return {'blob': [b'x'] * len(index), 'score': [1.0] * len(index), 'extra': [1] * len(index)}",
     r"columns \['extra'\] are not declared in outputs"),
    ("return {'blob': [b'x'] * len(index), 'score': ['high'] * len(index)}",
     r"row 4: column `score` is declared float32 but got 'high'"),
    ("return {'blob': ['not bytes'] * len(index), 'score': [1.0] * len(index)}",
     r"row 4: column `blob` is a file column; its value must be bytes"),
])
def test_hook_faults_fail_the_shard_in_one_line_and_leave_nothing(tmp_path, made_example, monkeypatch, body, message,
                                                                   caplog):
    monkeypatch.chdir(tmp_path)
    job = shard_job_with(tmp_path, made_example, body)
    with pytest.raises(UserError, match=message) as caught:
        run_shard(job)
    assert "\n" not in str(caught.value)
    assert not Path(job.output).exists() and not Path(job.files).exists()
    # what stays is the committed windows and their files, for a rerun to resume from; nothing else
    committed = resume_row(windows_folder(job.output), 4)
    assert sorted(p.name for p in tmp_path.glob("files/.*.partial/*")) == [f"{i:09d}.bin" for i in range(4, committed)]
    if committed == 4:
        assert not list(tmp_path.glob("files/.*.partial")) and not list(tmp_path.glob("shards/.*"))
    if "RuntimeError" in body:
        assert "Traceback" in caplog.text and "bad pixel" in caplog.text and "hook.py" in caplog.text


def test_a_killed_shard_job_leaves_neither_its_table_nor_its_files(tmp_path, made_example, monkeypatch):
    """The hook kills its own process once the first batch was written: no final names appear. It waits
    for the first window's commit (up to 20 s), not a fixed time: the writer's first window may import
    pandas (pyarrow does, on its first `pa.array` of a list), which takes seconds on a loaded machine."""
    monkeypatch.chdir(tmp_path)
    committed = "__import__('glob').glob('shards/.1.parquet.windows/*.parquet')"
    body = (f"[time.sleep(0.05) for _ in range(400) if index[0] >= 5 and not {committed}]; "
            "os.kill(os.getpid(), signal.SIGKILL) if index[0] >= 5 else None")
    job = shard_job_with(tmp_path, made_example, body)
    code = "import pickle; from shardinfer.shard.job import run_shard; run_shard(pickle.load(open('job.pkl', 'rb')))"
    import pickle

    (tmp_path / "job.pkl").write_bytes(pickle.dumps(job))
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=python_env())
    assert killed.returncode == -signal.SIGKILL
    assert not Path(job.output).exists() and not Path(job.files).exists()
    leftovers = list(tmp_path.glob("files/.*.partial/*"))
    assert leftovers, "the first batch's files were staged before the kill"
    (tmp_path / "hook.py").write_text(HOOK.format(body="pass"))
    stats = run_shard(job)  # the rerun clears the staging folder and completes
    assert stats["rows"] == 5
    assert sorted(p.name for p in Path(job.files).iterdir()) == [f"{i:09d}.bin" for i in range(4, 9)]
    assert not list(tmp_path.glob("files/.*.partial"))


def test_a_job_with_file_columns_but_no_files_folder_is_refused_in_one_line(tmp_path, made_example, monkeypatch):
    """A caller outside Snakemake that leaves ShardJob.files unset: named, not an Arrow type error."""
    monkeypatch.chdir(tmp_path)
    job = dataclasses.replace(shard_job_with(tmp_path, made_example, "pass"), files=None)
    with pytest.raises(UserError, match=r"declares file column\(s\) \['blob'\] but shard 1's job has no files folder"):
        run_shard(job)
    assert not Path(job.output).exists() and not list(tmp_path.glob("files*"))
