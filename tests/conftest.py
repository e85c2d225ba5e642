"""Shared fixtures: tiny models built locally from configs, and finished workflow runs that several
test modules read (each end-to-end run costs seconds of Snakemake and torch start-up, so a run that
only needs reading is made once per session)."""

import compileall
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "tests"))

import factory  # noqa: E402
import s3_server  # noqa: E402

# The workflow's package byte-compiled once: where PYTHONDONTWRITEBYTECODE is set (as on CI's machine),
# each of the suite's hundreds of Snakemake processes and jobs would compile it again (~0.3 s each).
compileall.compile_dir(REPO / "workflow" / "shardinfer", quiet=1)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> factory.TinyModels:
    return factory.build_tiny_models(tmp_path_factory.mktemp("models"))


@dataclass(frozen=True)
class FinishedRun:
    workdir: Path
    frame: pd.DataFrame  # the input
    predictions: pd.DataFrame
    terminal: str  # what the user saw: stdout and stderr


# The (rows, shards) the suite's modules ask `classify_runs` for: the first request makes them all.
SHARED_CLASSIFY_RUNS = ((1000, 1), (1000, 4), (2, 4))


@pytest.fixture(scope="session")
def classify_runs(models, tmp_path_factory):
    """`classify_runs(rows, shards)`: one finished classify run per (rows, shards), each in its own
    working directory, made on first use (all of SHARED_CLASSIFY_RUNS at once) and shared by every
    test that only reads it."""
    cache: dict[tuple[int, int], FinishedRun] = {}

    def make(wanted: list[tuple[int, int]]) -> None:
        """The runs at once (`factory.run_workflows`): the cores one run leaves idle, the others use."""
        runs = []
        for rows, shards in wanted:
            workdir = tmp_path_factory.mktemp(f"classify-{rows}-{shards}")
            frame = factory.input_frame(rows)
            path = factory.write_input(frame, workdir / "data" / "input.parquet")
            runs.append((workdir, frame, factory.workflow_config(path, models.classifier, shards=shards)))
        results = factory.run_workflows_ok([(workdir, config) for workdir, _, config in runs], report=True)
        for key, (workdir, frame, _), result in zip(wanted, runs, results):
            cache[key] = FinishedRun(workdir, frame, factory.read_predictions(workdir), result.stdout + result.stderr)

    def finished(rows: int, shards: int) -> FinishedRun:
        if (rows, shards) not in cache:
            make([(rows, shards), *(key for key in SHARED_CLASSIFY_RUNS if key not in cache and key != (rows, shards))])
        return cache[rows, shards]

    return finished


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> s3_server.S3Server:
    """A real S3-compatible server on localhost (tests/storage/start-s3), started on first use and
    stopped when the session ends. Without it the tests that need it are skipped, unless CI=true:
    then they fail, so CI cannot skip them silently."""
    try:
        server = s3_server.start(tmp_path_factory.mktemp("s3"))
    except (RuntimeError, OSError) as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the S3 server did not start: {error}")
        pytest.skip(f"the S3 server did not start: {error}")
    yield server
    s3_server.stop(server)


@pytest.fixture(scope="session")
def bucket_runs(s3, models, tmp_path_factory):
    """tests/test_storage.py's two runs against the bucket, started in the background on first use
    (tests/bucket_runs.py); tests/test_slurm.py asks for them so that they overlap with its runs."""
    import bucket_runs as runs

    started = runs.BucketRuns(s3, models, tmp_path_factory.mktemp("bucket-runs"))
    started.start()
    yield started
    started.join(timeout=4 * runs.RUN_TIMEOUT_S)
