"""Inputs, settings and workflow runs for the tests. Nothing is downloaded.

The classifier, the encoder and their LoRA adapters, the texts and inputs and a run of the workflow
are scripts/tiny_workflow.py's, which scripts/benchmarks/load_check.py uses too: this module hands
them on, beside the tests' own (several runs at once, inputs of other shapes, a clone of the workflow).
The tests' other tiny models (causal LMs, a cross-encoder) are built by tests/tiny_models.py.
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pandas as pd

import patience
from tiny_workflow import (
    LABELS as LABELS,
)
from tiny_workflow import (
    MAX_POSITIONS as MAX_POSITIONS,
)
from tiny_workflow import (  # what the load check shares, handed on to the tests as this module's
    REPO as REPO,
)
from tiny_workflow import (
    WITHOUT_REPORT as WITHOUT_REPORT,
)
from tiny_workflow import (
    WORDS as WORDS,
)
from tiny_workflow import (
    TinyModels as TinyModels,
)
from tiny_workflow import (
    bert_config as bert_config,
)
from tiny_workflow import (
    build_tiny_models as build_tiny_models,
)
from tiny_workflow import (
    bytes_read as bytes_read,
)
from tiny_workflow import (
    input_frame as input_frame,
)
from tiny_workflow import (
    input_settings as input_settings,
)
from tiny_workflow import (
    local_env as local_env,
)
from tiny_workflow import (
    prepare_workdir as prepare_workdir,
)
from tiny_workflow import (
    read_predictions as read_predictions,
)
from tiny_workflow import (
    save_lora as save_lora,
)
from tiny_workflow import (
    save_tokenizer as save_tokenizer,
)
from tiny_workflow import (
    texts as texts,
)
from tiny_workflow import (
    tiny_model_paths as tiny_model_paths,
)
from tiny_workflow import (
    workflow_config as workflow_config,
)
from tiny_workflow import (
    write_input as write_input,
)


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a Python process a test starts: the folders pytest puts on the tests' own
    path (pyproject.toml's `pythonpath`: the package, the tests' and the scripts' helpers) on its
    PYTHONPATH, so that it imports this clone's code, whatever the venv has installed."""
    folders = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["pythonpath"]
    given = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    paths = [str(REPO / folder) for folder in folders] + given
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def write_empty_input(path: Path) -> Path:
    """An input with input_frame's columns and no rows (a day's empty split), typed as it would be
    with rows (pandas types an empty column of strings as double in Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        types = {"id": pa.string(), "gold": pa.int64(), "text": pa.string()}
        pq.write_table(pa.table({name: pa.array([], kind) for name, kind in types.items()}), path)
        return path
    return write_input(input_frame(0), path)


def gzipped(frame: pd.DataFrame, path: Path) -> Path:
    """The frame as `path`, a `.csv.gz` or `.jsonl.gz` file."""
    import gzip

    plain = write_input(frame, path.with_suffix(""))
    path.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return path


def run_workflow(workdir: Path, config: dict, *args: str, report: bool = False) -> subprocess.CompletedProcess:
    """tiny_workflow's run (`snakemake -s <repo>/Snakefile` in `workdir`, as a user runs it from their
    own folder), waited for while it progresses (tests/patience.py: a busy machine is no hang)."""
    command, env = prepare_workdir(workdir, config, *args, report=report)
    return patience.run(command, [workdir], cwd=workdir, env=env)


def run_workflows(runs: list[tuple], report: bool = False) -> list[subprocess.CompletedProcess]:
    """Several independent `run_workflow` runs at once, each `(workdir, config, *extra arguments)`:
    a run of one shard keeps one core busy (its jobs run one after another, each mostly
    single-threaded), so two or more together fill the machine's cores instead of leaving them
    idle. Each keeps its own folder and GPU lock folder."""
    started = []
    for workdir, config, *args in runs:
        command, env = prepare_workdir(workdir, config, *args, report=report)
        started.append((workdir, patience.Started(command, [workdir], cwd=workdir, env=env)))
    return [run.finish(f"the run in {workdir}") for workdir, run in started]


def run_workflows_ok(runs: list[tuple], report: bool = False) -> list[subprocess.CompletedProcess]:
    """`run_workflows`, each run having succeeded (its terminal's end shown where one did not)."""
    results = run_workflows(runs, report=report)
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return results


def flip_a_data_page_byte(path: Path | str, column: str) -> None:
    """Flip one bit in the last byte of `column`'s chunk in the first row group: a page's header comes
    before its data, so that byte is page data (the last page's), never a header or the footer."""
    import pyarrow.parquet as pq

    group = pq.ParquetFile(path).metadata.row_group(0)
    chunks = (group.column(i) for i in range(group.num_columns))
    chunk = next(chunk for chunk in chunks if chunk.path_in_schema.split(".")[0] == column)
    first = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = bytearray(Path(path).read_bytes())
    data[first + chunk.total_compressed_size - 1] ^= 0x01
    Path(path).write_bytes(bytes(data))


def settings_for(model, inp=None, batch=None, shards: int = 1, **extra):
    """Settings around a ModelSettings, for loading a task directly (the input is never read)."""
    from shardinfer.settings.config import BatchSettings, InputSettings, Settings

    inp = inp or InputSettings(path="unused.parquet", format="parquet", text_column="text", keep_columns=(),
                               null_text="error")
    return Settings(input=inp, model=model, batch=batch or BatchSettings(256, 16, 128), shards=shards, **extra)


def workflow_clone(folder: Path) -> Path:
    """The workflow's sources in `folder`, as a git repository of their own: a user's clone, from
    which Snakemake packs the files git tracks for jobs that share no filesystem (--job-deploy-sources)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "scripts", "envs", "config", "profiles"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, folder / name)
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    subprocess.run(["git", "add", "-A"], cwd=folder, check=True)
    return folder


def gather_job(plan_path, shard_paths, inp, model: dict, digest: str, table, summary, output=None, **fields):
    """A GatherJob as the gather rule builds it (workflow/scripts/gather.py): the table at `table` (a
    file; of output.layout parts, the folder), the other writers' files beside the summary."""
    from shardinfer.output import chosen_writers, writer_files
    from shardinfer.proof.gather import GatherJob
    from shardinfer.proof.manifest import MANIFEST_NAME
    from shardinfer.settings.config import OutputSettings

    output = output or OutputSettings()
    files = writer_files(chosen_writers(output, inp), output.parts, str(Path(summary).parent))
    key = "manifest" if output.parts else "predictions"
    if key in files:
        files[key] = str(Path(table) / MANIFEST_NAME) if output.parts else str(table)
    fields = {name: tuple(value) if isinstance(value, list) else value for name, value in fields.items()}
    return GatherJob(str(plan_path), tuple(map(str, shard_paths)), inp, model, digest,
                     {**files, "summary": str(summary)}, output, **fields)


def one_line_refusal(call) -> str:
    """The UserError that `call()` raises, which must be one line (what the user's terminal shows)."""
    import pytest

    from shardinfer.core.errors import UserError

    with pytest.raises(UserError) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)
