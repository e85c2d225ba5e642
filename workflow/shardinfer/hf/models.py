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

from shardinfer.core.errors import UserError, first_line
from shardinfer.hf.labels import HEAD_MODULES, base_label_names, label_names
from shardinfer.hf.tokenizer_files import VOCABULARY_FILES, is_vocabulary_file
from shardinfer.settings.config import ModelSettings

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
    """The model directory's own tokenizer; never one made up from the config alone."""
    from transformers import AutoTokenizer

    present = [p.name for p in Path(settings.path).iterdir() if is_vocabulary_file(p)]
    if not present:
        raise UserError(f"model.path `{settings.path}`: no tokenizer there (none of {', '.join(VOCABULARY_FILES)})")
    try:
        return AutoTokenizer.from_pretrained(
            settings.path, local_files_only=True, trust_remote_code=settings.trust_remote_code
        )
    except (OSError, ValueError, TypeError) as error:
        raise UserError(f"model.path `{settings.path}`: no usable tokenizer there ({first_line(error)})") from error


def settle_pad_token(tokenizer, model) -> int:
    """One pad id for tokenizer and model alike.

    Decoder classifiers find each row's last real token by comparing input_ids with the model
    config's pad_token_id, so padding with any other id would read the wrong position.
    """
    config = model.config
    candidate = pad_id_of(tokenizer, getattr(config, "pad_token_id", None))
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = candidate
    return candidate


def pad_id_of(tokenizer, config_pad_id: int | None) -> int:
    """The pad id a model is run with: the tokenizer's, else the model config's, else eos, else 0
    (an engine that loads the model itself reads the config's from the folder)."""
    for candidate in (tokenizer.pad_token_id, config_pad_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


@dataclass
class LoadedModel:
    model: torch.nn.Module
    missing_keys: set[str]
    adapter_keys: set[str]


def load_text_model(settings: ModelSettings, auto_class: str, dtype: torch.dtype, device: torch.device):
    """Tokenizer, model (+ adapter) and the pad id they share: what every Hugging Face text task loads."""
    tokenizer = load_tokenizer(settings)
    loaded = load_model(settings, auto_class, dtype, device)
    return tokenizer, loaded, settle_pad_token(tokenizer, loaded.model)


def load_model(settings: ModelSettings, auto_class, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    """The base model (plus adapter, merged in float32 when possible), in eval mode on `device`.
    `auto_class`: a transformers Auto class or its name."""
    if isinstance(auto_class, str):
        import transformers

        auto_class = getattr(transformers, auto_class)
    check_weight_files(settings.path, settings.allow_pickle, "model.path")
    names = label_names(settings.path, settings.adapter, settings.labels)
    try:
        model, info = auto_class.from_pretrained(
            settings.path,
            dtype=torch.float32 if settings.adapter else dtype,
            local_files_only=True,
            trust_remote_code=settings.trust_remote_code,
            use_safetensors=None if settings.allow_pickle else True,
            output_loading_info=True,
            **label_overrides(settings, names),
        )
    except (OSError, ValueError, KeyError) as error:
        raise UserError(f"model.path `{settings.path}`: cannot load it as {auto_class.__name__} "
                        f"({first_line(error)})") from error
    # A head resized to the adapter's labels is new, like a missing one: the adapter must supply it.
    missing = set(info.get("missing_keys", ())) | {key for key, *_ in info.get("mismatched_keys", ())}
    keys: set[str] = set()
    if settings.adapter is not None:
        model, keys = apply_adapter(model, settings, missing)
    return LoadedModel(model=model.to(device=device, dtype=dtype).eval(), missing_keys=missing, adapter_keys=keys)


def label_overrides(settings: ModelSettings, names: list[str]) -> dict:
    """from_pretrained arguments that give the model the run's labels, when its config names others.

    A base model as shipped does not name the labels its LoRA adapter was trained for; the head is then
    built with the adapter's rows (a head in the checkpoint of another width is dropped, and
    the adapter's replaces it).
    """
    from transformers import AutoConfig

    base = base_label_names(settings.path)
    if names == base:
        return {}
    config = AutoConfig.from_pretrained(settings.path, local_files_only=True,
                                        trust_remote_code=settings.trust_remote_code)
    config.id2label = dict(enumerate(names))
    config.label2id = {name: i for i, name in enumerate(names)}
    return {"config": config, "ignore_mismatched_sizes": len(names) != len(base)}


def adapter_weight_keys(adapter: str) -> set[str]:
    path = Path(adapter) / "adapter_model.safetensors"
    if not path.is_file():
        return set()
    with safe_open(str(path), framework="pt") as handle:
        return set(handle.keys())


def adapter_shape_fault(model, adapter: str, head_keys: set[str]) -> str | None:
    """Compare the adapter's tensors with the model's before peft loads them, to say what is wrong."""
    path = Path(adapter) / "adapter_model.safetensors"
    if not path.is_file():
        return None
    params = dict(model.named_parameters())
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            name = key.removeprefix("base_model.model.")
            shape = tuple(handle.get_slice(key).get_shape())
            module, _, kind = name.partition(".lora_")
            if kind.startswith(("A.", "B.")):  # lora_A: (r, in_features); lora_B: (out_features, r)
                fault = lora_width_fault(model, module, kind, shape)
                if fault:
                    return fault
            elif kind:
                continue
            elif name in params and tuple(params[name].shape) != shape:
                if name in head_keys or name.split(".")[0] in HEAD_MODULES:  # its label count is already the adapter's
                    return (f"its classifier `{name}` has shape {shape}, the model's {tuple(params[name].shape)} "
                            "(a head for another base model?)")
                return (f"`{name}` has shape {tuple(params[name].shape)} in the model but {shape} in the adapter "
                        "(another base model?)")
    return None


def lora_width_fault(model, module: str, kind: str, shape: tuple) -> str | None:
    try:
        target = model.get_submodule(module)
    except AttributeError:
        return f"it adapts `{module}`, which the model does not have (an adapter for another base model?)"
    if hasattr(target, "in_features"):
        widths = (target.in_features, target.out_features)
    elif type(target).__name__ == "Conv1D":  # GPT-2 style: weight is (in, out)
        widths = tuple(target.weight.shape)
    else:
        return None
    want, got = (widths[0], shape[1]) if kind.startswith("A.") else (widths[1], shape[0])
    if want != got:
        return f"`{module}` has width {want} in the model but {got} in the adapter (an adapter for another base model?)"
    return None


def apply_adapter(model, settings: ModelSettings, head_keys: set[str]):
    """Load the PEFT adapter on top of `model`; merge it into the weights when peft can."""
    from peft import PeftModel

    check_weight_files(settings.adapter, settings.allow_pickle, "model.adapter")
    fault = adapter_shape_fault(model, settings.adapter, head_keys)
    if fault:
        raise UserError(f"model.adapter `{settings.adapter}` does not fit `{settings.path}`: {fault}")
    try:
        peft_model = PeftModel.from_pretrained(model, settings.adapter, is_trainable=False)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise UserError(f"model.adapter `{settings.adapter}`: cannot apply it to `{settings.path}` "
                        f"({first_line(error)})") from error
    keys = adapter_weight_keys(settings.adapter)
    if hasattr(peft_model, "merge_and_unload"):
        return peft_model.merge_and_unload(), keys
    return peft_model, keys

