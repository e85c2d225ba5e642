"""vLLM's offline engine in the shard job's process: its arguments (the workflow's own, the
device's defaults, then the user's `<task>.vllm`), its environment, its start and its stop. The
devices it spans: `shardinfer.engines.vllm.parallel`. What every vLLM engine of the workflow starts
with is here (`base_arguments`, `cpu_defaults`); generation's own arguments too (`engine_arguments`),
the pooling runner's in `shardinfer.engines.vllm.pooling`.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from pathlib import Path

from shardinfer.core.errors import UserError, first_line
from shardinfer.engines.vllm.checks import INSTALL_HINT, Span, check_lora, vllm_version
from shardinfer.engines.vllm.parallel import check_cpu_pipeline, parallel_arguments, place_workers
from shardinfer.nodes.ranks import node_ranks
from shardinfer.settings.config import ModelSettings
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.generate.params import lines_carry_parameters

log = logging.getLogger(__name__)

CPU_KV_CAP_BYTES = 4 << 30  # the most the CPU default gives the KV cache (set kv_cache_memory_bytes for more)


def kv_bytes_per_token(model_path: str, dtype: str, trust_remote_code: bool = False) -> int:
    """KV cache bytes one token takes: keys and values of every layer's KV heads (transformers'
    config maps each architecture's names, e.g. GPT-2's n_layer and n_head)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).get_text_config()
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        layers = config.num_hidden_layers
    except (AttributeError, OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"model.path `{model_path}`: cannot size the CPU KV cache from its config "
                        f"({first_line(error)}); "
                        "set generate.vllm.kv_cache_memory_bytes") from None
    return 2 * layers * heads * head_dim * (4 if dtype == "float32" else 2)


def cpu_kv_cache_bytes(model: ModelSettings, dtype: str, max_model_len: int, max_num_seqs: int) -> int:
    """On CPU, where vLLM's default takes a share of host memory: room for `max_num_seqs` rows of
    max_model_len tokens, at most CPU_KV_CAP_BYTES."""
    per_token = kv_bytes_per_token(model.path, dtype, model.trust_remote_code)
    return min(per_token * max_model_len * max_num_seqs, CPU_KV_CAP_BYTES)


def base_arguments(context: LoadContext, max_model_len: int) -> dict:
    """LLM(...) keyword arguments every vLLM engine of the workflow sets itself (OWNED_ARGUMENTS):
    the model folder (and its tokenizer), dtype, remote code, the longest row, a fixed seed, and
    the adapter as a LoRA of its rank rounded up."""
    model = context.settings.model
    arguments = {"model": model.path, "tokenizer": model.path, "dtype": str(context.dtype).replace("torch.", ""),
                 "trust_remote_code": model.trust_remote_code, "max_model_len": max_model_len, "seed": 0}
    if model.adapter is not None:
        arguments.update(enable_lora=True, max_loras=1, max_lora_rank=check_lora(model.adapter))
    return arguments


def cpu_defaults(context: LoadContext, user: dict, max_model_len: int) -> dict:
    """On vLLM's CPU build: eager (torch.compile adds its compiling to every start), except with
    pipeline parallel, whose later stages run compiled only (`parallel.check_cpu_pipeline`), and,
    unless the user sizes it, a KV cache for max_num_seqs rows (vLLM's default reserves a share of
    host memory, which fails beside other processes)."""
    defaults = {"enforce_eager": Span.of(context.settings.task_settings).pipeline == 1}
    if "kv_cache_memory_bytes" not in user and "gpu_memory_utilization" not in user:
        seqs = int(user.get("max_num_seqs", 256))
        dtype = str(context.dtype).replace("torch.", "")
        defaults.update(max_num_seqs=seqs, kv_cache_memory_bytes=cpu_kv_cache_bytes(
            context.settings.model, dtype, max_model_len, seqs))
    return defaults


def engine_arguments(context: LoadContext) -> dict:
    """Generation's LLM(...) keyword arguments: the workflow's own (OWNED_ARGUMENTS), the engine's
    defaults for this device and the devices it spans, then the user's `generate.vllm` mapping."""
    model, options = context.settings.model, context.settings.task_settings
    user = dict(options.get("vllm") or {})
    arguments = {**base_arguments(context, model.max_length + model.max_new_tokens),
                 "generation_config": "vllm", **output_arguments(options)}
    arguments.update(parallel_arguments(Span.of(options)))
    if context.device.type == "cpu":
        defaults = cpu_defaults(context, user, arguments["max_model_len"])
        batch = lines_carry_parameters(context.settings)  # any line may sample
        if options.get("do_sample") or batch:
            why = "an OpenAI batch file's lines" if batch else "generate.do_sample"
            defaults.update(cpu_sampling_arguments(user, arguments["max_model_len"], why))
        arguments.update(defaults)
    return {**arguments, **user}


def cpu_sampling_arguments(user: dict, max_model_len: int, why: str = "generate.do_sample") -> dict:
    """Sampling on vLLM's CPU build: without chunked prefill. Each row's seeded generator on CPU (a
    Mersenne Twister) cannot rewind, and vLLM rewinds it whenever a prompt is cut across engine
    steps, which chunked prefill does once a step's prompts exceed max_num_batched_tokens ("CPU
    Generator does not use offset": a shard failed or not by its window's size). Without chunking a
    step takes whole prompts, and outputs are the same (each row's seed decides its sample). A
    user's setting that would cut prompts again is refused, naming the fix (`why`: what samples)."""
    fix = "leave it out: sampling on CPU runs without chunked prefill, which vLLM's CPU build needs for seeded rows"
    if user.get("enable_chunked_prefill"):
        raise UserError(f"generate.vllm.enable_chunked_prefill is true with {why} on CPU, where vLLM "
                        f"fails on a prompt cut across steps (CPU Generator does not use offset); {fix}")
    if (user.get("long_prefill_token_threshold") or 0) > 0:
        raise UserError(f"generate.vllm.long_prefill_token_threshold is {user['long_prefill_token_threshold']} with "
                        f"{why} on CPU, where vLLM fails on a prompt cut across steps (CPU Generator does "
                        f"not use offset); {fix}")
    budget = user.get("max_num_batched_tokens")
    if budget is not None and budget < max_model_len:
        raise UserError(f"generate.vllm.max_num_batched_tokens is {budget}, below max_model_len {max_model_len} "
                        "(model.max_length + model.max_new_tokens): sampling on CPU runs without chunked prefill, so "
                        f"a step must hold a whole prompt; set it to {max_model_len} or more, or leave it out")
    return {"enable_chunked_prefill": False}


def output_arguments(options) -> dict:
    """What the workflow pins of structured output and log-probabilities, so that both engines
    agree: the xgrammar backend (no silent fallback to another library) with the whitespace
    `generate.structured` asks, and log-probabilities of the raw logits (`generate_logprobs`)."""
    structured = options.get("structured") or {}
    compact = structured.get("whitespace") == "compact"
    return {"structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": compact},
            "logprobs_mode": "raw_logprobs"}


def engine_environment() -> None:
    """Set before vLLM is imported: the engine in this process, its log on stderr (the shard log,
    not the terminal) and the job's CPU threads (else vLLM serves on one)."""
    import torch

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # no engine-core process: the job's body runs once
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


def lora_request(adapter: str | None):
    """model.adapter as the LoRA every request of the job names (None without one)."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest("adapter", 1, str(Path(adapter).resolve()))


def start_engine(context: LoadContext, arguments: dict | None = None):
    """vLLM's offline engine, in this process, with its log in the job's log; what it is refused
    (its arguments, the devices it spans) is refused before vLLM is imported. `arguments`:
    generation's (`engine_arguments`) unless given."""
    import torch

    arguments = engine_arguments(context) if arguments is None else arguments
    what = f"{context.settings.model.task}.engine vllm"
    if context.device.type == "cpu":
        check_cpu_pipeline(arguments)
    # An engine over several machines (generate.vllm.nnodes): its other node ranks, started below.
    ranks = node_ranks(arguments, context.device.type, torch.get_num_threads())
    spans = ranks.where() if ranks else place_workers(Span.of(context.settings.task_settings), context.device.type,
                                                      torch.get_num_threads())
    engine_environment()
    try:
        from vllm import LLM
        from vllm.exceptions import VLLMError
    except ImportError as error:
        raise UserError(f"{what}: vLLM cannot be imported here ({first_line(error)}); "
                        f"{INSTALL_HINT}") from None
    started = time.perf_counter()
    try:
        engine = LLM(**arguments, **(ranks.start(arguments) if ranks else {}))
    except (VLLMError, ValueError, TypeError, RuntimeError, OSError, KeyError, NotImplementedError) as error:
        raise UserError(f"{what}: the engine did not start for model.path "
                        f"`{context.settings.model.path}` ({first_line(error)})") from error
    seconds = time.perf_counter() - started
    log.info("vLLM engine (%s) started in %.1f s with %s", vllm_version(), seconds,
             {k: v for k, v in arguments.items() if k not in ("model", "tokenizer")})
    log.info("the engine spans %s", spans)
    return engine, seconds


def stop_engine(llm) -> None:
    """An engine shut down (one that died, before another starts in its place) and its memory freed."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as error:  # noqa: BLE001 - a dead engine may fail to shut down cleanly
        log.warning("shutting the dead engine down failed (%s: %s)", type(error).__name__, first_line(error))
    del llm
    gc.collect()
