"""The generation features on the transformers engine, driven as a shard job drives the task (prepare,
batches, the device loop, to_arrow) over the tiny byte-level Llama, and their parts alone: samples
that depend on (seed, row, number) only, with the prompt computed once; log-probabilities as
defined; structured output judged; conversations checked, rendered and fitted to max_length by the
documented rule; rows with parameters of their own; and what is refused, in one line."""

import dataclasses
import json
import re

import numpy as np
import pyarrow as pa
import pytest
import torch

from conftest import made_once
from factory import WORDS, settings_for
from generation_data import CHOICES, SCHEMA, conversations, run_window
from shardinfer.core.errors import UserError
from shardinfer.engines.transformers import Transformers
from shardinfer.settings.config import BatchSettings, InputSettings, ModelSettings
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.generate.params import RowParams
from shardinfer.tasks.generate.task import Generate
from tiny_models import build_tiny_bytes_lm

MAX_LENGTH, NEW_TOKENS = 48, 12
TEXTS = ["the cat sat", '{"name": "dog", "age"', "big red house and a small boat", "write json", "2024-01-02 was a",
         "yes or no", "the old river", "happy"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return made_once(tmp_path_factory, "bytes-lm", build_tiny_bytes_lm) / "tiny-bytes-lm"


def settings(lm, conversations_column: str | None = None, max_new_tokens: int = NEW_TOKENS, **options):
    model = ModelSettings(path=str(lm), adapter=None, task="generate", max_length=MAX_LENGTH, dtype="float32",
                          trust_remote_code=False, allow_pickle=False, max_new_tokens=max_new_tokens)
    column = conversations_column or "text"
    inp = InputSettings(path="unused.parquet", format="parquet", text_column="text", keep_columns=(), null_text="error",
                        task_columns=(column,), column_keys=("input.messages_column",) if conversations_column else (),
                        text_columns=() if conversations_column else None,
                        conversation_columns=(column,) if conversations_column else ())
    return settings_for(model, inp=inp, batch=BatchSettings(1000, 4, 64), task_settings=options)


@pytest.fixture(scope="module")
def task(lm):
    """`task(**options)`: the transformers engine's task for those `generate:` options, loaded once."""
    cache = {}

    def loaded(conversations_column=None, **options) -> Generate:
        key = json.dumps([conversations_column, options], sort_keys=True)
        if key not in cache:
            cache[key] = Generate.load(LoadContext(settings(lm, conversations_column, **options), torch.device("cpu"),
                                                   torch.float32))
        return cache[key]

    return loaded


def texts_table(texts=TEXTS) -> pa.Table:
    return pa.table({"text": texts})


SAMPLING = {"do_sample": True, "seed": 3, "temperature": 1.3}


def column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist()


def test_sample_j_depends_on_seed_row_and_j_only(task):
    one = column(run_window(task(**SAMPLING), texts_table()), "generated")
    four = column(run_window(task(**SAMPLING, n=4), texts_table(), max_rows=3), "generated")
    two = column(run_window(task(**SAMPLING, n=2), texts_table()), "generated")
    assert [row[0] for row in four] == one  # sample 0 is what n = 1 draws
    assert [row[:2] for row in four] == two
    back = column(run_window(task(**SAMPLING, n=2), texts_table(TEXTS[4:]), 4), "generated") + column(
        run_window(task(**SAMPLING, n=2), texts_table(TEXTS[:4])), "generated")
    assert back[4:] + back[:4] == two
    assert column(run_window(task(**SAMPLING, n=2), texts_table(TEXTS[2:5]), 2), "generated") == two[2:5]
    assert all(len(set(row)) > 1 for row in four)


def test_the_prompt_is_computed_once_for_n_samples(task):
    """The model embeds each prompt token once however many samples (the cache repeated), and the
    samples are those of prompts computed n times."""
    sampled = task(**SAMPLING, n=4)
    embedded = []
    hook = sampled.model.get_input_embeddings().register_forward_hook(lambda m, a, o: embedded.append(a[0].numel()))
    try:
        shared = run_window(sampled, texts_table(), max_rows=8)
        once = sum(embedded)
        sampled.engine.shared_prefill, embedded[:] = False, []
        repeated = run_window(sampled, texts_table(), max_rows=8)
    finally:
        sampled.engine.shared_prefill = True
        hook.remove()
    assert shared.equals(repeated)
    window = sampled.prepare(0, texts_table())
    batches = sampled.batches(window, BatchSettings(10_000, 8, 64))  # 2 rows each: 4 samples of a row count as 4
    prompts = sum(len(b) * (max(len(window.data.ids[p]) for p in b) - 1) for b in batches)
    assert sum(embedded) - once == 3 * prompts  # the padded prompts' tokens but the last, 3 times more


def reference_logprobs(lm, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """log_softmax of the model's own logits over prompt + tokens, one forward pass, at each generated token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(lm, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt) - 1: len(prompt) + len(tokens) - 1], -1)
    return steps[torch.arange(len(tokens)), torch.tensor(tokens)].numpy()


@pytest.mark.parametrize("options", [{}, {"do_sample": True, "seed": 1, "temperature": 2.0, "top_p": 0.7}])
def test_log_probabilities_are_the_models_raw_ones(lm, task, options):
    """Greedy or sampled at temperature 2 with top_p: the model's untempered log-softmax at each token."""
    generating = task(logprobs=3, **options)
    rows = run_window(generating, texts_table()).to_pylist()
    prompts = generating.prepare(0, texts_table()).data.ids
    for row, prompt in zip(rows, prompts):
        ids = [token["token_id"] for token in row["logprobs"]]
        assert len(ids) == row["n_generated_tokens"]
        got = np.array([token["logprob"] for token in row["logprobs"]])
        assert np.abs(got - reference_logprobs(lm, prompt, ids)).max() < 1e-4
        for token in row["logprobs"]:
            top = [t["logprob"] for t in token["top_logprobs"]]
            assert len(top) == 3 and top == sorted(top, reverse=True) and token["logprob"] <= top[0] + 1e-6


def test_a_constrained_tokens_log_probability_is_among_the_allowed_tokens(task):
    """With a choice, the mask comes first: the allowed tokens' probabilities sum to 1."""
    rows = run_window(task(logprobs=5, structured={"choice": CHOICES}), texts_table()).to_pylist()
    first = [row["logprobs"][0]["top_logprobs"] for row in rows]
    for top in first:
        finite = [t["logprob"] for t in top if np.isfinite(t["logprob"])]
        assert abs(np.exp(finite).sum() - 1) < 1e-4  # the choices' first tokens, renormalized


def test_structured_json_regex_and_choice(task):
    from jsonschema import Draft202012Validator

    json_rows = run_window(task(max_new_tokens=20, structured={"json": SCHEMA, "whitespace": "compact"}),
                           texts_table()).to_pylist()
    assert {row["finish_reason"] for row in json_rows} == {"eos", "length"}
    for row in json_rows:
        if row["finish_reason"] == "eos":
            value = json.loads(row["generated"])
            assert row["valid"] and row["parsed"] == value and not list(Draft202012Validator(SCHEMA).iter_errors(value))
        else:
            assert not row["valid"] and row["invalid_reason"] == "cut by max_new_tokens" and row["parsed"] is None
    regex = run_window(task(structured={"regex": r"\d{4}-\d{2}-\d{2}"}), texts_table()).to_pylist()
    assert all(row["valid"] and len(row["generated"]) == 10 for row in regex)
    choice = run_window(task(structured={"choice": CHOICES}), texts_table()).to_pylist()
    assert {row["generated"] for row in choice} <= set(CHOICES) and all(row["valid"] for row in choice)


@pytest.mark.parametrize("text,finish,why", [
    ('{"label":"yes","age":4}', "length", "cut by max_new_tokens"),
    ('{"label":"yes","age":4}', "stop", "ended by stop, not eos"),
    ('{"label":"yes\x04","age":4}', "eos", "not JSON: Invalid control character"),
    ('{"label":"yes"}', "eos", "schema: 'age' is a required property"),
])
def test_a_row_is_valid_json_only_when_ended_on_eos_strict_and_valid(text, finish, why):
    from shardinfer.tasks.generate.structured import Judge

    valid, reason, parsed = Judge({"json": SCHEMA})(text, finish)
    assert not valid and reason.startswith(why) and parsed is None
    assert Judge({"json": SCHEMA})('{"label":"no","age":5}', "eos") == (True, None, {"label": "no", "age": 5})


def test_parsed_types_follow_the_schema():
    from shardinfer.tasks.generate.structured import Judge, parsed_type

    assert parsed_type(SCHEMA) == pa.struct([("label", pa.string()), ("age", pa.int64())])
    assert parsed_type({"type": "array", "items": {"type": ["number", "null"]}}) == pa.list_(pa.float64())
    free = {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}
    assert parsed_type(free) == pa.string() and Judge({"json": free})('{"a":1}', "eos")[2] == '{"a": 1}'
    big = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert Judge({"json": big})('{"n":99999999999999999999}', "eos")[1].startswith("does not fit")


def test_the_columns_follow_the_settings(lm):
    plain = Generate.output_fields(settings(lm))
    assert plain == {"generated": pa.string(), "n_prompt_tokens": pa.int32(), "n_generated_tokens": pa.int32(),
                     "finish_reason": pa.string()}  # as they always were
    many = Generate.output_fields(settings(lm, n=3, do_sample=True, logprobs=0, structured={"json": SCHEMA}))
    assert list(many) == [*plain, "logprobs", "parsed", "valid", "invalid_reason"]
    assert many["generated"] == pa.list_(pa.string()) and many["n_prompt_tokens"] == pa.int32()
    assert many["parsed"] == pa.list_(pa.struct([("label", pa.string()), ("age", pa.int64())]))
    assert "parsed" not in Generate.output_fields(settings(lm, structured={"regex": "a+"}))


def long_conversation() -> list[dict]:
    return conversations()[5]


def test_a_long_conversation_keeps_system_and_latest_whole_turns(task):
    from shardinfer.tasks.generate.prompts import Conversations

    chat = task("messages")
    renderer = Conversations(chat.tokenizer, 1000, None, "messages")
    messages = long_conversation()
    full = renderer.render(messages)
    assert renderer.fitted(messages) == (full, False)
    latest = renderer.render([messages[0], *messages[-3:]])  # system + the last two turns
    assert Conversations(chat.tokenizer, len(latest), None, "m").fitted(messages) == (latest, True)
    last = renderer.render([messages[0], messages[-1]])
    cut = Conversations(chat.tokenizer, len(last) - 2, None, "m").fitted(messages)[0]  # the last message cut left
    text = chat.tokenizer.decode(cut)
    assert len(cut) <= len(last) - 2 and text.startswith("<s><|system|>be brief<|end|><|user|>")
    assert "end<|end|>" in text
    tiny = Conversations(chat.tokenizer, 4, None, "m").fitted(messages)[0]
    assert tiny == [full[0], *full[-3:]]  # the system message alone is too long: the ids cut as a text's


def test_conversations_render_with_the_template_and_count_cuts(task):
    chat = task("messages", system_prompt="be kind")
    own = [{"role": "system", "content": "own"}, {"role": "user", "content": "hi"}]
    convs = [[{"role": "user", "content": "hi"}], own, long_conversation()]
    window = chat.prepare(0, pa.table({"messages": convs}))
    decode = chat.tokenizer.decode
    assert decode(window.data.ids[0]) == "<s><|system|>be kind<|end|><|user|>hi<|end|><|assistant|>"
    assert decode(window.data.ids[1]) == "<s><|system|>own<|end|><|user|>hi<|end|><|assistant|>"
    assert window.data.ids[1] == chat.tokenizer.apply_chat_template(own, add_generation_prompt=True, tokenize=True,
                                                                    return_dict=False)  # LLM.chat's ids
    assert window.truncated == [2] and len(window.data.ids[2]) <= MAX_LENGTH


@pytest.mark.parametrize("conversation,why", [
    ([], "the conversation is empty"),
    ([{"role": "user"}], "message 0 has no string or list content (missing)"),
    ([{"role": "user", "content": "a"}, {"content": "b"}], "message 1 has no string role (missing)"),
    ([{"role": "tool", "content": "a"}], "the chat template refuses it (unknown role tool)"),
])
def test_a_malformed_conversation_is_refused_naming_the_row(task, conversation, why):
    convs = [[{"role": "user", "content": "hi"}], conversation]
    with pytest.raises(UserError, match=re.escape(f"input.messages_column `messages`, row 11: {why} (1 such row")):
        task("messages").prepare(10, pa.table({"messages": convs}))


def test_a_malformed_conversation_is_a_row_error_with_record(lm):
    from shardinfer.settings.config import RowErrorSettings
    from shardinfer.shard.device_loop import RowErrors, predict_window, prepare_batches

    recording = dataclasses.replace(settings(lm, "messages"), row_errors=RowErrorSettings("record", 0.5))
    chat = Generate.load(LoadContext(recording, torch.device("cpu"), torch.float32))
    convs = [[{"role": "user", "content": w}] for w in WORDS[:5]]
    convs[3] = [{"role": "tool", "content": "x"}]
    errors = RowErrors(0, 2)
    with torch.inference_mode():
        window = chat.prepare(0, pa.table({"messages": convs}))
        engine = Transformers(chat)
        results = predict_window(engine, prepare_batches(engine, window, pa.table({}), BatchSettings(1000, 8, 64)),
                                 torch.device("cpu"), errors)
    assert list(errors.window) == [3] and "row 3: the chat template refuses it" in errors.window[3]
    assert len(results["completions"]) == 4


def test_rows_with_parameters_of_their_own_equal_each_row_alone(task):
    """What a per-row input (point 5's batch file) hands the engine: each row its own n, logprobs and
    constraint in one window gives what the row gets alone."""
    many = task(**SAMPLING, n=2, logprobs=1)
    base = many.params
    own = [dataclasses.replace(base, n=1 + i % 2, logprobs=None if i % 3 else 1,
                               structured={"choice": CHOICES} if i in (2, 5) else None) for i in range(len(TEXTS))]
    mixed = run_window(many, texts_table(), params=own).to_pylist()
    alone = [run_window(many, texts_table([text]), i, params=params).to_pylist()[0]
             for i, (text, params) in enumerate(zip(TEXTS, own))]
    assert [without_values(row) for row in mixed] == [without_values(row) for row in alone]
    values = [v for row in mixed for v in logprob_values(row)]
    assert len(values) > 20 and np.allclose(values, [v for row in alone for v in logprob_values(row)], atol=1e-4)
    assert [len(row["generated"]) for row in mixed] == [p.n for p in own]
    assert mixed[2]["generated"][0] in CHOICES and mixed[1]["logprobs"] == [None, None]  # asked none


def without_values(row: dict) -> dict:
    """A row with its log-probabilities' values left out (a batch of other rows rounds them otherwise)."""
    def tokens(sample):
        return None if sample is None else [(t["token_id"], [x["token_id"] for x in t["top_logprobs"]]) for t in sample]

    return {**row, "logprobs": None if row.get("logprobs") is None else [tokens(s) for s in row["logprobs"]]}


def logprob_values(row: dict) -> list[float]:
    return [value for sample in row.get("logprobs") or [] if sample for t in sample
            for value in (t["logprob"], *(x["logprob"] for x in t["top_logprobs"]))]


def test_plan_estimates_a_conversation_by_its_contents():
    from shardinfer.input.scan import CHARS_PER_MESSAGE, conversation_lengths

    convs = pa.array([[{"role": "user", "content": "abcd"}], None, [{"role": "system", "content": "xy"},
                                                                     {"role": "user", "content": "hello"}]])
    assert conversation_lengths(convs).tolist() == [4 + CHARS_PER_MESSAGE, 0, 7 + 2 * CHARS_PER_MESSAGE]
    assert conversation_lengths(convs.slice(2)).tolist() == [7 + 2 * CHARS_PER_MESSAGE]


def test_a_spec_xgrammar_refuses_is_refused_when_the_task_loads(lm):
    with pytest.raises(UserError, match=r"^generate.structured.regex: xgrammar cannot compile it") as refused:
        Generate.load(LoadContext(settings(lm, structured={"regex": "(?<=a)b"}), torch.device("cpu"), torch.float32))
    assert "\n" not in str(refused.value)


def test_log_probabilities_with_a_repetition_penalty_are_refused_on_transformers(lm, tmp_path):
    import shutil

    copy = tmp_path / "penalized"
    shutil.copytree(lm, copy)
    config = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 1.3}))
    with pytest.raises(UserError, match="generation_config sets repetition_penalty, which transformers applies before"):
        Generate.load(LoadContext(settings(copy, logprobs=0), torch.device("cpu"), torch.float32))
    assert RowParams.of(settings(copy)).logprobs is None



def test_a_configs_vocab_size_is_its_text_configs_as_transformers_finds_it(tmp_path):
    """One reading of a model folder's vocab_size (the batch file's logit_bias ids at the plan, the
    vLLM engine's prompt check): a composite model's text part before its own top-level value,
    as `get_text_config()` takes it; None without a config or a size."""
    from transformers import AutoConfig, LlavaConfig

    from shardinfer.core.model_folder import vocab_size as config_vocab_size

    composite = LlavaConfig(text_config={"model_type": "llama", "vocab_size": 321}).to_dict()
    (tmp_path / "config.json").write_text(json.dumps({**composite, "vocab_size": 999}))
    assert AutoConfig.from_pretrained(tmp_path).get_text_config().vocab_size == 321
    assert config_vocab_size(str(tmp_path)) == 321
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 77}))
    assert config_vocab_size(str(tmp_path)) == 77
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert config_vocab_size(str(tmp_path)) is None
    assert config_vocab_size(str(tmp_path / "absent")) is None
