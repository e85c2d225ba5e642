"""`shards: auto`: the count follows the machine (GPUs given, cluster job slots, GPUs shown, cores),
and the main process hands its count to the jobs that parse the Snakefile again elsewhere.
End to end: tests/test_faults.py (a run that resolves fewer shards replans) and the dry runs below."""

from __future__ import annotations

import importlib.util
import os
import re
from types import SimpleNamespace

import pytest

import patience
from factory import input_frame, prepare_workdir, workflow_config, write_input
from shardinfer.core.errors import UserError
from shardinfer.snakefile.auto_shards import (
    CPU_SHARDS,
    MOST,
    RESOLVED_VAR,
    Machine,
    auto_shards,
    check_gpus_given,
    missing_gpus,
    resolve_auto_shards,
    resource_value,
    uses_auto,
)


def machine(**given) -> Machine:
    return Machine(**{"gpus": None, "cores": 2, "job_slots": None, "visible_gpus": 0, **given})


@pytest.mark.parametrize("given,count,threads,reason", [
    ({"gpus": 4, "visible_gpus": 8, "job_slots": 16}, 4, 4, "--resources gpu=4"),
    ({"job_slots": 16, "visible_gpus": 1}, 16, 4, "--jobs 16 on a cluster executor"),
    ({"visible_gpus": 2, "cores": 64}, 2, 4, "2 GPU(s) on this machine"),
    ({"cores": 2}, 2, 1, "no GPU: 2 cores, 1 thread per shard job"),
    ({"cores": 1}, 1, 1, "no GPU: 1 core, 1 thread per shard job"),
    ({"cores": 64}, CPU_SHARDS, 8, "no GPU: 64 cores, 8 threads per shard job"),
    ({"cores": 2, "set_threads": 2}, 1, 2, "no GPU: 2 cores, 2 threads per shard job"),
    ({"gpus": 5000, "visible_gpus": 1}, MOST, 4, "--resources gpu=5000"),
    ({"gpus": 2, "set_threads": 8, "visible_gpus": 2}, 2, 8, "--resources gpu=2"),
    ({"gpus": 4, "job_slots": 8}, 4, 4, "--resources gpu=4"),  # a cluster's nodes have the GPUs
    # no GPU to be seen on the local executor: the cores count, whatever --resources gpu says
    ({"gpus": 4, "cores": 2}, 2, 1, "no GPU: 2 cores, 1 thread per shard job; --resources gpu=4 set aside: this "
                                    "machine shows no GPU"),
])
def test_the_count_follows_the_machine(given, count, threads, reason):
    resolved = auto_shards(machine(**given), gpu_threads=4)
    assert (resolved.count, resolved.threads, resolved.reason) == (count, threads, reason)


@pytest.mark.parametrize("given,count,threads,reason", [
    ({"gpus": 8, "visible_gpus": 8}, 4, 4, "--resources gpu=8, 2 per engine"),
    ({"gpus": 3, "visible_gpus": 8}, 1, 4, "--resources gpu=3, 2 per engine"),
    ({"job_slots": 16}, 16, 4, "--jobs 16 on a cluster executor"),  # a job slot runs one engine, on its GPUs
    ({"visible_gpus": 8, "cores": 64}, 4, 4, "8 GPU(s) on this machine, 2 per engine"),
    ({"cores": 2}, 1, 2, "no GPU: 2 cores, 2 threads per shard job"),  # a core per CPU worker
    ({"cores": 64}, CPU_SHARDS, 8, "no GPU: 64 cores, 8 threads per shard job"),
    ({"cores": 5}, 2, 2, "no GPU: 5 cores, 2 threads per shard job"),
])
def test_the_count_is_of_engines_not_devices(given, count, threads, reason):
    """An engine that spans 2 devices (vLLM's tensor parallel 2) counts once."""
    resolved = auto_shards(machine(**given), gpu_threads=4, per_engine=2)
    assert (resolved.count, resolved.threads, resolved.reason) == (count, threads, reason)


def test_fewer_gpus_given_than_one_engine_spans_is_refused_in_one_line():
    check_gpus_given(None, 2, "generate.vllm.x") or check_gpus_given(2, 2, "generate.vllm.x")
    with pytest.raises(UserError, match=re.escape("--resources gpu=1 is fewer than the 2 GPUs one engine spans "
                                                  "(generate.vllm.x is 2); give at least gpu=2")):
        check_gpus_given(1, 2, "generate.vllm.x")


def test_resources_are_read_as_snakemake_holds_them():
    assert resource_value(SimpleNamespace(value=3)) == 3 and resource_value(2) == 2
    assert resource_value(None) is None and resource_value(True) is None and resource_value("x") is None


def fake_workflow(main: bool, **resources):
    """Snakemake's workflow object, as far as auto_shards reads it (its attributes by name)."""
    values = {"_cores": SimpleNamespace(value=2), "_nodes": SimpleNamespace(value=None), **resources}
    return SimpleNamespace(is_main_process=main, global_resources=values,
                           resource_settings=SimpleNamespace(overwrite_threads={}))


def test_the_main_process_hands_its_count_to_jobs_that_parse_again():
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    main = resolve_auto_shards(fake_workflow(True, gpu=SimpleNamespace(value=3)), 4, env)
    assert (main.count, main.threads, env[RESOLVED_VAR]) == (3, 4, "3,4")
    env["CUDA_VISIBLE_DEVICES"] = ""
    job = resolve_auto_shards(fake_workflow(False), 4, env)  # on a node where it would resolve otherwise
    assert (job.count, job.threads) == (3, 4)
    alone = resolve_auto_shards(fake_workflow(False), 4, {"CUDA_VISIBLE_DEVICES": ""})  # nothing handed on
    assert (alone.count, alone.threads) == (2, 1)


def test_gpus_given_to_a_machine_that_shows_none_are_said_when_the_run_starts():
    said = missing_gpus(fake_workflow(True, gpu=SimpleNamespace(value=4)), {"CUDA_VISIBLE_DEVICES": ""})
    assert said == ("shardinfer: WARNING --resources gpu=4, but this machine shows no GPU (no CUDA device visible): "
                    "the shard jobs will run on the CPU")
    assert missing_gpus(fake_workflow(True, gpu=SimpleNamespace(value=4)), {"CUDA_VISIBLE_DEVICES": "0"}) is None
    assert missing_gpus(fake_workflow(True), {"CUDA_VISIBLE_DEVICES": ""}) is None  # none given: none missing
    cluster = fake_workflow(True, gpu=SimpleNamespace(value=4), _nodes=SimpleNamespace(value=8))
    assert missing_gpus(cluster, {"CUDA_VISIBLE_DEVICES": ""}) is None  # its jobs run on the nodes


def test_which_configs_use_auto():
    assert uses_auto({"shards": "auto", "input": {}}) and not uses_auto({"shards": 3, "input": {}})
    assert uses_auto({"shards": 3, "inputs": {"a": {}, "b": {"shards": "auto"}}})
    assert not uses_auto({"shards": "auto", "inputs": {"a": {"shards": 2}}})


@pytest.mark.e2e
def test_the_default_config_resolves_auto_and_says_so(models, tmp_path):
    """Dry runs of the default `shards` (auto), as a user types them: the terminal line and the DAG."""
    write_input(input_frame(20), tmp_path / "data" / "input.parquet")
    config = workflow_config("data/input.parquet", models.classifier)
    del config["shards"]
    without = "; --resources gpu=4 set aside: this machine shows no GPU"
    cores = "no GPU: 2 cores, 1 thread per shard job"
    for args, visible, count, reason in ((("--resources", "gpu=3"), "0,1,2", 3, "--resources gpu=3"),
                                         ((), "", 2, cores), (("--resources", "gpu=4"), "", 2, cores + without)):
        command, env = prepare_workdir(tmp_path, config, "-n", *args)
        result = patience.run(command, [tmp_path], cwd=tmp_path, env={**env, "CUDA_VISIBLE_DEVICES": visible})
        shown = result.stdout + result.stderr
        assert result.returncode == 0, shown[-3000:]
        assert f"shardinfer: shards: auto -> {count} ({reason})" in shown
        assert re.search(rf"^infer\s+{count}$", shown, re.M), shown[-3000:]
        warned = shown.count("shardinfer: WARNING --resources gpu=4, but this machine shows no GPU")
        assert warned == (1 if "gpu=4" in args else 0), shown[-3000:]


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None and os.environ.get("CI") != "true",
                    reason="vLLM is not installed (the config names generate.engine vllm)")
def test_an_engine_of_two_gpus_asks_for_them_and_counts_once(causal_lm, tmp_path):
    """Dry runs of a vLLM config with tensor_parallel_size 2: each shard job asks Snakemake for 2
    GPUs (and threads for its 2 workers), `auto` makes one shard per engine, and fewer GPUs given
    than one engine spans is refused in one line."""
    lm = causal_lm()
    write_input(input_frame(20), tmp_path / "data" / "input.parquet")
    config = workflow_config("data/input.parquet", lm, task="generate", model={"max_new_tokens": 4},
                             generate={"engine": "vllm", "vllm": {"tensor_parallel_size": 2}})
    del config["shards"]
    runs = {args: prepare_workdir(tmp_path, config, "-n", "--resources", args) for args in ("gpu=8", "gpu=1")}
    shown = {}
    for args, (command, env) in runs.items():
        # 8 GPUs this machine shows (a dry run starts no job on them)
        gpus = ",".join(map(str, range(8)))
        result = patience.run(command, [tmp_path], cwd=tmp_path, env={**env, "CUDA_VISIBLE_DEVICES": gpus})
        shown[args] = (result.returncode, result.stdout + result.stderr)
    status, output = shown["gpu=8"]
    assert status == 0 and "shardinfer: shards: auto -> 4 (--resources gpu=8, 2 per engine)" in output, output[-3000:]
    assert re.search(r"^infer\s+4$", output, re.M) and output.count("resources: tmpdir=/tmp, gpu=2") == 4
    status, output = shown["gpu=1"]
    assert status == 1 and ("ERROR: --resources gpu=1 is fewer than the 2 GPUs one engine spans (generate.vllm."
                            "tensor_parallel_size x pipeline_parallel_size is 2)") in output, output[-3000:]
