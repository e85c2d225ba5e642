"""Tiny Hugging Face models, inputs and workflow runs for the tests. Nothing is downloaded.

The classifier, the encoder and their LoRA adapters, the texts and inputs and a run of the workflow
are scripts/tiny_workflow.py's, which scripts/load_check.py uses too: this module hands them on,
beside the tests' own (a causal LM, a cross-encoder, several runs at once, a clone of the workflow).
"""

from __future__ import annotations

import os
import random
import subprocess
import tomllib
from pathlib import Path

import pandas as pd

import patience
from tiny_workflow import (
    LABELS as LABELS,
)
from tiny_workflow import (
    MAX_POSITIONS as MAX_POSITIONS,
)
from tiny_workflow import (  # what the load check shares, handed on to the tests as this module's
    REPO as REPO,
)
from tiny_workflow import (
    WITHOUT_REPORT as WITHOUT_REPORT,
)
from tiny_workflow import (
    WORDS as WORDS,
)
from tiny_workflow import (
    TinyModels as TinyModels,
)
from tiny_workflow import (
    bert_config as bert_config,
)
from tiny_workflow import (
    build_tiny_models as build_tiny_models,
)
from tiny_workflow import (
    bytes_read as bytes_read,
)
from tiny_workflow import (
    input_frame as input_frame,
)
from tiny_workflow import (
    input_settings as input_settings,
)
from tiny_workflow import (
    local_env as local_env,
)
from tiny_workflow import (
    prepare_workdir as prepare_workdir,
)
from tiny_workflow import (
    read_predictions as read_predictions,
)
from tiny_workflow import (
    save_lora as save_lora,
)
from tiny_workflow import (
    save_tokenizer as save_tokenizer,
)
from tiny_workflow import (
    texts as texts,
)
from tiny_workflow import (
    tiny_model_paths as tiny_model_paths,
)
from tiny_workflow import (
    workflow_config as workflow_config,
)
from tiny_workflow import (
    write_input as write_input,
)


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a Python process a test starts: the folders pytest puts on the tests' own
    path (pyproject.toml's `pythonpath`: the package, the tests' and the scripts' helpers) on its
    PYTHONPATH, so that it imports this clone's code, whatever the venv has installed."""
    folders = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["pythonpath"]
    given = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    paths = [str(REPO / folder) for folder in folders] + given
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


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


def run_workflow(workdir: Path, config: dict, *args: str, report: bool = False) -> subprocess.CompletedProcess:
    """tiny_workflow's run (`snakemake -s <repo>/Snakefile` in `workdir`, as a user runs it from their
    own folder), waited for while it progresses (tests/patience.py: a busy machine is no hang)."""
    command, env = prepare_workdir(workdir, config, *args, report=report)
    return patience.run(command, [workdir], cwd=workdir, env=env)


def run_workflows(runs: list[tuple], report: bool = False) -> list[subprocess.CompletedProcess]:
    """Several independent `run_workflow` runs at once, each `(workdir, config, *extra arguments)`:
    a run of one shard keeps one core busy (its jobs run one after another, each mostly
    single-threaded), so two or more together fill the machine's cores instead of leaving them
    idle. Each keeps its own folder and GPU lock folder."""
    started = []
    for workdir, config, *args in runs:
        command, env = prepare_workdir(workdir, config, *args, report=report)
        started.append((workdir, patience.Started(command, [workdir], cwd=workdir, env=env)))
    return [run.finish(f"the run in {workdir}") for workdir, run in started]


def run_workflows_ok(runs: list[tuple], report: bool = False) -> list[subprocess.CompletedProcess]:
    """`run_workflows`, each run having succeeded (its terminal's end shown where one did not)."""
    results = run_workflows(runs, report=report)
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return results


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
    chunks = (group.column(i) for i in range(group.num_columns))
    chunk = next(chunk for chunk in chunks if chunk.path_in_schema.split(".")[0] == column)
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


def tiny_llama(vocab_size: int, eos: int, eos_like: int, intermediate_size: int = 37, **special_ids):
    """A tiny Llama (hidden 32, two layers, heads of 32 dimensions: the smallest vLLM's CPU attention
    takes), its weights drawn with a large spread (normal(0, 0.5)) so greedy logits are far from
    ties, and the eos row of its head 1.25 times the row of the token `eos_like`: eos wins wherever
    that token would lead strongly, so some greedy rows end on eos and others run to max_new_tokens.
    vLLM splits every layer's outputs between tensor-parallel workers, so a model for tensor parallel 2
    needs an even `intermediate_size` (38; the heads, 4 and 2 KV, divide already)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=intermediate_size,
                         num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=2 * MAX_POSITIONS, eos_token_id=eos, tie_word_embeddings=False,
                         **special_ids)
    torch.manual_seed(11)
    model = spread_weights(LlamaForCausalLM(config))
    with torch.no_grad():
        model.lm_head.weight[eos] = 1.25 * model.lm_head.weight[eos_like]
    return model


def build_tiny_causal_lm(root: Path, intermediate_size: int = 37) -> Path:
    """`tiny_llama` over WORDS, saved with its word-level tokenizer; eos is drawn like "bird"."""
    path = root / ("tiny-causal-lm" if intermediate_size == 37 else f"tiny-causal-lm-{intermediate_size}")
    model = tiny_llama(len(CAUSAL_SPECIALS) + len(CAUSAL_WORDS), 3, len(CAUSAL_SPECIALS) + WORDS.index("bird"),
                       intermediate_size, pad_token_id=0, bos_token_id=2)
    model.save_pretrained(path)
    save_word_tokenizer(path)
    return path


BYTES_SPECIALS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# Each message ends with <|end|>; the generation prompt opens the assistant's turn. Roles other than
# system, user and assistant are refused (a TemplateError), as many real templates do.
BYTES_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def bytes_corpus(lines: int = 3000, seed: int = 0) -> list[str]:
    """Sentences, small JSON objects, dates and labels: enough that the merges spell what the
    structured-output tests' grammars emit."""
    import json

    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.4:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))))
        elif kind < 0.8:
            keys = ["name", "age", "color", "city", "label", "score", "tags"]
            values = [rng.choice(WORDS), rng.randint(0, 999), rng.random(), [rng.choice(WORDS)], True, None]
            out.append(json.dumps({rng.choice(keys): rng.choice(values) for _ in range(3)}))
        else:
            out.append(f"{rng.randint(1900, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                       f"{rng.choice(['yes', 'no', 'maybe', 'positive', 'negative', 'neutral'])}")
    return out


def with_unknown_tokens(lm: Path, root: Path) -> Path:
    """A copy of the tiny Llama (63 embedding rows) whose tokenizer knows two words the model has no
    embedding for (a tokenizer saved with added tokens and an embedding never resized, as happens):
    "zebra" is id 63, which vLLM reads from its padding row (its table padded to 64 rows) and would
    answer silently; "yak" is id 64."""
    import shutil

    from transformers import AutoTokenizer

    copy = root / "lm-extra-tokens"
    if copy.exists():
        return copy
    shutil.copytree(lm, copy)
    tokenizer = AutoTokenizer.from_pretrained(copy)
    tokenizer.add_tokens(["zebra", "yak"])
    tokenizer.save_pretrained(copy)
    return copy


def save_bytes_tokenizer(path: Path, vocab_size: int = 400):
    """A byte-level BPE (all 256 bytes, then merges learned from `bytes_corpus`: deterministic, ~0.5 s),
    as real LLM tokenizers are: xgrammar reads it as a byte-level vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BYTES_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(bytes_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        model_max_length=2 * MAX_POSITIONS)
    tokenizer.add_special_tokens({"additional_special_tokens": BYTES_SPECIALS[3:]})
    tokenizer.chat_template = BYTES_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return tokenizer


def build_tiny_bytes_lm(root: Path) -> Path:
    """`tiny_llama` over a byte-level BPE of ~400 tokens that can spell JSON, dates and labels, with
    a chat template that refuses unknown roles: for conversations, log-probabilities and structured
    output on both engines. eos is drawn like `}`, so JSON rows often end on eos after their brace."""
    from transformers import GenerationConfig

    path = root / "tiny-bytes-lm"
    tokenizer = save_bytes_tokenizer(path)
    model = tiny_llama(len(tokenizer), tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("}"),
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    config = model.config
    model.save_pretrained(path)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(path)
    return path


def spread_weights(model, std: float = 0.5):
    """The model with its matrices drawn again from normal(0, std): a large spread, so that a tiny random
    model's outputs differ visibly from row to row (and from a wrong reading of its inputs)."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, std)
    return model


def build_tiny_cross_encoder(root: Path, num_labels: int = 1) -> Path:
    """A tiny BERT cross-encoder over WORDS for task score: one label (its logit is a pair's score;
    other counts for the refusal), two token types. Random weights drawn with a large spread
    (normal(0, 0.5)), so scores vary from pair to pair and a pair read as one segment (token types
    all 0) scores visibly otherwise."""
    import torch
    from transformers import BertForSequenceClassification

    path = root / f"cross-encoder-{num_labels}"
    torch.manual_seed(13)
    model = spread_weights(BertForSequenceClassification(bert_config(num_labels=num_labels, type_vocab_size=2)))
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
