"""The run's paths and each rule's run-dependent inputs and outputs (shardinfer.snakefile.layout), without
Snakemake: one input or named ones, a shared filesystem or a bucket, a task that writes files per
row, tokens made ahead, the report items a run's settings add."""

from types import SimpleNamespace

import pytest

from factory import settings_for
from shardinfer.settings.config import EvaluateSettings, ModelSettings
from shardinfer.snakefile.checks import written_folders
from shardinfer.snakefile.layout import FOLDERS, Layout, fill
from shardinfer.snakefile.rule_params import InputJobs

PREFIX = "s3://bucket/run"


def jobs(shards: int, files: tuple[str, ...], task: str = "classify", **settings) -> InputJobs:
    """What one input's jobs take; only the fields the layout reads are filled in for real."""
    model = ModelSettings(path="model", adapter=None, task=task, max_length=32, dtype="auto",
                          trust_remote_code=False, allow_pickle=False)
    return InputJobs(settings=settings_for(model, shards=shards, **settings), files=list(files), plan_input={},
                     shards=shards, version={}, identity={}, digest=f"digest-{shards}", job_settings={}, evaluate={})


ONE = {None: jobs(3, ("data/in.parquet",))}
NAMED = {"val": jobs(2, ("data/val.csv",)), "test": jobs(4, ("data/test/a.csv", "data/test/b.csv"))}


def test_one_input_keeps_its_paths_and_named_inputs_get_their_name_after_the_first_folder():
    one, named = Layout(ONE), Layout(NAMED)
    assert not one.named and named.named
    assert one.shard_file == "results/shards/{shard}.parquet"
    assert named.shard_file == "results/{name}/shards/{shard}.parquet"
    assert named.path("logs/infer/{shard}.log") == "logs/{name}/infer/{shard}.log"
    assert (one.shard_dir, one.files_root) == ("results/shards", "results/files")
    assert named.gathered == {"predictions": "results/{name}/predictions.parquet",
                              "summary": "results/{name}/summary.json"}
    assert named.every_input(list(named.gathered.values())) == [
        "results/val/predictions.parquet", "results/test/predictions.parquet",
        "results/val/summary.json", "results/test/summary.json"]
    assert one.every_input(["results/summary.json"]) == ["results/summary.json"]


def test_each_jobs_values_are_the_inputs_own():
    one, named = Layout(ONE), Layout(NAMED)
    assert one.input_value("digest") == "digest-3"  # a value, taken once for all jobs
    of_job = named.input_value("digest")  # a function of the job's `{name}`
    assert of_job(SimpleNamespace(name="test")) == "digest-4"
    assert named.shard_files({"name": "val"}) == ["results/val/shards/0.parquet", "results/val/shards/1.parquet"]
    assert len(one.shard_files({})) == 3
    assert named.outdated({"name": "test"}) == ["results/test/predictions.parquet", "results/test/summary.json"]
    assert one.outdated({}) == ["results/predictions.parquet", "results/summary.json"]


def test_on_a_shared_filesystem_the_shards_read_the_staged_copies_and_gather_proves_them():
    layout = Layout(ONE)
    assert layout.shard_reads == {"staged": "results/staged"}
    assert layout.plan_outputs == {"staged": "results/staged"} and "staged" in FOLDERS
    assert layout.gather_reads == {"staged": "results/staged"}
    assert layout.gather_part_names == []
    assert layout.stored_at("results/summary.json") == "results/summary.json"


def test_without_a_shared_filesystem_each_shard_reads_its_cut_and_gather_the_downloaded_parts():
    layout = Layout(NAMED, storage=True, storage_prefix=PREFIX)
    assert layout.shard_reads == {"cut": "results/{name}/cuts/{shard}.parquet"}
    # one shard count for every input in a bucket (checks.check_storage_inputs): the first input's
    assert layout.plan_outputs == {"cuts": ["results/{name}/cuts/0.parquet", "results/{name}/cuts/1.parquet"]}
    parts = layout.gather_reads["parts"]
    assert parts(SimpleNamespace(name="test")) == ["data/test/a.csv", "data/test/b.csv"]
    assert layout.gather_part_names(SimpleNamespace(name="val")) == ["data/val.csv"]
    stored = layout.stored_at("results/val/summary.json")
    assert stored == f"{PREFIX}/results/val/summary.json" and layout.unstored(stored) == "results/val/summary.json"


def test_a_task_that_writes_files_per_row_gets_a_folder_per_shard_and_gather_checks_them():
    custom = Layout.of({None: jobs(2, ("in.parquet",), task="custom")}, False, "", None)
    assert custom.files_output == {"files": "results/files/{shard}"} and "files" in FOLDERS
    assert custom.files_folders({}) == ["results/files/0", "results/files/1"]
    classify = Layout.of(ONE, False, "", None)
    assert classify.files_output == {} and classify.files_folders({}) == []


def test_token_files_are_an_input_of_the_shard_jobs_only_when_tokenizing_ahead():
    assert Layout(ONE, tokenizer_key="0123abcd").tokens_input == {"tokens": "results/tokens/0123abcd/{shard}.parquet"}
    assert Layout(ONE).tokens_input == {}


@pytest.mark.parametrize("task, evaluate, made", [
    ("classify", None, ["token_lengths"]),
    ("classify", "gold", ["metrics", "confusion", "token_lengths"]),
    ("generate", "reference", ["metrics", "token_lengths"]),
    ("custom", None, []),
])
def test_the_report_items_a_runs_settings_add(task, evaluate, made):
    inputs = {"val": jobs(1, ("val.csv",), task=task, evaluate=EvaluateSettings(evaluate))}
    layout = Layout.of(inputs, False, "", None)
    assert [item.name for item in layout.report_items] == made
    for item in layout.report_items:
        assert item.path.startswith("results/{name}/report/") and item.caption == f"../report/{item.name}.rst"
    assert layout.report_labels("per shard") == {"input": "{name}", "item": "per shard"}


def test_fill_leaves_the_wildcards_it_is_not_given():
    assert fill("results/{name}/cuts/{shard}.parquet", shard=3) == "results/{name}/cuts/3.parquet"
    assert fill("results/cuts/{shard}.parquet", shard=3, name=None) == "results/cuts/3.parquet"


def test_the_folders_checked_are_those_the_rules_write_into_top_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "val" / "staged").mkdir(parents=True)  # a folder output, there from an earlier run
    patterns = ["results/{name}/shards/{shard}.parquet", "logs/{name}/infer/{shard}.log", "results/{name}/staged",
                "results/tokens/k1/{shard}.parquet", "/elsewhere/{shard}.txt", "results/{name}/plan.json"]
    assert written_folders(patterns, ["val", "test"]) == [
        "logs", "results", "logs/test", "logs/val", "results/test", "results/tokens", "results/val",
        "logs/test/infer", "logs/val/infer", "results/test/shards", "results/tokens/k1", "results/val/shards",
        "results/val/staged"]


def test_the_parts_layout_is_a_folder_whose_manifest_gather_writes_and_a_rerun_withdraws_whole(tmp_path):
    from shardinfer.core.jobs import withdraw

    one, named = Layout(ONE, parts=True), Layout(NAMED, parts=True)
    assert one.table == "results/predictions/" and named.table == "results/{name}/predictions/"
    assert one.gathered == {"manifest": "results/predictions/.manifest.json", "summary": "results/summary.json"}
    assert one.shard_file == "results/shards/{shard}.parquet" and one.infer_params == {} and one.gather_params == {}
    assert named.outdated({"name": "val"}) == ["results/val/predictions/", "results/val/predictions/.manifest.json",
                                              "results/val/summary.json"]
    folder = tmp_path / "results" / "predictions"
    folder.mkdir(parents=True)
    (folder / "part-00000-of-00001.parquet").write_bytes(b"old")
    withdraw([str(folder), str(folder / ".manifest.json")])  # a folder goes whole, a path already gone is passed
    assert not folder.exists()


def test_without_a_shared_filesystem_each_shard_job_writes_its_part_and_record_and_gather_takes_the_records():
    layout = Layout(NAMED, storage=True, storage_prefix=PREFIX, parts=True)
    # every input in a bucket has the first one's shard count (2): the parts' numbers have its digits
    assert layout.shard_file == "results/{name}/predictions/part-{shard}-of-00002.parquet"
    assert layout.shard_outputs == {"shard": layout.shard_file, "record": "results/{name}/shards/.{shard}.record.json"}
    assert layout.infer_params == {"one_part": True}
    wildcards = SimpleNamespace(name="val", get=lambda key, default=None: "val")
    assert layout.gather_shards["records"](wildcards) == ["results/val/shards/.00000.record.json",
                                                          "results/val/shards/.00001.record.json"]
    assert layout.gather_params["stored_parts"](wildcards) == ["results/val/predictions/part-00000-of-00002.parquet",
                                                               "results/val/predictions/part-00001-of-00002.parquet"]
    assert layout.plan_outputs == {"cuts": ["results/{name}/cuts/00000.parquet", "results/{name}/cuts/00001.parquet"]}
    assert "copies" not in layout.gather_shards and "copies" in Layout(ONE, storage=True, parts=True,
                                                                       scored=True).gather_shards
    assert layout.outdated({"name": "val"}) == ["results/val/predictions/.manifest.json", "results/val/summary.json"]
