"""Tiny Hugging Face models, inputs and workflow runs for the tests. Nothing is downloaded.

Models follow transformers' own testers: BERT with hidden size 32 and two layers, a WordPiece
tokenizer over a small vocabulary, saved with save_pretrained like any real model directory.
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


def write_empty_input(path: Path) -> Path:
    """An input with input_frame's columns and no rows (a day's empty split), typed as it would be
    with rows (pandas types an empty column of strings as double in Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        types = {"id": pa.string(), "gold": pa.int64(), "text": pa.string()}
        pq.write_table(pa.table({name: pa.array([], kind) for name, kind in types.items()}), path)
        return path
    return write_input(input_frame(0), path)


def gzipped(frame: pd.DataFrame, path: Path) -> Path:
    """The frame as `path`, a `.csv.gz` or `.jsonl.gz` file."""
    import gzip

    plain = write_input(frame, path.with_suffix(""))
    path.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return path


def bytes_read() -> int:
    """Bytes this process has read through read calls, page cache included (/proc/self/io `rchar`)."""
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("rchar"))


def input_settings(path: Path, **overrides):
    from shardinfer.config import InputSettings
    from shardinfer.input.discovery import detect_format

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


def run_workflows(runs: list[tuple[Path, dict]], timeout: float = 900,
                  report: bool = False) -> list[subprocess.CompletedProcess]:
    """Several independent `run_workflow` runs at once: a run of one shard keeps one core busy (its
    jobs run one after another, each mostly single-threaded), so two or more together fill the
    machine's cores instead of leaving them idle. Each keeps its own folder and GPU lock folder."""
    started = []
    for workdir, config in runs:
        command, env = prepare_workdir(workdir, config, report=report)
        started.append((command, subprocess.Popen(command, cwd=workdir, env=env, text=True, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE)))
    results = []
    for command, process in started:
        out, err = process.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(command, process.returncode, out, err))
    return results


def run_workflows_ok(runs: list[tuple[Path, dict]], report: bool = False) -> list[subprocess.CompletedProcess]:
    """`run_workflows`, each run having succeeded (its terminal's end shown where one did not)."""
    results = run_workflows(runs, report=report)
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return results


def read_predictions(workdir: Path) -> pd.DataFrame:
    return pd.read_parquet(workdir / "results" / "predictions.parquet")


def build_lora_on_plain_base(root: Path) -> tuple[Path, Path, Path]:
    """A base encoder as shipped, whose config names none of the labels (transformers' default 2), a LoRA
    adapter on it whose classifier head has 3 rows, and a copy of the base whose config.json was edited by
    hand to name the adapter's 3 labels (what users had to do before `model.labels`), for references."""
    import json
    import shutil

    import torch
    from transformers import BertModel

    base, adapter, edited = root / "plain-base", root / "plain-base-lora", root / "plain-base-edited"
    torch.manual_seed(5)
    BertModel(bert_config()).save_pretrained(base)
    save_tokenizer(base)
    save_lora(base, adapter, ["classifier"])
    shutil.copytree(base, edited)
    config = json.loads((edited / "config.json").read_text())
    config["id2label"] = {str(i): name for i, name in LABELS.items()}
    config["label2id"] = {name: i for i, name in LABELS.items()}
    (edited / "config.json").write_text(json.dumps(config))
    return base, adapter, edited


def flip_a_data_page_byte(path: Path | str, column: str) -> None:
    """Flip one bit in the last byte of `column`'s chunk in the first row group: a page's header comes
    before its data, so that byte is page data (the last page's), never a header or the footer."""
    import pyarrow.parquet as pq

    group = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema.split(".")[0] == column)
    first = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = bytearray(Path(path).read_bytes())
    data[first + chunk.total_compressed_size - 1] ^= 0x01
    Path(path).write_bytes(bytes(data))


def settings_for(model, inp=None, batch=None, shards: int = 1, **extra):
    """Settings around a ModelSettings, for loading a task directly (the input is never read)."""
    from shardinfer.config import BatchSettings, InputSettings, Settings

    inp = inp or InputSettings(path="unused.parquet", format="parquet", text_column="text", keep_columns=(),
                               null_text="error")
    return Settings(input=inp, model=model, batch=batch or BatchSettings(256, 16, 128), shards=shards, **extra)


CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CAUSAL_SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# transformers' StopStringCriteria reads each token's text by decoding it after "abcdef", which a
# word-level vocabulary must therefore know (subword vocabularies spell it out of pieces).
CAUSAL_WORDS = [*WORDS, "abcdef"]


def save_word_tokenizer(path: Path) -> None:
    """A word-level tokenizer over WORDS that puts <s> before every text, with eos, pad and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*CAUSAL_SPECIALS, *CAUSAL_WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>", model_max_length=MAX_POSITIONS)
    tokenizer.add_special_tokens({"additional_special_tokens": CAUSAL_SPECIALS[4:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)


def build_tiny_causal_lm(root: Path) -> Path:
    """A tiny Llama (hidden 32, two layers, heads of 32 dimensions: the smallest vLLM's CPU attention
    takes) over WORDS, saved with its word-level tokenizer.

    Weights are drawn with a large spread (normal(0, 0.5)) so greedy logits are far from ties, and the
    eos row of the head copies a word's row, scaled up: eos wins wherever that word would lead
    strongly, so some greedy rows end on eos and others run to max_new_tokens.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = root / "tiny-causal-lm"
    config = LlamaConfig(vocab_size=len(CAUSAL_SPECIALS) + len(CAUSAL_WORDS), hidden_size=32, intermediate_size=37,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=2 * MAX_POSITIONS, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                         tie_word_embeddings=False)
    torch.manual_seed(11)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.5)
        head = model.lm_head.weight
        head[3] = 1.25 * head[len(CAUSAL_SPECIALS) + WORDS.index("bird")]
    model.save_pretrained(path)
    save_word_tokenizer(path)
    return path


def build_tiny_cross_encoder(root: Path, num_labels: int = 1) -> Path:
    """A tiny BERT cross-encoder over WORDS for task score: one label (its logit is a pair's score;
    other counts for the refusal), two token types. Random weights drawn with a large spread
    (normal(0, 0.5)), so scores vary from pair to pair and a pair read as one segment (token types
    all 0) scores visibly otherwise."""
    import torch
    from transformers import BertForSequenceClassification

    path = root / f"cross-encoder-{num_labels}"
    torch.manual_seed(13)
    model = BertForSequenceClassification(bert_config(num_labels=num_labels, type_vocab_size=2))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(path)
    save_tokenizer(path)
    return path


def workflow_clone(folder: Path) -> Path:
    """The workflow's sources in `folder`, as a git repository of their own: a user's clone, from
    which Snakemake packs the files git tracks for jobs that share no filesystem (--job-deploy-sources)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "scripts", "envs", "config", "profiles"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, folder / name)
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    subprocess.run(["git", "add", "-A"], cwd=folder, check=True)
    return folder
