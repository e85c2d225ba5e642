"""How many labels a classifier has and what they are called: the adapter's head, `model.labels`, the base config.

A base model as shipped names none of the labels a LoRA adapter was trained for (its config says 2 generic
labels, or another task's). The adapter's classifier head says how many there are; `model.labels` names them.
Free of torch and transformers: the Snakefile checks labels when it loads, and the model loader uses the
same answer.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import model_config

HEAD_MODULES = ("classifier", "score")  # what sequence-classification models name their head
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header


def tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Every tensor's shape, read from a safetensors file's JSON header: no weight is loaded."""
    try:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(handle.read(size))
        return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, struct.error) as error:
        raise UserError(f"`{path}` is not a readable safetensors file ({error})") from error


def module_name(key: str) -> str:
    """The base model's name for an adapter tensor: peft's prefix and modules_to_save wrapper taken out."""
    name = key.removeprefix("base_model.model.")
    return re.sub(r"\.(modules_to_save\.[^.]+|original_module)(?=\.)", "", name)


def adapter_head(adapter: str | None) -> tuple[str, int] | None:
    """The adapter's classifier output layer and its rows (one per label); None if it carries no head.

    The output layer is the head's narrowest 2-D weight: a head's hidden layers are as wide as the model
    (RoBERTa's classifier.dense), its output layer has a row per label (BERT's classifier, Qwen's score).
    """
    path = Path(adapter) / ADAPTER_WEIGHTS if adapter is not None else None
    if path is None or not path.is_file():
        return None
    weights = []
    for key, shape in tensor_shapes(path).items():
        name = module_name(key)
        if len(shape) == 2 and name.split(".")[0] in HEAD_MODULES and name.endswith(".weight") and ".lora_" not in name:
            weights.append((shape[0], name))
    if not weights:
        return None
    rows, name = min(weights)
    return name, rows


def base_label_names(model_path: str) -> list[str]:
    """The labels the model's config.json names, read as transformers does (2 generic ones when it names none)."""
    config = model_config(model_path)  # its presence: TextTask.check_settings
    id2label = config.get("id2label")
    if id2label:
        return [str(id2label[key]) for key in sorted(id2label, key=int)]
    return generic_names(config.get("num_labels") or 2)


def generic_names(count: int) -> list[str]:
    """The names transformers gives labels nobody named."""
    return [f"LABEL_{i}" for i in range(count)]


def label_names(path: str, adapter: str | None, labels: tuple[str, ...] | None) -> list[str]:
    """One name per row of the classifier the run uses.

    How many: the adapter's head if it carries one, else the base config. Named by `labels` (which must
    have that many), else by the base config if it names that many, else LABEL_0.. as transformers does.
    """
    base = base_label_names(path)
    head = adapter_head(adapter)
    rows = head[1] if head else len(base)
    if labels is not None and len(labels) != rows:
        source = f"the adapter `{adapter}`'s classifier `{head[0]}`" if head else f"the config of model.path `{path}`"
        raise UserError(f"model.labels gives {len(labels)} names but {source} has {rows} labels; give {rows} names "
                        "or leave model.labels out")
    if labels is not None:
        return list(labels)
    return base if len(base) == rows else generic_names(rows)
