"""Without a shared filesystem: the input only in a bucket of a real S3-compatible server, every job
in an empty folder of its own, and the table in the bucket equal to a shared-filesystem run's; also
a named input whose parts are found by listing a folder in the bucket, and an OpenAI batch file
whose output file gather writes there.

The server is SeaweedFS on localhost (tests/storage/start-s3, the `s3` fixture). The runs
(tests/bucket_runs.py, made in the background: the `bucket_runs` fixture) use the shipped
profiles/s3 with the cluster-generic executor, whose submit command
(tests/storage/submit-in-empty-folder) starts each job in a fresh empty folder, the way Snakemake's
own tests run remote jobs and a Kubernetes pod starts: the job gets the workflow's sources from the
bucket (--job-deploy-sources) and downloads its declared inputs; nothing else reaches it. The
model too: model.path is a folder in the clone, named by a relative path that names nothing in a
job's folder, and the jobs load their downloaded copies of it (rule stage_model).

The Kubernetes profile is checked against the executor plugin's own pod spec (no cluster runs here),
and tests/test_slurm.py runs profiles/slurm with profiles/s3's keys on the real Slurm.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

import factory
import patience
import plugins
from bucket_runs import BATCH_IDS, INPUT, MODEL, PARTS_FOLDER, PARTS_KEPT, PARTS_SHARDS, ROWS, SHARDS, VAL_PARTS
from s3_server import free_port
from shardinfer.core.errors import ProofError
from test_workflow import assert_same_rows

pytestmark = pytest.mark.s3  # the S3 server and the runs in its bucket, which test_slurm reads too


@pytest.mark.e2e
def test_the_table_in_the_bucket_equals_a_shared_filesystem_run_row_for_row(bucket_runs, s3, classify_runs):
    first = bucket_runs.first()
    assert first.returncode == 0, first.terminal[-6000:]
    got = bucket_runs.read_parquet(first, "results/predictions.parquet")
    want = classify_runs(ROWS, 1).predictions
    assert_same_rows(got, want, float_columns={"probs"})
    assert got.dtypes.to_dict() == want.dtypes.to_dict()
    summary = json.loads(first.objects["results/summary.json"])
    assert (summary["rows"], summary["shards"]) == (ROWS, SHARDS)
    # `batch.max_tokens: auto`, resolved by the shard job for its device: CPU, 1 thread, a one-pass task
    log = first.objects["logs/infer/0.log"].decode()
    assert "running on cpu (1 threads)" in log
    assert "batches of at most 1024 padded tokens (batch.max_tokens: auto)" in log
    # the model from the job's downloaded copies of the staged model (model.path names nothing there)
    assert re.search(r"loaded \S*/results/model/[0-9a-f]{16}/model \(task classify, engine transformers\)", log), log
    # the terminal names the table where it is
    table = s3.url(bucket_runs.bucket.key("results/predictions.parquet"))
    assert f"shardinfer: {ROWS:,} rows written to {table}" in first.terminal, first.terminal[-3000:]


@pytest.mark.e2e
def test_an_openai_batch_file_in_the_bucket_gets_its_output_file_there_in_its_order(bucket_runs):
    """The plan's cut of a batch file, the shard job in an empty folder and gather's batch output and
    error files, all through the bucket: one line per input line, in the input's order, each body a
    `ChatCompletion` within its line's max_tokens."""
    from openai.types.chat import ChatCompletion

    batch = bucket_runs.batch_file()
    assert batch.returncode == 0, batch.terminal[-6000:]
    lines = [json.loads(line) for line in batch.objects["results/batch_output.jsonl"].decode().splitlines()]
    assert [line["custom_id"] for line in lines] == list(BATCH_IDS)
    for k, line in enumerate(lines):
        assert line["error"] is None
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert 1 <= body.usage.completion_tokens <= 4 + k and body.model == "gpt-4o-mini"
    assert batch.objects["results/batch_errors.jsonl"] == b""  # OpenAI's error file, beside it: none failed
    assert json.loads(batch.objects["results/summary.json"])["rows"] == len(BATCH_IDS)
    assert len(batch.job_folders) >= 3  # plan, the shard, gather: each in a folder of its own


@pytest.mark.e2e
def test_every_job_ran_in_an_empty_folder_of_its_own_and_nothing_was_written_beside_the_clone(bucket_runs):
    folders = bucket_runs.first().job_folders
    assert len(folders) == 1 + 2 * SHARDS + 1, folders  # plan, a tokenize and an infer job per shard, gather
    for folder in folders:
        log = (folder / "job.log").read_text()
        assert (folder / "exit-status").read_text().strip() == "0", log[-3000:]
        # its sources came from the bucket's source archive, unpacked in its own folder
        assert (folder / "Snakefile").is_file() and (folder / "workflow" / "shardinfer").is_dir()
    # the input and the results are in the bucket only
    assert not (bucket_runs.bucket.workdir / "data").exists()
    assert not (bucket_runs.bucket.workdir / "results").exists()


def job_inputs(terminal: str, rule: str = "infer") -> dict[int, list[str]]:
    """Each shard's job of `rule`: its declared inputs, as Snakemake printed them when it submitted the job."""
    found = {}
    for block in terminal.split(f"rule {rule}:")[1:]:
        inputs = re.search(r"input: (.*)", block).group(1)
        shard = int(re.search(r"wildcards: shard=(\d+)", block).group(1))
        found[shard] = sorted(re.findall(r"s3://\S+", inputs))
    return found


@pytest.mark.e2e
def test_each_shard_job_downloads_the_plan_its_own_cut_and_the_model_only(bucket_runs, s3):
    first, key = bucket_runs.first(), bucket_runs.bucket.key
    staged = re.search(r"results/model/([0-9a-f]{16})/", first.terminal).group(1)
    tokens = re.search(r"results/tokens/([0-9a-f]{16})/", first.terminal).group(1)
    model = {path.name: s3.url(key(f"results/model/{staged}/model/{path.name}"))
             for path in (bucket_runs.bucket.workdir / MODEL).iterdir()}
    assert "model.safetensors" in model
    shard_reads = {shard: [s3.url(key("results/plan.json")), s3.url(key(f"results/cuts/{shard}.parquet"))]
                   for shard in range(SHARDS)}
    assert job_inputs(first.terminal) == {
        shard: sorted([*reads, s3.url(key(f"results/tokens/{tokens}/{shard}.parquet")), *model.values()])
        for shard, reads in shard_reads.items()}
    # a tokenize job downloads the tokenizer's files and the model's config, not its weights
    tokenizer = [model[name] for name in ("config.json", "tokenizer.json", "tokenizer_config.json")]
    assert job_inputs(first.terminal, "tokenize") == {
        shard: sorted([*reads, *tokenizer]) for shard, reads in shard_reads.items()}
    # the model's files were staged once, by the main process, and are in the bucket as they are in model.path
    assert first.terminal.count("rule stage_model:") == 1
    for path in (bucket_runs.bucket.workdir / MODEL).iterdir():
        assert s3.get(key(f"results/model/{staged}/model/{path.name}")) == path.read_bytes()
    plan = json.loads(first.objects["results/plan.json"])
    cut_bytes = [shard["cut"]["size"] for shard in plan["shards"]]
    input_bytes = plan["input"]["parts"][0]["size"]
    # all shard jobs together download at most 1.2 times the input (issue 19's goal)
    assert sum(cut_bytes) <= 1.2 * input_bytes, (cut_bytes, input_bytes)
    # and each cut in the bucket holds exactly its shard's rows, the bytes the plan recorded
    for shard, entry in enumerate(plan["shards"]):
        data = first.objects[f"results/cuts/{shard}.parquet"]
        assert len(data) == entry["cut"]["size"]
        assert pq.read_table(io.BytesIO(data)).num_rows == entry["rows"] == entry["cut"]["rows"]
    assert plan["input"]["parts"][0]["path"] == INPUT  # the object as configured, not a job's local copy


@pytest.mark.e2e
def test_a_part_changed_in_the_bucket_after_planning_is_refused_at_gather_and_no_old_table_is_left(bucket_runs, s3):
    """A forced replan first removes the table it outdates from the bucket (the jobs, which see no
    bucket, cannot); the input object is then changed while the shards run (after the plan read it),
    and gather refuses it by its content digest: no table, and the failed job's log on the terminal."""
    refused, key = bucket_runs.refused(), bucket_runs.bucket.key
    terminal = refused.terminal
    assert refused.returncode != 0, terminal[-4000:]
    assert f"shardinfer: removed {s3.url(key('results/predictions.parquet'))}, outdated by this run" in terminal
    # the failed job's log, fetched from the bucket, is on the terminal with its one-line error
    assert f"Log of the failed job, {s3.url(key('logs/gather.log'))}:" in terminal, terminal[-4000:]
    assert f"ERROR input `{INPUT}` changed since planning: other content" in terminal, terminal[-4000:]
    assert refused.objects["results/predictions.parquet"] is None
    assert refused.objects["results/summary.json"] is None


@pytest.mark.e2e
def test_a_folder_in_the_bucket_is_its_listed_parts_and_a_named_input_equals_a_shared_filesystem_run(
        bucket_runs, s3, classify_runs):
    """A named input whose parts the bucket's listing finds, as a filesystem's would: a folder of
    Parquet parts, with markers, a README, a `_temporary` part and a file beside the folder passed
    over. Its table, a folder of parts in the bucket, equals the shared-filesystem run's, row for row."""
    listed, key = bucket_runs.listed_parts(), bucket_runs.parts.key
    assert listed.returncode == 0, listed.terminal[-6000:]
    parts = [name for name in PARTS_KEPT if name.endswith(".parquet")]
    val = pd.concat([bucket_runs.read_parquet(listed, name) for name in parts], ignore_index=True)
    assert_same_rows(val, classify_runs(ROWS, 1).predictions, float_columns={"probs"})
    plan = json.loads(listed.objects["results/val/plan.json"])
    assert [part["path"] for part in plan["input"]["parts"]] == list(VAL_PARTS)  # the objects, in row order
    assert json.loads(listed.objects["results/val/summary.json"])["rows"] == ROWS
    # gather downloads and proves the planned parts; the shard job reads its own cut only
    gather = listed.terminal.split("rule gather:")[1]
    downloaded = re.findall(r"s3://\S+", re.search(r"input: (.*)", gather).group(1))
    assert sorted(url for url in downloaded if "/data/" in url) == sorted(s3.url(key(part)) for part in VAL_PARTS)
    shard_jobs = listed.terminal.split("rule infer:")[1:]
    assert len(shard_jobs) == PARTS_SHARDS
    reads = re.findall(r"s3://\S+", re.search(r"input: (.*)", shard_jobs[0]).group(1))
    assert [url for url in reads if "/results/val/cuts/" in url] and not [url for url in reads if "/data/" in url]


@pytest.mark.e2e
def test_without_a_shared_filesystem_the_shard_jobs_write_the_parts_and_gather_proves_them_by_their_records(
        bucket_runs, s3):
    """The parts reach the bucket from the shard jobs, never through gather's machine: gather downloads
    the records alone and writes the manifest; the verifier proves the folder in the bucket, and names
    a part missing there."""
    listed, key = bucket_runs.listed_parts(), bucket_runs.parts.key
    gather = listed.terminal.split("rule gather:")[1]
    downloaded = re.findall(r"s3://\S+", re.search(r"input: (.*)", gather).group(1))
    assert not [url for url in downloaded if "/predictions/" in url]
    assert sorted(url for url in downloaded if "/results/val/shards/" in url) == [
        s3.url(key(f"results/val/shards/.{k:05d}.record.json")) for k in range(PARTS_SHARDS)]
    outputs = re.search(r"output: (.*)", gather).group(1)
    assert s3.url(key(f"{PARTS_FOLDER}.manifest.json")) in outputs and ".parquet" not in outputs
    manifest = json.loads(listed.objects[f"{PARTS_FOLDER}.manifest.json"])
    assert [part["name"] for part in manifest["parts"]] == [name.rsplit("/", 1)[1] for name in PARTS_KEPT
                                                           if name.endswith(".parquet")]
    plugins.importable()
    from shardinfer.proof.verify import verify_folder

    with pytest.MonkeyPatch.context() as patch:
        for variable, value in s3.env().items():
            patch.setenv(variable, value)
        assert verify_folder(s3.url(key(PARTS_FOLDER)), endpoint_url=s3.endpoint)["rows"] == ROWS
        copy = "storage-parts-copy/predictions/"  # a copy of the folder elsewhere in the bucket, then a part gone
        for name in [".manifest.json", *(part["name"] for part in manifest["parts"][1:])]:
            s3.put(f"{copy}{name}", s3.get(key(f"{PARTS_FOLDER}{name}")))
        with pytest.raises(ProofError, match=r"part `part-00000-of-00002.parquet` is missing \(rows \[0, \d+\)"):
            verify_folder(s3.url(copy), endpoint_url=s3.endpoint)


@pytest.mark.e2e
def test_a_glob_that_matches_no_object_is_refused_in_one_line_when_the_snakefile_loads(s3, models, tmp_path):
    clone = factory.workflow_clone(tmp_path / "clone")
    config = factory.workflow_config("data/part-*.parquet", models.classifier)
    (clone / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "snakemake", "--profile", "profiles/s3", *s3.storage_args("glob"), "-n"]
    env = plugins.with_plugins({**factory.local_env(clone), **s3.env()})
    result = patience.run(command, [clone], cwd=clone, env=env)
    assert result.returncode == 1
    assert ("ERROR: input.path `data/part-*.parquet` matches no objects in the bucket (names starting with `.` or "
            "`_` are skipped)") in result.stdout + result.stderr


@pytest.mark.e2e
def test_a_bucket_that_refuses_or_is_out_of_reach_is_one_line_when_the_snakefile_loads(s3, models, tmp_path):
    """A wrong secret key, a missing bucket, no credentials at all, an endpoint nothing listens on:
    the listing of the input (the run's first request to the bucket) is refused in one line naming
    what to check, not a traceback from boto3 (dry runs, all at once)."""
    clone = factory.workflow_clone(tmp_path / "clone")
    (clone / "config" / "config.yaml").write_text(yaml.safe_dump(factory.workflow_config(INPUT, models.classifier)))
    base = {key: value for key, value in plugins.with_plugins(factory.local_env(clone)).items()
            if not key.startswith(("SNAKEMAKE_STORAGE_S3_", "AWS_"))}
    # no credentials: none in the environment, and boto3's other sources shut (its files, the instance's)
    nowhere = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
               "AWS_EC2_METADATA_DISABLED": "true"}
    where, unreachable = f"the S3 storage at {s3.endpoint}", f"http://127.0.0.1:{free_port()}"
    keys = "check SNAKEMAKE_STORAGE_S3_ACCESS_KEY and SNAKEMAKE_STORAGE_S3_SECRET_KEY (profiles/s3)"
    cases = {
        "wrong secret": ({**s3.env(), "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "wrong"}, s3.storage_args("refused"),
                         f"ERROR: {where} refused the credentials listing `{s3.url('refused')}` "
                         "(SignatureDoesNotMatch: "),
        "missing bucket": (s3.env(), ["--default-storage-prefix", "s3://no-such-bucket/run",
                                      "--storage-s3-endpoint-url", s3.endpoint],
                           f"ERROR: the bucket of `s3://no-such-bucket/run` does not exist in {where} (NoSuchBucket: "),
        "no credentials": (nowhere, s3.storage_args("refused"),
                           f"ERROR: no credentials to list `{s3.url('refused')}` in {where}: set "
                           "SNAKEMAKE_STORAGE_S3_ACCESS_KEY and SNAKEMAKE_STORAGE_S3_SECRET_KEY (profiles/s3)"),
        "out of reach": (s3.env(), ["--default-storage-prefix", s3.url("refused"), "--storage-s3-endpoint-url",
                                    unreachable],
                         f"ERROR: the S3 storage at {unreachable} is out of reach listing `{s3.url('refused')}` "
                         "(Could not connect to the endpoint URL: "),
    }
    started = {name: patience.Started([sys.executable, "-m", "snakemake", "--profile", "profiles/s3", *args, "-n"],
                                      [clone], merged=True, cwd=clone, env={**base, **extra})
               for name, (extra, args, _) in cases.items()}
    for name, run in started.items():
        result = run.finish(f"the dry run with {name}")
        lines = [line for line in result.stdout.splitlines() if line.strip() and not line.startswith("Using profile")]
        assert result.returncode == 1 and len(lines) == 1, f"{name}: {result.stdout[-3000:]}"
        assert lines[0].startswith(cases[name][2]), f"{name}: {lines[0]}"
        if name == "wrong secret":
            assert lines[0].endswith(f"; {keys}"), lines[0]


def test_the_verifier_says_a_refused_key_or_a_missing_bucket_in_one_line(s3, tmp_path, monkeypatch):
    """scripts/verify.py on a folder in the bucket with a wrong secret key, and in a bucket that does
    not exist: the workflow's lines for the same refusals (storage_refusal), not botocore's traceback.
    (No credentials and an endpoint out of reach: tests/test_output_parts.py, without a server.)"""
    from test_output_parts import verify_command

    url, where = s3.url("verify/results/predictions/"), f"the S3 storage at {s3.endpoint}"
    for variable in [key for key in os.environ if key.startswith(("SNAKEMAKE_STORAGE_S3_", "AWS_"))]:
        monkeypatch.delenv(variable)
    wrong = {**s3.env(), "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "wrong"}
    lines = verify_command(url, "--endpoint-url", s3.endpoint, env=wrong)
    assert len(lines) == 1 and lines[0].startswith(f"ERROR {where} refused the credentials reading `{url}` "
                                                   "(SignatureDoesNotMatch: "), lines
    assert lines[0].endswith("; check SNAKEMAKE_STORAGE_S3_ACCESS_KEY and SNAKEMAKE_STORAGE_S3_SECRET_KEY "
                             "(profiles/s3)"), lines
    missing = "s3://no-such-bucket/results/predictions/"
    lines = verify_command(missing, "--endpoint-url", s3.endpoint, env=s3.env())
    assert len(lines) == 1 and lines[0].startswith(f"ERROR the bucket of `{missing}` does not exist in {where} "
                                                   "(NoSuchBucket: "), lines


def kubernetes_pod(resources: dict) -> dict:
    """The job the Kubernetes executor plugin submits for a job with `resources`, from its own
    `run_job` (the API call that would reach a cluster records the job instead)."""
    import threading

    plugins.importable()
    from snakemake_executor_plugin_kubernetes import Executor

    class Recorder:
        def create_namespaced_job(self, namespace, body):
            self.body = body
            return body

    class Job:
        jobid, attempt, is_containerized = 1, 1, False

    Job.resources = resources
    executor = Executor.__new__(Executor)
    executor.__dict__.update(
        logger=__import__("logging").getLogger("kubernetes-test"), run_namespace="test", container_image="image",
        persistent_volumes=[], k8s_service_account_name=None, k8s_cpu_scalar=0.95, secret_envvars={},
        privileged=False, namespace="default", batchapi=Recorder(), lock=threading.Lock())
    executor.format_job_exec = lambda job: "python -m snakemake"
    executor.report_job_submission = lambda info: None
    executor.run_job(Job())
    return executor.batchapi.body.to_dict()


@pytest.mark.e2e
def test_the_kubernetes_profile_gives_each_shard_pod_a_gpu_limit(s3, models, tmp_path):
    """The resources Snakemake gives a shard job under profiles/kubernetes (its dry run prints them),
    through the plugin's pod spec: one nvidia.com/gpu requested and limited, the GPU toleration."""
    clone = factory.workflow_clone(tmp_path / "clone")
    config = factory.workflow_config(INPUT, models.classifier, shards=2)
    (clone / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    s3.put(f"kubernetes/{INPUT}", factory.write_input(factory.input_frame(10), tmp_path / "in.parquet").read_bytes())
    command = [sys.executable, "-m", "snakemake", "--profile", "profiles/kubernetes", *s3.storage_args("kubernetes"),
               "-n", "--forceall"]
    env = plugins.with_plugins({**factory.local_env(clone), **s3.env()})
    result = patience.run(command, [clone], cwd=clone, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    block = result.stdout.split("rule infer:")[1]
    printed = re.search(r"resources: (.*)", block).group(1)
    resources = {key: (int(value) if value.isdigit() else value)
                 for key, value in (item.split("=", 1) for item in printed.split(", ")) if value != "<TBD>"}
    assert resources["gpu"] == 1 and resources["gpu_manufacturer"] == "nvidia" and resources["scale"] == 0
    pod = kubernetes_pod(resources)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["limits"]["memory"] == f"{resources['mem_mb']}M"
    tolerations = pod["tolerations"]
    assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"}.items() <= tolerations[0].items()


@pytest.mark.parametrize("change, refused", [
    ({"model": {"task": "custom"}}, "task custom may write files per row into a folder per shard"),
    ({"inputs": {"val": {"path": "v.csv", "shards": 2}, "test": {"path": "t.csv"}}},
     "inputs have different `shards`"),
])
def test_what_a_bucket_cannot_hold_is_refused_when_the_snakefile_loads(change, refused):
    from shardinfer.core.errors import UserError
    from shardinfer.snakefile.checks import check_storage_inputs

    config = {"input": {"path": "data/input.parquet"}, "model": {"task": "classify"}, "shards": 4}
    if "inputs" in change:
        del config["input"]
    with pytest.raises(UserError, match=re.escape(refused)):
        check_storage_inputs({**config, **{key: {**config.get(key, {}), **value} for key, value in change.items()}})
