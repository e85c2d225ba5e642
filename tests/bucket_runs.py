"""The runs of tests/test_storage.py against the bucket, made in a background thread: the first one
(which must succeed, and equal a shared-filesystem run), the second (a forced replan to one shard, with the
input object changed while the shards run, which gather must refuse), and a third over a named
input whose parts the bucket's listing finds (a folder of Parquet parts), written as a folder of parts
(output.layout: parts), and a fourth beside it over an OpenAI batch file (task generate, the
transformers engine, two lines), whose gather writes the batch output file into the bucket. What
the tests read of each is kept as it was right after it (its terminal, its objects, its job
folders), since the second run removes the first's table.

The `bucket_runs` fixture (tests/conftest.py) starts them when first asked; tests/test_slurm.py asks
along with its own runs, whose jobs mostly wait for Slurm's status checks, so that the two overlap
instead of following each other (each costs about 30 s of Snakemake and torch start-ups).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

import factory
import patience
import plugins

REPO = Path(__file__).resolve().parents[1]
ROWS, SHARDS = 1000, 2  # as classify_runs(1000, 1), the shared-filesystem run it must equal
PREFIX = "storage-test"
INPUT = "data/input.parquet"
MODEL = "model"  # model.path, relative to the clone
SUBMIT = REPO / "tests" / "storage" / "submit-in-empty-folder"
STATUS = REPO / "tests" / "storage" / "job-status"
# What the tests read of a run's objects, kept right after it.
KEPT = ("results/predictions.parquet", "results/summary.json", "results/plan.json",
        *(f"results/cuts/{shard}.parquet" for shard in range(SHARDS)), "logs/infer/0.log")
# No run here has a time limit of its own: each is waited for while it progresses (tests/patience.py).
# A limit of 300 s failed five tests on a busy machine where the first run took 6 m 52 s, correctly.
# The third run's named input `val` (one shard), in the bucket under PARTS_PREFIX: a folder of the ROWS
# rows in three Parquet parts (part names sort in row order), beside what a folder's listing passes
# over. (A glob's listing is checked against the filesystem's in tests/test_parts.py, and against this
# server by a refusal in tests/test_storage.py.)
PARTS_PREFIX = "storage-parts"
VAL_PARTS = {"data/val/part-0.parquet": (0, 400), "data/val/part-1.parquet": (400, 700),
             "data/val/sub/part-2.parquet": (700, ROWS)}
PASSED_OVER = {"data/val/_SUCCESS": (0, 0), "data/val/README.md": (0, 0), "data/val/_temporary/part-9.parquet": (0, 5),
               "data/val.jsonl": (0, 5)}
# It writes the parts layout (output.layout: parts), two shards: each shard job writes its part into the
# bucket's folder, and gather proves them by the shard jobs' records without downloading them.
PARTS_SHARDS = 2
PARTS_FOLDER = "results/val/predictions/"
PARTS_KEPT = (*(f"results/val/{path}" for path in ("summary.json", "plan.json")), f"{PARTS_FOLDER}.manifest.json",
              *(f"{PARTS_FOLDER}part-{k:05d}-of-{PARTS_SHARDS:05d}.parquet" for k in range(PARTS_SHARDS)))


# The fourth run's OpenAI batch file (task generate over the tiny byte-level Llama), under BATCH_PREFIX:
# two lines, their custom_ids out of sorted order, so that the output's order is the input's.
BATCH_PREFIX = "storage-batch"
BATCH_INPUT = "data/batch.jsonl"
BATCH_IDS = ("line-b", "line-a")
BATCH_KEPT = ("results/batch_output.jsonl", "results/batch_errors.jsonl", "results/summary.json")


class BucketRun:
    """The workflow run from a clone (`workdir`) against the bucket under `prefix`, each job in its own
    folder under `jobs`; its model the tiny classifier, or `model`."""

    def __init__(self, s3, models, workdir: Path, jobs: Path, config: dict, prefix: str, model: Path | None = None):
        self.s3, self.workdir, self.jobs, self.prefix = s3, factory.workflow_clone(workdir), jobs, prefix
        jobs.mkdir(parents=True)
        # The model in the clone, named by a relative path, which in a job's empty folder names
        # nothing: the jobs load it from their downloaded copies (rule stage_model put them in the bucket).
        shutil.copytree(model or models.classifier, self.workdir / MODEL)
        self.set_config(config)

    def config(self) -> dict:
        return yaml.safe_load((self.workdir / "config" / "config.yaml").read_text())

    def set_config(self, config: dict) -> None:
        (self.workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))

    def key(self, path: str) -> str:
        return f"{self.prefix}/{path}"

    def command(self, *args: str) -> tuple[list[str], dict]:
        command = [sys.executable, "-m", "snakemake", "--profile", "profiles/s3", *self.s3.storage_args(self.prefix),
                   "--executor", "cluster-generic", "--cluster-generic-submit-cmd", f"{SUBMIT} {self.jobs}",
                   "--cluster-generic-status-cmd", str(STATUS), "--job-deploy-sources", "--jobs", "2",
                   "--seconds-between-status-checks", "1", "--set-threads", "infer=1", *factory.WITHOUT_REPORT,
                   *args]
        env = plugins.with_plugins({**factory.local_env(self.workdir), **self.s3.env()})
        # A job's `python` is the node's (no shared software either): this Python's, on PATH.
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        return command, env

    def run(self, *args: str) -> subprocess.CompletedProcess:
        command, env = self.command(*args)
        return patience.run(command, [self.workdir, self.jobs], cwd=self.workdir, env=env)

    def start(self, *args: str) -> patience.Started:
        """The run started, its terminal (stdout and stderr together) read when it ends."""
        command, env = self.command(*args)
        return patience.Started(command, [self.workdir, self.jobs], merged=True, cwd=self.workdir, env=env)

    def job_folders(self) -> list[Path]:
        return sorted(self.jobs.glob("job.*"))


@dataclass
class Finished:
    """A run as the tests read it: exit status, terminal, the KEPT objects then (absent: None), and
    the job folders made so far."""
    returncode: int
    terminal: str
    objects: dict[str, bytes | None]
    job_folders: list[Path] = field(default_factory=list)


class BucketRuns(threading.Thread):
    """The first two runs one after the other, the third beside them; `first()`, `refused()` and
    `listed_parts()` wait for theirs."""

    def __init__(self, s3, models, root: Path, bytes_lm: Path):
        super().__init__(name="bucket runs", daemon=True)
        self.s3, self.frame = s3, factory.input_frame(ROWS)
        # The default token budget (`auto`; 1 thread per shard job below: 1024 tokens), as a user's config
        # has it; token ids made ahead, so that tokenize jobs, which download the tokenizer alone, run too.
        config = factory.workflow_config(INPUT, MODEL, shards=SHARDS, batch={"max_tokens": "auto"},
                                         tokenize={"ahead": True})
        self.bucket = BucketRun(s3, models, root / "clone", root / "jobs", config, PREFIX)
        s3.put(self.bucket.key(INPUT), factory.write_input(self.frame, root / "upload" / "input.parquet").read_bytes())
        self.changed_input = root / "changed" / "input.parquet"
        self.parts = BucketRun(s3, models, root / "parts-clone", root / "parts-jobs", self.parts_config(), PARTS_PREFIX)
        for key, (start, stop) in {**VAL_PARTS, **PASSED_OVER}.items():
            local = factory.write_input(self.frame.iloc[start:stop], root / "upload" / PARTS_PREFIX / key)
            s3.put(self.parts.key(key), local.read_bytes() if stop else b"written by hand")
        self.batch = BucketRun(s3, models, root / "batch-clone", root / "batch-jobs", self.batch_config(), BATCH_PREFIX,
                               model=bytes_lm)
        s3.put(self.batch.key(BATCH_INPUT), self.batch_lines())
        self.results: dict[str, Finished] = {}
        self.error: BaseException | None = None
        self.first_done = threading.Event()

    @staticmethod
    def parts_config() -> dict:
        """Two shards, each one part of the output's folder."""
        config = factory.workflow_config(INPUT, MODEL, shards=PARTS_SHARDS, output={"layout": "parts"})
        del config["input"]
        config["inputs"] = {"val": {"path": "data/val/", "keep_columns": ["id", "gold"]}}
        return config

    @staticmethod
    def batch_config() -> dict:
        """One shard, greedy on the transformers engine, a few tokens per line."""
        return {"input": {"path": BATCH_INPUT, "format": "openai_batch"},
                "model": {"path": MODEL, "task": "generate", "max_length": 48, "max_new_tokens": 8, "dtype": "float32"},
                "generate": {"engine": "transformers"}, "shards": 1}

    @staticmethod
    def batch_lines() -> bytes:
        messages = [[{"role": "user", "content": " ".join(factory.WORDS[k:k + 3])}] for k in range(len(BATCH_IDS))]
        lines = [{"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "gpt-4o-mini", "messages": messages[k], "max_tokens": 4 + k, "temperature": 0}}
                 for k, custom_id in enumerate(BATCH_IDS)]
        return "".join(json.dumps(line) + "\n" for line in lines).encode()

    def run(self) -> None:
        # each its own prefix, clone and job folders: alongside the other two, in threads that read their terminals
        parts = threading.Thread(target=self.run_beside, args=("parts", self.parts, PARTS_KEPT),
                                 name="bucket parts run", daemon=True)
        batch = threading.Thread(target=self.run_beside, args=("batch", self.batch, BATCH_KEPT),
                                 name="bucket batch run", daemon=True)
        parts.start()
        batch.start()
        try:
            self.results["first"] = self.finished(self.bucket, self.bucket.start(), KEPT)
            self.first_done.set()
            self.results["refused"] = self.change_input_while_the_shards_run()
        except BaseException as error:  # re-raised in the test that waits for it
            self.error = error
        finally:
            self.first_done.set()
            parts.join()  # no limit: their runs' own waits fail on a hang
            batch.join()

    def run_beside(self, name: str, bucket: BucketRun, kept: tuple[str, ...]) -> None:
        try:
            self.results[name] = self.finished(bucket, bucket.start(), kept)
        except BaseException as error:
            self.error = error

    def finished(self, bucket: BucketRun, run: patience.Started, kept: tuple[str, ...]) -> Finished:
        done = run.finish("a run against the bucket")
        objects = {path: self.get(bucket, path) for path in kept}
        return Finished(done.returncode, done.stdout, objects, bucket.job_folders())

    def get(self, bucket: BucketRun, path: str) -> bytes | None:
        key = bucket.key(path)
        return self.s3.get(key) if self.s3.exists(key) else None

    def change_input_while_the_shards_run(self) -> Finished:
        """A forced replan; once the plan is written (it has read the input), the input object is
        changed, while the shard jobs run."""
        plan = self.bucket.key("results/plan.json")
        planned = self.s3.modified(plan)
        # one shard now: what is refused is gather's, whatever the count (fewer jobs to wait for)
        self.bucket.set_config({**self.bucket.config(), "shards": 1})
        run = self.bucket.start("--forcerun", "plan")
        patience.until(lambda: self.s3.modified(plan) != planned or run.process.poll() is not None, run.watch,
                       what="the forced plan", every_s=0.1)
        changed = self.frame.copy()
        changed.loc[5, "text"] = changed.loc[5, "text"] + " changed"
        self.s3.put(self.bucket.key(INPUT), factory.write_input(changed, self.changed_input).read_bytes())
        return self.finished(self.bucket, run, KEPT)

    def wait(self, name: str) -> Finished:
        """No limit here: the runs' own waits fail on a hang (tests/patience.py), and end the thread."""
        if name == "first":
            self.first_done.wait()
        else:
            self.join()
        if self.error is not None:
            raise self.error
        return self.results[name]

    def first(self) -> Finished:
        return self.wait("first")

    def refused(self) -> Finished:
        return self.wait("refused")

    def listed_parts(self) -> Finished:
        return self.wait("parts")

    def batch_file(self) -> Finished:
        return self.wait("batch")

    def read_parquet(self, finished: Finished, path: str) -> pd.DataFrame:
        import io

        return pd.read_parquet(io.BytesIO(finished.objects[path]))
