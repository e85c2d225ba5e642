"""Shared fixtures: tiny models built locally from configs, and finished workflow runs that several
test modules read (each end-to-end run costs seconds of Snakemake and torch start-up, so a run that
only needs reading is made once per test run, whichever pytest-xdist worker asks first).

The suite runs on pytest-xdist's workers (the README's test command: `-n auto`):
one core is idle for much of any single end-to-end run, and the other worker's tests fill it. Each
module stays on one worker (its module fixtures are made once), the modules whose marks name the
same server or folder share a worker, those groups start first (they wait on their servers while
the other worker computes), then the groups with the most end-to-end tests (tests/scheduling.py
derives all of it from the marks)."""

import fcntl
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

import factory
import s3_server
import scheduling
import tiny_models

# Bytecode cached where PYTHONDONTWRITEBYTECODE is set too (as on CI's machine), in this process and
# every one it starts: the venv is installed without it (tests/install), and otherwise each of the
# suite's hundreds of Snakemake processes and jobs compiles everything it imports again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def worker_group(config: pytest.Config, nodeid: str) -> str:
    """The test's worker group (tests/scheduling.py), from the marks pyproject.toml registers."""
    return scheduling.group_of(nodeid, config.rootpath, scheduling.shared_marks(config.getini("markers")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The groups of shared marks (servers) first, then those with the most `e2e` tests; the rest as
    collected (tests/scheduling.py says why)."""
    groups = [worker_group(config, item.nodeid) for item in items]
    e2e = [item.get_closest_marker("e2e") is not None for item in items]
    order = scheduling.run_order(groups, e2e, scheduling.shared_marks(config.getini("markers")))
    items[:] = [items[k] for k in order]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown without it (`-p no:xdist`)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's scheduler by scope, with worker_group as the scope, in the order collected,
    for its load-balancing modes (`-n` alone means `--dist load`); any other `--dist` is xdist's own.
    (Its `--dist loadgroup` with marks groups nothing on pytest 9.2: pytest-xdist#1386.)"""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkerGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(config, nodeid)

    config.option.loadscopereorder = False
    return ByWorkerGroup(config, log)


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name`, made by `make` once per test run: under pytest-xdist, in the folder all
    workers share, by the first worker that asks (the others wait on its lock, then read it)."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # pytest-of-<user>/pytest-<n>, above each worker's own popen-gw<k>
    folder, failed = root / name, root / f"{name}.failed"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():  # not again: another worker's attempt failed, and says why in its tests
            raise RuntimeError(f"{name} could not be made: {failed.read_text()}")
        if not (root / f"{name}.made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except BaseException as error:
                failed.write_text(repr(error)[:2000])
                raise
            (root / f"{name}.made").touch()
    return folder


@pytest.fixture(scope="session", autouse=True)
def torch_on_one_thread() -> None:
    """The tests' own torch work (reference outputs, tiny models) on one thread, as the shard jobs of
    the tests' runs work (`--set-threads infer=1`). torch's default, a thread per core, spins for
    the cores that the other worker's runs hold: 1,000 classify references took 7.4 s of CPU
    instead of 1.4 s on a busy machine (4.8 s instead of 2.1 s on an idle one)."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> factory.TinyModels:
    return factory.tiny_model_paths(made_once(tmp_path_factory, "models", factory.build_tiny_models))


@pytest.fixture(scope="session")
def causal_lm(tmp_path_factory) -> Callable[[int], Path]:
    """`causal_lm(intermediate_size=37)`: tiny_models.build_tiny_causal_lm's Llama of that size (38 for
    tensor parallel 2), built once per test run and read by every module that asks (the same seed
    gave each module the same model when each built its own)."""
    def built(intermediate_size: int = 37) -> Path:
        folder = made_once(tmp_path_factory, f"causal-lm-{intermediate_size}",
                           lambda root: tiny_models.build_tiny_causal_lm(root, intermediate_size))
        return tiny_models.causal_lm_path(folder, intermediate_size)

    return built


@pytest.fixture(scope="session")
def seq2seq_lm(tmp_path_factory) -> Path:
    """tiny_models.build_tiny_seq2seq's T5, built once per test run."""
    return made_once(tmp_path_factory, "seq2seq-lm", tiny_models.build_tiny_seq2seq) / "tiny-t5"


@pytest.fixture(scope="session")
def parts_lm(tmp_path_factory) -> Path:
    """The tiny byte-level Llama whose chat template loops over content parts (SmolVLM's shape,
    tiny_models.PARTS_CHAT_TEMPLATE), built once per test run."""
    lm = made_once(tmp_path_factory, "bytes-lm", tiny_models.build_tiny_bytes_lm) / "tiny-bytes-lm"
    folder = made_once(tmp_path_factory, "parts-lm", lambda root: tiny_models.with_chat_template(
        lm, root / "tiny-parts-lm", tiny_models.PARTS_CHAT_TEMPLATE))
    return folder / "tiny-parts-lm"


@pytest.fixture(scope="session")
def pooling_models(tmp_path_factory) -> dict[str, Path]:
    """tiny_models.build_tiny_pooling_models' BERTs with heads vLLM's CPU build runs (encoder and its
    LoRA, classifier, cross-encoder, tagger), built once per test run, by name."""
    return tiny_models.pooling_model_paths(made_once(tmp_path_factory, "pooling-models",
                                                     tiny_models.build_tiny_pooling_models))


@dataclass(frozen=True)
class FinishedRun:
    workdir: Path
    frame: pd.DataFrame  # the input
    predictions: pd.DataFrame
    terminal: str  # what the user saw: stdout and stderr


# The (rows, shards) the suite's modules ask `classify_runs` for: the first request makes them all.
SHARED_CLASSIFY_RUNS = ((1000, 1), (1000, 4), (2, 3))
# The one whose report items tests read (tests/test_report.py and test_metrics.py, in copies); the
# others stop at the proven table, as most runs do (factory.WITHOUT_REPORT: the report job proves nothing).
REPORTED_CLASSIFY_RUN = (1000, 4)


@pytest.fixture(scope="session")
def classify_runs(models, tmp_path_factory):
    """`classify_runs(rows, shards)`: one finished classify run per (rows, shards) of
    SHARED_CLASSIFY_RUNS, each in its own working directory, all made at once on first use and
    shared by every test that only reads it (a test that runs Snakemake again copies it first)."""
    cache: dict[tuple[int, int], FinishedRun] = {}

    def make(folder: Path) -> None:
        """The runs at once (`factory.run_workflows`): the cores one run leaves idle, the others use."""
        runs = []
        for rows, shards in SHARED_CLASSIFY_RUNS:
            data = folder / f"{rows}-{shards}" / "data" / "input.parquet"
            path = factory.write_input(factory.input_frame(rows), data)
            without = () if (rows, shards) == REPORTED_CLASSIFY_RUN else factory.WITHOUT_REPORT
            runs.append((folder / f"{rows}-{shards}", factory.workflow_config(path, models.classifier, shards=shards),
                         *without))
        for (workdir, *_), result in zip(runs, factory.run_workflows_ok(runs, report=True)):
            (folder / f"{workdir.name}.terminal").write_text(result.stdout + result.stderr)

    def finished(rows: int, shards: int) -> FinishedRun:
        if (rows, shards) not in cache:
            assert (rows, shards) in SHARED_CLASSIFY_RUNS, f"add {(rows, shards)} to SHARED_CLASSIFY_RUNS"
            folder = made_once(tmp_path_factory, "classify-runs", make)
            workdir = folder / f"{rows}-{shards}"
            cache[rows, shards] = FinishedRun(workdir, factory.input_frame(rows), factory.read_predictions(workdir),
                                              (folder / f"{workdir.name}.terminal").read_text())
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
    """tests/test_storage.py's runs against the bucket, started in the background on first use
    (tests/bucket_runs.py); tests/test_slurm.py asks for them so that they overlap with its runs."""
    import bucket_runs as runs

    bytes_lm = made_once(tmp_path_factory, "bytes-lm", tiny_models.build_tiny_bytes_lm) / "tiny-bytes-lm"
    started = runs.BucketRuns(s3, models, tmp_path_factory.mktemp("bucket-runs"), bytes_lm)
    started.start()
    yield started
    started.join()  # no limit: the runs' own waits fail on a hang (tests/patience.py)
