"""Loading a tokenizer, a model and an optional PEFT adapter from local directories only.

Refuses what would silently give wrong or unsafe results: pickle weights unless allowed,
remote code unless trusted, and (through the task) a classifier head that nobody trained.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from shardinfer.config import ModelSettings
from shardinfer.errors import UserError

log = logging.getLogger(__name__)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def choose_device(threads: int) -> torch.device:
    """The leased GPU if CUDA sees one, else the CPU with the job's threads."""
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    torch.set_num_threads(max(1, threads))
    return torch.device("cpu")


def choose_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting != "auto":
        return DTYPES[setting]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def check_weight_files(directory: str, allow_pickle: bool, what: str) -> None:
    """Safetensors load no code; pickle files can, so they need the config's explicit consent."""
    files = [p.name for p in Path(directory).iterdir() if p.is_file()]
    if any(name.endswith(".safetensors") for name in files):
        return
    pickles = [name for name in files if name.endswith(PICKLE_SUFFIXES)]
    if not pickles:
        raise UserError(f"{what} `{directory}` has no weight file (*.safetensors)")
    if not allow_pickle:
        raise UserError(
            f"{what} `{directory}` has only pickle weights ({', '.join(sorted(pickles))}), which can run code "
            "when loaded; convert them to safetensors or set model.allow_pickle: true if you trust them"
        )


def load_tokenizer(settings: ModelSettings):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            settings.path, local_files_only=True, trust_remote_code=settings.trust_remote_code
        )
    except (OSError, ValueError, TypeError) as error:
        raise UserError(f"model.path `{settings.path}`: no usable tokenizer there ({_first_line(error)})") from error


@dataclass
class LoadedModel:
    model: torch.nn.Module
    missing_keys: set[str]
    adapter_keys: set[str]


def load_model(settings: ModelSettings, auto_class, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    """The base model (plus adapter, merged in float32 when possible), in eval mode on `device`."""
    check_weight_files(settings.path, settings.allow_pickle, "model.path")
    try:
        model, info = auto_class.from_pretrained(
            settings.path,
            dtype=torch.float32 if settings.adapter else dtype,
            local_files_only=True,
            trust_remote_code=settings.trust_remote_code,
            use_safetensors=None if settings.allow_pickle else True,
            output_loading_info=True,
        )
    except (OSError, ValueError, KeyError) as error:
        raise UserError(f"model.path `{settings.path}`: cannot load it as {auto_class.__name__} ({_first_line(error)})") from error
    missing = set(info.get("missing_keys", ()))
    keys: set[str] = set()
    if settings.adapter is not None:
        model, keys = apply_adapter(model, settings)
    return LoadedModel(model=model.to(device=device, dtype=dtype).eval(), missing_keys=missing, adapter_keys=keys)


def adapter_weight_keys(adapter: str) -> set[str]:
    path = Path(adapter) / "adapter_model.safetensors"
    if not path.is_file():
        return set()
    with safe_open(str(path), framework="pt") as handle:
        return set(handle.keys())


def apply_adapter(model, settings: ModelSettings):
    """Load the PEFT adapter on top of `model`; merge it into the weights when peft can."""
    from peft import PeftModel

    check_weight_files(settings.adapter, settings.allow_pickle, "model.adapter")
    try:
        peft_model = PeftModel.from_pretrained(model, settings.adapter, is_trainable=False)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise UserError(f"model.adapter `{settings.adapter}`: cannot apply it to `{settings.path}` ({_first_line(error)})") from error
    keys = adapter_weight_keys(settings.adapter)
    if hasattr(peft_model, "merge_and_unload"):
        return peft_model.merge_and_unload(), keys
    return peft_model, keys


def _first_line(error: BaseException) -> str:
    """The telling line of a library error: torch's state-dict errors put it after a heading."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]
