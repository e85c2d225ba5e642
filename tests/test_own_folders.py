"""The workflow's own folders (results/, logs/, .snakemake/ in the working directory, or under the
storage prefix in a bucket) are never input: a folder or glob that reaches them passes over them,
saying so in one line, and a path inside one is refused (`shardinfer.input.discovery`)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from factory import input_frame, run_workflow, workflow_config, write_input
from shardinfer.core.errors import UserError
from shardinfer.input.discovery import own_outputs_passed_over, resolve_input


@pytest.mark.e2e
def test_a_folder_or_glob_that_reaches_the_workflows_own_files_passes_over_them(models, tmp_path):
    """`input.path: .` and `**/*.parquet`, from the working directory (named inputs, one run): they
    reach results/ and logs/, which fill with shards and logs as the run goes. Those are never
    parts: the run finishes, and the same command again has nothing to do (no shard refused as "not
    a part of the plan", no cycle in the graph), saying in one line what was passed over."""
    frame = input_frame(20, seed=4)
    write_input(frame, tmp_path / "data" / "input.parquet")
    config = workflow_config("unused", models.classifier)
    del config["input"]
    config["inputs"] = {"glob": {"path": "**/*.parquet", "keep_columns": ["id"]},
                        "folder": {"path": ".", "keep_columns": ["id"]}}
    first = run_workflow(tmp_path, config)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    for name in config["inputs"]:
        got = pd.read_parquet(tmp_path / "results" / name / "predictions.parquet")
        assert got["index"].tolist() == list(range(20)) and got["id"].tolist() == frame["id"].tolist()
        plan = json.loads((tmp_path / "results" / name / "plan.json").read_text())
        found = {"glob": "data/input.parquet", "folder": "./data/input.parquet"}[name]
        assert [part["path"] for part in plan["input"]["parts"]] == [found]
    again = run_workflow(tmp_path, config)
    shown = again.stdout + again.stderr
    assert again.returncode == 0 and "Nothing to be done" in shown, shown[-3000:]
    # the two tables and two shard files; for `.` the logs' benchmark tables (.tsv) too
    assert ("shardinfer: input.path `**/*.parquet` also matches 4 file(s) in the workflow's own folders (first: "
            "results/folder/predictions.parquet), passed over: nothing in results/, logs/, .snakemake/ is "
            "input") in shown
    assert re.search(r"^shardinfer: input.path `.` also matches \d+ file\(s\) in the workflow's own folders \(first: "
                     r"./logs/folder/gather.benchmark.tsv\)", shown, re.M), shown[-3000:]


@pytest.mark.parametrize("path", ["results/input.parquet", "results/*.parquet", "logs", "./results//old/"])
def test_an_input_inside_the_workflows_own_folders_is_refused(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    write_input(input_frame(3), tmp_path / "results" / "old" / "input.parquet")
    (tmp_path / "logs").mkdir()
    with pytest.raises(UserError, match=r"input.path `.*` lies in `(results|logs)/`, where the workflow writes its "
                                        r"own files \(results/, logs/, .snakemake/\); move the input out of it"):
        resolve_input(path)
    with pytest.raises(UserError, match=r"lies in `results/`"):
        resolve_input(path.replace("logs", "results"), listed=["results/old/input.parquet"])


def test_the_workflows_own_files_are_never_parts_on_disk_or_in_a_bucket(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = ["data/a.parquet", "results/shards/0.parquet", "results/val/predictions.parquet", "logs/plan.benchmark.tsv",
             ".snakemake/x.parquet", "sub/results/b.parquet"]  # a results/ below the working directory is no own folder
    for name in names:
        write_input(input_frame(2), tmp_path / name) if name.endswith(".parquet") else None
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "plan.benchmark.tsv").write_text("s\n1\n")
    own = ("results/shards/0.parquet", "results/val/predictions.parquet")
    for listed in (None, names):
        assert resolve_input("**/*.parquet", listed=listed)[1] == ("data/a.parquet", "sub/results/b.parquet")
        assert own_outputs_passed_over("**/*.parquet", listed) == own
        assert own_outputs_passed_over("data/*.parquet", listed) == ()
    assert resolve_input(".")[1] == ("./data/a.parquet", "./sub/results/b.parquet")  # logs/'s .tsv passed over too
    assert own_outputs_passed_over(".") == tuple(f"./{name}" for name in ("logs/plan.benchmark.tsv", *own))
