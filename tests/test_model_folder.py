"""One reader of a model folder's JSON files (`shardinfer.core.model_folder`): a missing file is None or
empty, a broken one is refused in one line naming it, a composite model's text config is taken as
transformers' `get_text_config()` takes it, and an edited file is read again. Configs are built
with transformers here and saved to folders: no hub."""

import json
import os
import re

import pytest

from factory import settings_for
from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import (
    architectures,
    generation_config,
    max_positions,
    model_config,
    processor_config,
    read_json,
    text_config,
    tokenizer_config,
    vocab_size,
)
from shardinfer.settings.config import ModelSettings

READERS = {"config.json": model_config, "generation_config.json": generation_config,
           "tokenizer_config.json": tokenizer_config, "preprocessor_config.json": processor_config}


def llava_folder(folder, positions: int = 64, tokenizer_limit: int | None = None):
    """A LLaVA model folder's config.json, as save_pretrained writes it: the language model's
    settings (its positions, its vocabulary) nested under text_config, none at the top level."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    text = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, max_position_embeddings=positions)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                architectures=["LlavaForConditionalGeneration"]).save_pretrained(folder)
    if tokenizer_limit is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": tokenizer_limit}))
    return folder


def test_a_missing_file_or_folder_is_none_or_empty(tmp_path):
    assert read_json(tmp_path, "config.json") is None and read_json(None, "config.json") is None
    assert model_config(tmp_path) == {} and model_config(tmp_path / "absent") == {} and model_config(None) == {}
    assert generation_config(tmp_path) is None
    assert tokenizer_config(tmp_path) == {} and processor_config(tmp_path) == {} and text_config(tmp_path) == {}
    assert max_positions(tmp_path) is None and vocab_size(tmp_path) is None and architectures(tmp_path) == []
    (tmp_path / "config.json").mkdir()  # a folder of that name is no file
    assert model_config(tmp_path) == {}


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize(("content", "wrong"), [
    (b'{"vocab_size": 12,', r"is not valid JSON \(Expecting property name"),
    (b"\xff\xfe not text", r"is not valid JSON \('utf-8' codec can't decode"),
    (b"[1, 2]", r"holds a JSON list, not the JSON object"),
])
def test_a_broken_file_is_refused_in_one_line_naming_it(tmp_path, name, content, wrong):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError, match=rf"^model folder file `{re.escape(str(tmp_path / name))}` {wrong}") as caught:
        READERS[name](tmp_path)
    assert "\n" not in str(caught.value)


def test_a_nested_text_config_is_taken_before_the_top_level(tmp_path):
    config = {"max_position_embeddings": 999, "vocab_size": 5, "text_config": {"max_position_embeddings": 64},
              "vision_config": {"max_position_embeddings": 7}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert text_config(tmp_path) == {"max_position_embeddings": 64}
    assert max_positions(tmp_path) == 64
    assert vocab_size(tmp_path) == 5  # the text config says none: the top level's, as before
    (tmp_path / "config.json").write_text(json.dumps({"text_encoder": {"vocab_size": 3}, "vocab_size": 9}))
    assert vocab_size(tmp_path) == 3
    assert text_config(tmp_path, decoder=True) == {"text_encoder": {"vocab_size": 3}, "vocab_size": 9}


def test_two_nested_text_configs_are_refused_as_transformers_refuses_them(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_encoder": {}, "decoder": {}}))
    with pytest.raises(UserError, match=r"^model folder `.*`: its config.json nests several text configs "
                                        r"\(text_encoder, decoder\), so which one"):
        text_config(tmp_path)
    assert text_config(tmp_path, decoder=True) == {}  # the decoder side alone: one


def test_an_edited_file_is_read_again_and_each_caller_gets_its_own_copy(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"vocab_size": 10}))
    assert vocab_size(tmp_path) == 10
    path.write_text(json.dumps({"vocab_size": 200}))  # another size
    assert vocab_size(tmp_path) == 200
    path.write_text(json.dumps({"vocab_size": 300}))  # the same size: a later time
    later = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(later, later))
    assert vocab_size(tmp_path) == 300
    model_config(tmp_path)["vocab_size"] = 1
    assert vocab_size(tmp_path) == 300
    path.unlink()
    assert vocab_size(tmp_path) is None


def test_an_unchanged_file_is_parsed_once(tmp_path):
    from shardinfer.core.model_folder import _parsed

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    before = _parsed.cache_info()
    assert architectures(tmp_path) == architectures(tmp_path) == ["LlamaForCausalLM"]
    after = _parsed.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)


def transformers_text_config(folder, decoder: bool | None = None) -> dict:
    from transformers import AutoConfig

    return json.loads(AutoConfig.from_pretrained(folder).get_text_config(decoder=decoder).to_json_string(False))


@pytest.mark.parametrize("kind", ["llava", "qwen2"])
def test_the_text_config_is_the_one_transformers_takes(tmp_path, kind):
    """Every key read here is the config transformers' get_text_config() gives, with its value
    (transformers adds the class's defaults the file leaves out)."""
    from transformers import Qwen2Config

    if kind == "llava":
        llava_folder(tmp_path)
    else:
        Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=96).save_pretrained(tmp_path)
    for decoder in (None, True):
        theirs, ours = transformers_text_config(tmp_path, decoder), text_config(tmp_path, decoder=bool(decoder))
        assert set(ours) <= set(theirs)
        assert {key: theirs[key] for key in ours} == ours
    expected = {"llava": ("llama", 64), "qwen2": ("qwen2", 96)}[kind]
    assert (text_config(tmp_path)["model_type"], max_positions(tmp_path), vocab_size(tmp_path)) == (*expected, 100)


def generate_model(path, max_length: int, max_new_tokens: int = 8) -> ModelSettings:
    return ModelSettings(path=str(path), adapter=None, task="generate", max_length=max_length, dtype="auto",
                         trust_remote_code=False, allow_pickle=False, max_new_tokens=max_new_tokens)


def test_a_llava_folders_max_length_is_checked_against_its_text_models_positions(tmp_path):
    """model.max_length above the nested text config's positions is refused when settings are
    checked, in one line (read at the top level alone, the check was skipped)."""
    from shardinfer.tasks.generate.task import Generate
    from shardinfer.tasks.text import model_length_limit

    llava_folder(tmp_path, positions=64)
    assert model_length_limit(str(tmp_path)) == 64
    with pytest.raises(UserError, match=r"^model.max_length 100 is above the model's limit of 64 tokens; use 1..64$"):
        Generate.check_settings(settings_for(generate_model(tmp_path, 100)))
    with pytest.raises(UserError, match=r"^model.max_length 60 \+ model.max_new_tokens 8 is above the model's limit "
                                        r"of 64 positions"):
        Generate.check_settings(settings_for(generate_model(tmp_path, 60)))
    Generate.check_settings(settings_for(generate_model(tmp_path, 56)))


def test_the_smaller_of_the_tokenizers_and_the_text_models_limit_is_the_models(tmp_path):
    from shardinfer.tasks.text import model_length_limit

    llava_folder(tmp_path, positions=64, tokenizer_limit=48)
    assert model_length_limit(str(tmp_path)) == 48
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))  # "no limit"
    assert model_length_limit(str(tmp_path)) == 64
