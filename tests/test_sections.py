"""A task's config section as a typed, frozen object (`shardinfer.settings.sections`), and the rule that
keeps finished shards finished: a key added to a section with a default changes neither the shard
digest nor the jobs' params of a config that does not set it; setting it changes both."""

import copy
import dataclasses
import json

import pyarrow as pa
import pytest
import yaml

from shardinfer.contract.shard_file import arrow_type
from shardinfer.core.errors import UserError
from shardinfer.settings import schema as schema_module
from shardinfer.settings.config import Settings
from shardinfer.settings.sections import SECTIONS, GenerateSettings, added, section_settings
from test_digests_pinned import CONFIGS, PINNED, fixed_folders, pinned_values  # noqa: F401 (a fixture)


def test_a_section_is_typed_frozen_and_travels_as_the_config_gave_it():
    section = {"seed": 3, "do_sample": True, "stop": ["."], "engine": "transformers"}
    typed = section_settings("generate", section)
    assert isinstance(typed, GenerateSettings) and typed.stop == (".",) and typed.n == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.seed = 4
    mapping = typed.to_dict()
    assert list(mapping)[:4] == ["seed", "do_sample", "stop", "engine"]  # the config's order first (params' repr)
    assert mapping["stop"] == ["."] and "n" not in mapping and "structured" not in mapping  # added, at default
    assert section_settings("generate", mapping) == typed
    assert GenerateSettings.from_section({**section, "n": 2}).to_dict()["n"] == 2
    assert section_settings("classify", {}).to_dict() == {}


def test_settings_travel_to_jobs_and_back():
    from factory import input_settings, settings_for
    from shardinfer.settings.config import ModelSettings

    model = ModelSettings(path="m", adapter=None, task="generate", max_length=8, dtype="float32",
                          trust_remote_code=False, allow_pickle=False, max_new_tokens=4)
    settings = settings_for(model, inp=input_settings("x.parquet"), task_settings={"n": 3, "do_sample": True,
                                                                                   "logprobs": 0})
    assert Settings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    assert "conversation_columns" not in settings.to_dict()["input"]  # added, at its default: not in the params


def test_an_unknown_key_is_refused_in_one_line():
    with pytest.raises(UserError, match="generate: unknown key.s. temprature; allowed: engine, vllm"):
        GenerateSettings.from_section({"temprature": 0.5})


@pytest.fixture
def schema_with(tmp_path, monkeypatch):
    """`schema_with(key, spec)`: the config schema with `spec` added to the generate section, as a
    release that adds a defaulted key ships it, and GenerateSettings with the field for it."""

    def extend(key: str, spec: dict):
        schema = copy.deepcopy(schema_module.schema())
        schema["properties"]["generate"]["properties"][key] = spec
        path = tmp_path / "config.schema.yaml"
        path.write_text(yaml.safe_dump(schema))
        monkeypatch.setattr(schema_module, "SCHEMA_PATH", path)
        schema_module._schema.cache_clear()
        monkeypatch.setitem(SECTIONS, "generate", dataclasses.make_dataclass(
            "Extended", [(key, int, added("generate", key))], bases=(GenerateSettings,), frozen=True))
        return path

    yield extend
    schema_module._schema.cache_clear()


@pytest.mark.usefixtures("fixed_folders")
@pytest.mark.parametrize("name", ["generate", "generate-vllm"])
def test_a_key_added_with_a_default_leaves_digests_and_params_unchanged_until_set(schema_with, name):
    import test_digests_pinned

    later = {"type": "integer", "minimum": 1, "default": 1, "description": "A later key."}
    original, path = test_digests_pinned.SCHEMA_PATH, schema_with("best_of", later)
    test_digests_pinned.SCHEMA_PATH = path  # pinned_values validates with the release's schema
    try:
        config = copy.deepcopy(CONFIGS[name])
        assert pinned_values(copy.deepcopy(config)) == PINNED[name]
        config["generate"]["best_of"] = 1  # set to its default: the same outputs, the same digests
        assert pinned_values(copy.deepcopy(config)) == PINNED[name]
        config["generate"]["best_of"] = 2
        digest, _, params, *_ = pinned_values(copy.deepcopy(config))[None]
        assert digest != PINNED[name][None][0] and params != PINNED[name][None][2]
    finally:
        test_digests_pinned.SCHEMA_PATH = original


@pytest.mark.usefixtures("fixed_folders")
@pytest.mark.parametrize("key,value", [("n", 2), ("logprobs", 0), ("structured", {"choice": ["a", "b"]})])
def test_this_releases_keys_move_the_digest_only_when_set(key, value):
    config = copy.deepcopy(CONFIGS["generate"])
    config["generate"][key] = value
    digest, _, params, *_ = pinned_values(config)[None]
    assert digest != PINNED["generate"][None][0] and params != PINNED["generate"][None][2]


def test_struct_types_in_words_and_arrow_types_alike():
    assert arrow_type("struct<start: int32, label: string, spans: list<struct<a: int8>>>") == pa.struct(
        [("start", pa.int32()), ("label", pa.string()), ("spans", pa.list_(pa.struct([("a", pa.int8())])))])
    assert arrow_type(pa.list_(pa.float16())) == pa.list_(pa.float16())
    for bad, says in (("struct<a>", "must be `name: type`"), ("struct<a: nope>", "unknown type 'nope'"),
                      ("struct<a: file:.png>", "a file is a column of its own")):
        with pytest.raises(ValueError, match=says):
            arrow_type(bad)


@pytest.mark.parametrize("spec,says", [
    ({"json": {"type": "object"}, "regex": "a"}, "needs exactly one of json, regex, choice; got .'json', 'regex'."),
    ({}, "needs exactly one of json, regex, choice; got none"),
    ({"regex": "(", "whitespace": "compact"}, "whitespace is for json; leave it out with regex"),
    ({"regex": "("}, r"regex '\(' is not a regular expression"),
    ({"choice": ["a", ""]}, "choice must be a list of non-empty strings"),
    ({"json": {"type": "nonsense"}}, "is not a valid JSON schema"),
    ({"json": "missing.json"}, "`missing.json` is neither a JSON schema nor a file"),
    ({"json": "{not json"}, "is not JSON"),
])
def test_a_bad_structured_spec_is_refused_in_one_line(spec, says):
    with pytest.raises(UserError, match=says) as refused:
        GenerateSettings.from_section({"structured": spec})
    assert "\n" not in str(refused.value)


def test_a_json_schema_file_is_read_once_into_the_settings(tmp_path):
    schema = {"type": "object", "properties": {"label": {"enum": ["yes", "no"]}}}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    typed = GenerateSettings.from_section({"structured": {"json": str(tmp_path / "schema.json")}})
    assert typed.structured == {"json": schema, "whitespace": "any"}
    assert GenerateSettings.from_section(typed.to_dict()) == typed  # the job gets the schema, not the path
