"""Bare vLLM, the peer of the vLLM shard job: one `LLM.generate` over every prompt, as a user of
vLLM's offline engine writes it, on the shard job's token ids, engine arguments and SamplingParams.
"""

from __future__ import annotations

import time

import pandas as pd
import torch

from benchmarks import engine_counts
from shardinfer.engines.vllm.engine import engine_environment
from shardinfer.settings.config import Settings


def bare_vllm(settings: Settings, device: str) -> dict:
    """vLLM's own offline way: one LLM.generate call over every prompt, as token ids (the shard
    job's, built by the same function), with the engine arguments and environment the shard job
    uses, so that the two differ only in what the shard job adds around the engine."""
    from shardinfer.engines.vllm.checks import generation_config_of, generation_to_vllm
    from shardinfer.engines.vllm.engine import engine_arguments
    from shardinfer.hf.models import choose_dtype, load_tokenizer
    from shardinfer.tasks.base import LoadContext
    from shardinfer.tasks.generate.prompts import prompt_token_ids
    from shardinfer.tasks.generate.task import eos_token_ids

    engine_environment()  # the shard job's: in-process engine, the same CPU threads
    engine_counts.count_schedules()
    started = time.perf_counter()
    from vllm import LLM

    imported = time.perf_counter()
    model = settings.model
    tokenizer = load_tokenizer(model)
    texts = pd.read_parquet(settings.input.path)[settings.input.text_column].tolist()
    ids, _ = prompt_token_ids(tokenizer, texts, model.max_length, chat_template=False)
    config = generation_config_of(model.path)
    context = LoadContext(settings, torch.device(device), choose_dtype(model.dtype, torch.device(device)))
    loading = time.perf_counter()
    llm = LLM(**engine_arguments(context))
    ready = time.perf_counter()
    params = sampling_params(settings, eos_token_ids(tokenizer, config.get("eos_token_id")),
                             generation_to_vllm(config, model.path), len(ids))
    options = settings.task_settings
    compiled = compile_seconds(llm, ids[0], params[0]) if options.structured or options.logprobs is not None else 0.0
    engine_counts.reset()  # the timed call's steps only
    begun = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": row} for row in ids], params, use_tqdm=False)
    done = time.perf_counter()
    return {"import_s": imported - started, "start_s": ready - loading, "generate_s": done - begun,
            "compile_s": compiled, "engine": engine_counts.taken(),
            "tokens": [list(output.outputs[0].token_ids) for output in outputs],
            "generated": sum(len(c.token_ids) for output in outputs for c in output.outputs),
            "prompts": [len(row) for row in ids]}


def sampling_params(settings, eos_ids: list[int], mapped: dict, rows: int) -> list:
    """The SamplingParams the shard job's vLLM engine builds for each row (`VllmGenerate.sampling_params`),
    written out here as a user of bare vLLM would: n, a seed per row (row_seed), logprobs (flat, as the
    shard job asks them: vLLM's cheaper container), schema."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from shardinfer.tasks.generate.params import row_seed

    o, max_new = settings.task_settings, settings.model.max_new_tokens
    structured = StructuredOutputsParams(json=o.structured["json"]) if o.structured else None
    if not o.do_sample:
        return [SamplingParams(temperature=0.0, max_tokens=max_new, detokenize=False, stop_token_ids=eos_ids,
                               logprobs=o.logprobs, flat_logprobs=True, structured_outputs=structured, **mapped)] * rows
    return [SamplingParams(temperature=o.temperature, top_p=o.top_p, seed=row_seed(o.seed, i), n=o.n,
                           max_tokens=max_new, detokenize=False, stop_token_ids=eos_ids, logprobs=o.logprobs,
                           flat_logprobs=True, structured_outputs=structured, **mapped) for i in range(rows)]


def compile_seconds(llm, ids: list[int], params) -> float:
    """What a feature costs once per engine, as a user meets it: short requests asking the variant's
    schema or log-probabilities less the same requests without (vLLM caches the compiled grammar, and
    compiles its log-probability rank count at the first step that asks one, again for the next batch
    size: torch.compile's dynamic shapes), so the timed run after it does not pay it."""
    from vllm import SamplingParams

    plain = SamplingParams(max_tokens=2, temperature=0.0)
    asked = SamplingParams(max_tokens=2, temperature=0.0, structured_outputs=params.structured_outputs,
                           logprobs=params.logprobs, flat_logprobs=True)
    llm.generate([{"prompt_token_ids": ids}], plain, use_tqdm=False)
    first = time.perf_counter()
    for batch in (1, 2):
        llm.generate([{"prompt_token_ids": ids}] * batch, asked, use_tqdm=False)
    with_feature = time.perf_counter() - first
    started = time.perf_counter()
    for batch in (1, 2):
        llm.generate([{"prompt_token_ids": ids}] * batch, plain, use_tqdm=False)
    return with_feature - (time.perf_counter() - started)
