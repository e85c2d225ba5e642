"""A tiny model, an input of mixed texts and a run of the workflow, all built here (nothing is
downloaded): what scripts/benchmarks/load_check.py and the tests share (tests/factory.py hands these on to them).

Models follow transformers' own testers: BERT with hidden size 32 and two layers, a WordPiece
tokenizer over a small vocabulary, saved with save_pretrained like any real model directory. A run
is `snakemake -s <clone>/Snakefile` in a folder of its own, the way a user runs it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]


WORDS = (
    "the a an cat dog bird fish tree house river mountain city road car train boat plane book "
    "paper pen light dark red green blue big small fast slow old new good bad happy sad run walk "
    "swim fly read write sing dance eat drink sleep dream think know see hear feel make take give"
).split()


MAX_POSITIONS = 64


LABELS = {0: "negative", 1: "neutral", 2: "positive"}


@dataclass(frozen=True)
class TinyModels:
    classifier: Path  # BertForSequenceClassification with a trained (saved) head
    encoder: Path  # BertModel (config names 3 labels), for embed and as a base without a classification head
    lora: Path  # LoRA on `classifier`, init_lora_weights=False, classifier in modules_to_save
    lora_on_encoder: Path  # LoRA on `encoder` carrying the classifier head it needs
    lora_without_head: Path  # LoRA on `encoder` that does not carry a classifier head


def bert_config(**extra):
    from transformers import BertConfig

    shape = dict(vocab_size=len(WORDS) + 7, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=37, max_position_embeddings=MAX_POSITIONS)
    return BertConfig(**{**shape, **extra})


def save_tokenizer(path: Path) -> None:
    from transformers import BertTokenizer

    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ed"])}
    BertTokenizer(vocab=vocab, model_max_length=MAX_POSITIONS).save_pretrained(path)


def save_lora(base_path: Path, out: Path, modules_to_save) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(3)
    base = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=3, id2label=LABELS)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False,
                        modules_to_save=modules_to_save)
    model = get_peft_model(base, config)
    with torch.no_grad():  # large enough to change predictions visibly, in the adapter's weights only
        for name, parameter in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(out)


def tiny_model_paths(root: Path) -> TinyModels:
    return TinyModels(*(root / field.name for field in dataclasses.fields(TinyModels)))


def build_tiny_models(root: Path) -> TinyModels:
    import torch
    from transformers import BertForSequenceClassification, BertModel

    paths = tiny_model_paths(root)
    torch.manual_seed(0)
    BertForSequenceClassification(bert_config(num_labels=3, id2label=LABELS)).save_pretrained(paths.classifier)
    torch.manual_seed(1)
    BertModel(bert_config(num_labels=3, id2label=LABELS)).save_pretrained(paths.encoder)
    for model_dir in (paths.classifier, paths.encoder):
        save_tokenizer(model_dir)
    save_lora(paths.classifier, paths.lora, ["classifier"])
    save_lora(paths.encoder, paths.lora_on_encoder, ["classifier"])
    save_lora(paths.encoder, paths.lora_without_head, None)
    return paths


def texts(rows: int, seed: int = 0) -> list[str]:
    """Texts of very mixed length (1 to 80 words), some longer than the tests' max_length."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 3, 8, 15, 30, 80]))) for _ in range(rows)]


def input_frame(rows: int, seed: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"row-{i}" for i in range(rows)], "gold": [i % 3 for i in range(rows)],
                         "text": texts(rows, seed)})


def write_input(frame: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False, row_group_size=97)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    return path


def bytes_read() -> int:
    """Bytes this process has read through read calls, page cache included (/proc/self/io `rchar`)."""
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("rchar"))


def input_settings(path: Path, **overrides):
    from shardinfer.input.discovery import detect_format
    from shardinfer.settings.config import InputSettings

    values = {"path": str(path), "format": detect_format(str(path)), "text_column": "text", "keep_columns": ("id",),
              "null_text": "error"}
    return InputSettings(**{**values, **overrides})


def workflow_config(input_path, model_path, task="classify", shards=1, adapter=None, **overrides) -> dict:
    config = {
        "input": {"path": str(input_path), "keep_columns": ["id", "gold"]},
        "model": {"path": str(model_path), "task": task, "max_length": 32, "adapter": adapter and str(adapter)},
        "batch": {"max_tokens": 256, "max_rows": 16, "sort_window": 128},
        "shards": shards,
    }
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values} if isinstance(values, dict) else values
    return config


# Most runs stop at the proven table: the report's job after it adds seconds per run and proves nothing
# there. The runs whose report a test reads pass report=True (tests/test_report.py, test_custom.py,
# test_inputs.py, test_metrics.py).
WITHOUT_REPORT = ("--omit-from", "report_items")


def prepare_workdir(workdir: Path, config: dict, *args: str, report: bool = False) -> tuple[list[str], dict]:
    """Write the config into `workdir`; return the user's command and environment for it."""
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2",
               "--set-threads", "infer=1", *args, *(() if report else WITHOUT_REPORT)]
    return command, local_env(workdir)


def local_env(workdir: Path) -> dict:
    """The environment of a local (non-Slurm) `snakemake` run: its own GPU lock folder, and no Slurm.

    Snakemake imports every installed executor plugin when it starts, and the Slurm plugin runs
    `scontrol show config` on import; where Slurm is installed but its controller is down (as on
    this machine after test_slurm stops it), that waits about 9 s per start for an executor a local
    run never uses. A `scontrol` that answers "no controller" at once takes its place here.
    """
    stub = Path(tempfile.gettempdir()) / "shardinfer-test-no-slurm"
    if not (stub / "scontrol").is_file():
        stub.mkdir(exist_ok=True)
        part = stub / f".scontrol.{os.getpid()}"
        part.write_text("#!/bin/sh\necho 'no Slurm controller in local test runs' >&2\nexit 1\n")
        part.chmod(0o755)
        part.replace(stub / "scontrol")
    path = f"{stub}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "SHARDINFER_GPU_LOCK_DIR": str(workdir / ".gpu-locks")}


def run_workflow(workdir: Path, config: dict, *args: str, timeout: float = 900,
                 report: bool = False) -> subprocess.CompletedProcess:
    """`snakemake -s <repo>/Snakefile` in `workdir`, the way a user runs it from their own folder."""
    command, env = prepare_workdir(workdir, config, *args, report=report)
    return subprocess.run(command, cwd=workdir, capture_output=True, text=True, env=env, timeout=timeout)


def read_predictions(workdir: Path) -> pd.DataFrame:
    return pd.read_parquet(workdir / "results" / "predictions.parquet")
