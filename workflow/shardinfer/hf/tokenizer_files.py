"""Which files in a model folder make up its tokenizer: what the loader looks for and what the
tokenizer digest (`shardinfer.snakefile.settings_digest`) covers. Free of torch and transformers."""

from __future__ import annotations

from pathlib import Path

VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model")  # one of these (or a *.tiktoken file) means a tokenizer is there
TOKENIZER_FILES = (*VOCABULARY_FILES, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "merges.txt")  # every file that can change the token ids


def is_vocabulary_file(path: Path) -> bool:
    return path.name in VOCABULARY_FILES or path.suffix == ".tiktoken"


def is_tokenizer_side(name: str, trust_remote_code: bool = False) -> bool:
    """Whether a file of a model folder is one the tokenizer loads: its files, config.json (which
    can pick its class) and, with remote code allowed, the folder's Python files. Not the weights."""
    path = Path(name)
    return (name in TOKENIZER_FILES or is_vocabulary_file(path) or name == "config.json"
            or (trust_remote_code and path.suffix == ".py"))
