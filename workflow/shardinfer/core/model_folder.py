"""One reader of a model folder's JSON files (config.json, generation_config.json,
tokenizer_config.json, the processor's, sentence-transformers' modules.json and its modules'), so
that every check reads them by one rule and a composite model's text part is found the one way
transformers finds it. Torch- and
transformers-free: the Snakefile's load, the plan and the vLLM checks read a folder before any
engine starts.

**The rule.** A file that is not there is None (or {} where the reader says so): each caller says
what its absence means. A file that is there but cannot be read, is not valid JSON or holds no JSON
object is a one-line `UserError` naming the file and what is wrong: a broken model folder is
refused before any GPU time, never with a JSON traceback and never read as empty.

**The cache.** A file is parsed once per content: keyed on its resolved path, modification time
and size, so that an edited file is read again. Each caller gets its own copy to change.
"""

from __future__ import annotations

import copy
import json
import stat
from functools import lru_cache
from pathlib import Path

from shardinfer.core.errors import UserError

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")  # the newer first
SENTENCE_MODULES = "modules.json"  # sentence-transformers' list of a model's modules
# sentence-transformers' settings of the transformer module, in the order vLLM looks for them
SENTENCE_CONFIGS = tuple(f"sentence_{kind}_config.json" for kind in (
    "bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet"))
# Where transformers' `PretrainedConfig.get_text_config()` looks for a composite model's text part:
# the encoder's name, then the decoder's (`from_model_config` looks among the decoder's only).
TEXT_ENCODER_KEYS = ("text_encoder",)
TEXT_DECODER_KEYS = ("decoder", "generator", "text_config")


def read_json(folder: str | Path | None, name: str) -> dict | None:
    """The JSON object in the folder's file `name`; None where there is no such file (or no folder)."""
    return _read(folder, name, dict, "the JSON object (name: value) a model folder's settings file must hold")


def read_json_list(folder: str | Path | None, name: str) -> list | None:
    """The JSON list in the folder's file `name` (sentence-transformers' modules.json); None where
    there is no such file."""
    return _read(folder, name, list, f"the JSON list a model folder's {name} holds")


def _read(folder: str | Path | None, name: str, kind: type, holds: str):
    if folder is None:
        return None
    path = Path(folder, name)
    try:
        resolved = path.resolve()
        found = resolved.stat()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    data = _parsed(str(resolved), found.st_mtime_ns, found.st_size, str(path))
    if not isinstance(data, kind):
        raise UserError(f"model folder file `{path}` holds a JSON {type(data).__name__}, not {holds}")
    return copy.deepcopy(data)


@lru_cache(maxsize=256)
def _parsed(resolved: str, mtime_ns: int, size: int, shown: str) -> dict | list:
    """The file's JSON, parsed once per (path, mtime, size): `mtime_ns` and `size` are the key only."""
    try:
        return json.loads(Path(resolved).read_text(encoding="utf-8"))  # as transformers reads it
    except OSError as error:
        raise UserError(f"model folder file `{shown}` cannot be read ({error.strerror or error}); "
                        "make it readable") from None
    except ValueError as error:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        raise UserError(f"model folder file `{shown}` is not valid JSON ({error}); "
                        "save the folder again (save_pretrained) or repair the file") from None


def model_config(folder: str | Path | None) -> dict:
    """The folder's config.json, top level as written; {} without one."""
    return read_json(folder, CONFIG) or {}


def text_config(folder: str | Path | None, decoder: bool = False) -> dict:
    """The config of the model's text part, as transformers' `get_text_config()` takes it (with
    `decoder`: `get_text_config(decoder=True)`, the generation side): the one nested config under
    text_encoder, decoder, generator or text_config (a vision-language model's language model),
    else the config itself. Two of them is ambiguous, as transformers says too. Read as written:
    a key the file leaves to the class's default is absent here ({} without a config.json)."""
    config = model_config(folder)
    names = TEXT_DECODER_KEYS if decoder else (*TEXT_ENCODER_KEYS, *TEXT_DECODER_KEYS)
    found = [name for name in names if isinstance(config.get(name), dict)]
    if len(found) > 1:
        raise UserError(f"model folder `{folder}`: its config.json nests several text configs ({', '.join(found)}), "
                        "so which one is the text model is ambiguous (transformers refuses it too)")
    return config[found[0]] if found else config


def generation_config(folder: str | Path | None) -> dict | None:
    """The folder's generation_config.json; None without one (transformers then takes the
    generation keys of config.json: `engines.vllm.checks.generation_config_of`)."""
    return read_json(folder, GENERATION_CONFIG)


def tokenizer_config(folder: str | Path | None) -> dict:
    """The folder's tokenizer_config.json; {} without one."""
    return read_json(folder, TOKENIZER_CONFIG) or {}


def processor_config(folder: str | Path | None) -> dict:
    """The processor's settings: processor_config.json, else preprocessor_config.json; {} without either."""
    return next((found for name in PROCESSOR_FILES if (found := read_json(folder, name))), {})


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def max_positions(folder: str | Path | None) -> int | None:
    """The positions the text model embeds (its text config's max_position_embeddings); None where unsaid."""
    return _int(text_config(folder).get("max_position_embeddings"))


def tokenizer_max_length(folder: str | Path | None) -> int | None:
    """The longest input the tokenizer says the model takes (tokenizer_config.json's model_max_length)."""
    return _int(tokenizer_config(folder).get("model_max_length"))


def vocab_size(folder: str | Path | None) -> int | None:
    """The token ids the model embeds (the logits' width): its text config's vocab_size, else the
    top level's; None where the config says neither."""
    size = text_config(folder).get("vocab_size", model_config(folder).get("vocab_size"))
    return _int(size)


def architectures(folder: str | Path | None) -> list[str]:
    """The model classes config.json names (top level: a composite model's own class)."""
    return [str(name) for name in model_config(folder).get("architectures") or []]


def sentence_modules(folder: str | Path | None) -> list[dict]:
    """The sentence-transformers modules the folder declares (modules.json: each module's `type`,
    such as `sentence_transformers.models.Pooling`, and its subfolder `path`), in order; [] without
    one. vLLM's pooling runner reads them too (its pooling, normalisation and Dense projections)."""
    modules = read_json_list(folder, SENTENCE_MODULES) or []
    return [module for module in modules if isinstance(module, dict)]


def sentence_module_config(folder: str | Path, module: dict) -> dict:
    """A sentence-transformers module's settings: config.json in its subfolder ({} without one)."""
    return read_json(Path(folder, str(module.get("path") or "")), CONFIG) or {}


def sentence_max_length(folder: str | Path | None) -> int | None:
    """The longest input sentence-transformers (and vLLM, as the model's limit) takes: the first
    sentence_<kind>_config.json's max_seq_length, as vLLM reads them; None where none says."""
    for name in SENTENCE_CONFIGS:
        found = read_json(folder, name)
        if found:
            return _int(found.get("max_seq_length"))
    return None
