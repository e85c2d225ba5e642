"""Task generate on a tiny Llama, driven the way the shard runner drives it (prepare, length-sorted
batches, the device loop, to_arrow): greedy equals `model.generate` on each text alone whatever the
batching; sampling is reproducible per row; the Gumbel sampler is exact; finish reasons, left
truncation, and the refusal of a model that cannot generate."""

import random
import re

import numpy as np
import pyarrow as pa
import pytest
import torch

from factory import WORDS, bert_config, save_tokenizer, settings_for
from shardinfer.core.errors import UserError
from shardinfer.engines.base import Engine
from shardinfer.engines.transformers import Transformers
from shardinfer.settings.config import BatchSettings, ModelSettings, Settings
from shardinfer.shard.device_loop import predict_window, prepare_batches
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.generate.sampling import GumbelSampler
from shardinfer.tasks.generate.task import Generate

MAX_LENGTH, NEW_TOKENS = 24, 10
SAMPLING = {"do_sample": True, "temperature": 1.3, "top_p": 0.95, "seed": 7}


@pytest.fixture(scope="module")
def lm(causal_lm):
    return causal_lm()


def settings(path, max_rows=4, **options) -> Settings:
    model = ModelSettings(path=str(path), adapter=None, task="generate", max_length=MAX_LENGTH, dtype="float32",
                          trust_remote_code=False, allow_pickle=False, max_new_tokens=NEW_TOKENS)
    return settings_for(model, batch=BatchSettings(1000, max_rows, 64), task_settings=options)


@pytest.fixture(scope="module")
def task(lm):
    """`task(**options)`: the loaded task for those `generate:` options, loaded once."""
    cache = {}

    def loaded(**options) -> Generate:
        key = tuple(sorted((k, str(v)) for k, v in options.items()))
        if key not in cache:
            cache[key] = Generate.load(LoadContext(settings(lm, **options), torch.device("cpu"), torch.float32))
        return cache[key]

    return loaded


def prompts() -> list[str]:
    """12 prompts of 1 to 22 words, and two longer than max_length (cut from the left)."""
    rng = random.Random(3)
    return [" ".join(rng.choice(WORDS) for _ in range(n)) for n in (1, 2, 3, 5, 8, 13, 22, 4, 40, 6, 30, 11)]


def run(runner: Generate | Engine, texts: list[str], max_rows: int, first: int = 0, params=None) -> list[tuple]:
    """Rows through the task as a shard job runs them: one window, length-sorted batches; every row
    with the task's parameters, or `params` (a RowParams) as a per-row input would give them.
    `runner`: the task, on the transformers engine, or an engine (vLLM's)."""
    import dataclasses

    engine = runner if isinstance(runner, Engine) else Transformers(runner)
    task = engine.task
    with torch.inference_mode():
        window = task.prepare(first, pa.table({"text": texts}))
        if params is not None:
            window = dataclasses.replace(window, data=dataclasses.replace(window.data, params=[params] * window.rows))
        prepared = prepare_batches(engine, window, pa.table({}), BatchSettings(10_000, max_rows, 64))
        results = predict_window(engine, prepared, torch.device("cpu"))
        columns = task.to_arrow(results, np.arange(first, first + len(texts)))
    return list(zip(*(column.to_pylist() for column in columns)))


@pytest.fixture(scope="module")
def reference(lm):
    """`reference(text)`: transformers' `model.generate` on one text alone (its prompt cut as documented:
    BOS and the end), decoded without special tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(lm)
    model = AutoModelForCausalLM.from_pretrained(lm).eval()

    def generate(text: str) -> tuple:
        ids = tokenizer(text)["input_ids"]
        if len(ids) > MAX_LENGTH:
            ids = ids[:1] + ids[-(MAX_LENGTH - 1):]
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        new = out[0, len(ids):].tolist()
        finish = "eos" if new[-1] == tokenizer.eos_token_id else "length"
        return tokenizer.decode(new, skip_special_tokens=True), len(ids), len(new), finish

    return generate


def test_greedy_is_model_generate_alone_whatever_the_batch(task, reference):
    texts, before = prompts(), task().generated_tokens
    rows = run(task(), texts, max_rows=4)
    assert rows == [reference(text) for text in texts]
    assert run(task(), texts, max_rows=1) == rows == run(task(), texts, max_rows=12)
    assert {finish for *_, finish in rows} == {"eos", "length"}  # both occur in this set
    assert task().finish()["generated_tokens"] - before == 3 * sum(row[2] for row in rows)


def test_sampling_depends_on_prompt_seed_and_index_only(task):
    texts = prompts()
    rows = run(task(**SAMPLING), texts, max_rows=12)
    assert run(task(**SAMPLING), texts, max_rows=5) == rows
    assert run(task(**SAMPLING), texts[:6], max_rows=1) + run(task(**SAMPLING), texts[6:], 3, first=6) == rows
    assert rows != run(task(), texts, max_rows=12)  # greedy
    assert rows != run(task(**{**SAMPLING, "seed": 8}), texts, max_rows=12)
    same = run(task(**SAMPLING), [texts[2]] * 12, max_rows=12)
    assert len({text for text, *_ in same}) > 6  # one prompt, twelve indices, twelve streams


def draws(logits: list[float], rows: int, step: int, seed=0, **options) -> np.ndarray:
    """The sampler's choice for `rows` global indices at one step, on fixed logits."""
    width = 5
    sampler = GumbelSampler(seed, torch.arange(rows), width, **options)
    scores = torch.tensor(logits).repeat(rows, 1)
    return sampler(torch.zeros(rows, width + step, dtype=torch.long), scores).argmax(dim=1).numpy()


def frequencies(choices: np.ndarray, size: int) -> np.ndarray:
    return np.bincount(choices, minlength=size) / len(choices)


def test_gumbel_max_is_an_exact_sampler():
    logits, rows = [2.0, 1.0, 0.5, 0.0, -1.0, -3.0], 40_000  # frequencies within ~0.0025 (1 sd)
    want = torch.softmax(torch.tensor(logits), 0).numpy()
    first, second = draws(logits, rows, step=1), draws(logits, rows, step=2)
    for choices in (first, second, draws(logits, rows, step=1, seed=5)):
        assert np.abs(frequencies(choices, 6) - want).max() < 0.01
    joint = np.bincount(first * 6 + second, minlength=36).reshape(6, 6) / rows  # steps independent
    assert np.abs(joint - np.outer(want, want)).max() < 0.01
    hot = torch.softmax(torch.tensor(logits) / 2.0, 0).numpy()
    assert np.abs(frequencies(draws(logits, rows, 1, temperature=2.0), 6) - hot).max() < 0.01


def test_top_p_keeps_the_nucleus_only():
    logits, rows = [2.0, 1.0, 0.5, 0.0, -1.0, -3.0], 40_000
    probs = torch.softmax(torch.tensor(logits), 0).numpy()  # 0.52, 0.19, 0.12, 0.07, ...: 3 reach 0.8
    nucleus = np.where(np.arange(6) < 3, probs, 0.0) / probs[:3].sum()
    got = frequencies(draws(logits, rows, step=1, top_p=0.8), 6)
    assert got[3:].sum() == 0
    assert np.abs(got - nucleus).max() < 0.01


def stop_candidate(greedy: list[tuple]) -> tuple[int, str]:
    """A row whose first generated tokens are all words (no special token) and whose third word is a
    stop string that nothing before it contains and that begins no other word."""
    for row, (text, _, generated, finish) in enumerate(greedy):
        words = text.split()
        if len(words) < 4 or len(words) != generated - (finish == "eos"):
            continue
        word = words[2]
        if word not in " ".join(words[:2]) and not any(w != word and w.startswith(word) for w in WORDS):
            return row, word
    raise AssertionError("no greedy row fits a stop-string case")


def test_stop_string_ends_a_row_before_it(task):
    texts = prompts()
    greedy = run(task(), texts, max_rows=12)
    row, word = stop_candidate(greedy)
    stopped = run(task(stop=[word]), texts, max_rows=4)
    text, prompt_tokens, generated, finish = stopped[row]
    assert (finish, generated, prompt_tokens) == ("stop", 3, greedy[row][1])
    assert text == " ".join(greedy[row][0].split()[:2]) + " "  # cut before the stop string
    assert all(word not in text for text, *_, finish in stopped if finish == "stop")


def test_long_prompt_keeps_its_end(task):
    words = [WORDS[i % 20] for i in range(40)]
    window = task().prepare(100, pa.table({"text": ["red cat", " ".join(words)]}))
    vocab = task().tokenizer.get_vocab()
    assert window.data.ids[1] == [vocab["<s>"], *(vocab[w] for w in words[-(MAX_LENGTH - 1):])]
    assert window.truncated == [1]
    assert window.lengths.tolist() == [3, MAX_LENGTH]
    assert window.costs.tolist() == [3 + NEW_TOKENS, MAX_LENGTH + NEW_TOKENS]


def test_chat_template_with_system_prompt(task):
    chat = task(chat_template=True, system_prompt="think fast")
    ids = chat.prepare(0, pa.table({"text": ["red cat"]})).data.ids[0]
    vocab = chat.tokenizer.get_vocab()
    assert ids == [vocab[t] for t in ("<|system|>", "think", "fast", "<|user|>", "red", "cat", "<|assistant|>")]
    assert run(chat, ["red cat"], max_rows=1)[0][1] == len(ids)


@pytest.mark.parametrize("kind", ["BertModel", "BertForMaskedLM"])
def test_encoder_is_refused_in_one_line(tmp_path, kind):
    import transformers

    path = tmp_path / kind
    getattr(transformers, kind)(bert_config()).save_pretrained(path)
    save_tokenizer(path)
    refusal = f"^model.path `{re.escape(str(path))}` cannot generate text for task generate: "
    with pytest.raises(UserError, match=refusal) as refused:
        Generate.load(LoadContext(settings(path), torch.device("cpu"), torch.float32))
    assert "\n" not in str(refused.value) and kind in str(refused.value)


def generate_config(data, lm, shards: int, max_rows: int, **options) -> dict:
    return {"input": {"path": str(data), "keep_columns": ["id"]},
            "model": {"path": str(lm), "task": "generate", "max_length": MAX_LENGTH, "max_new_tokens": NEW_TOKENS},
            "generate": options, "batch": {"max_tokens": 4096, "max_rows": max_rows, "sort_window": 16},
            "shards": shards}


@pytest.fixture(scope="module")
def workflow_runs(lm, tmp_path_factory):
    """Real `snakemake` runs over 40 prompts: greedy with 1 shard (batches of 16) and 2 shards
    (batches of 3), sampled with 2 shards (batches of 3)."""
    import pandas as pd

    from factory import read_predictions, run_workflows_ok

    root = tmp_path_factory.mktemp("generate-runs")
    rng = random.Random(11)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) for _ in range(40)]
    data = root / "prompts.parquet"
    pd.DataFrame({"id": [f"p{i}" for i in range(40)], "text": texts}).to_parquet(data, index=False)
    planned = {(name, shards): (root / f"{name}-{shards}", generate_config(data, lm, shards, max_rows, **options))
               for name, options, shards, max_rows in (("greedy", {}, 1, 16), ("greedy", {}, 2, 3),
                                                       ("sampled", SAMPLING, 2, 3))}
    run_workflows_ok(list(planned.values()))  # all at once
    return texts, {key: read_predictions(workdir) for key, (workdir, _) in planned.items()}


@pytest.mark.e2e
def test_generate_through_the_workflow_equals_one_shard_and_the_model_alone(workflow_runs, reference):
    texts, frames = workflow_runs
    one, two = frames["greedy", 1], frames["greedy", 2]
    assert one["index"].tolist() == list(range(40)) and one["id"].tolist() == [f"p{i}" for i in range(40)]
    assert one.equals(two)
    got = list(one[["generated", "n_prompt_tokens", "n_generated_tokens", "finish_reason"]].itertuples(index=False))
    assert [tuple(row) for row in got] == [reference(text) for text in texts]


@pytest.mark.e2e
def test_sampling_through_the_workflow_is_the_same_for_any_shards_and_batches(workflow_runs, task):
    """2 shards with batches of 3 through `snakemake` against all rows as one window in batches of 16."""
    texts, frames = workflow_runs
    sampled = frames["sampled", 2]
    columns = ["generated", "n_prompt_tokens", "n_generated_tokens", "finish_reason"]
    assert [tuple(row) for row in sampled[columns].itertuples(index=False)] == run(task(**SAMPLING), texts, 16)
    assert not sampled["generated"].equals(frames["greedy", 1]["generated"])


def test_a_lora_adapter_is_applied_as_peft_applies_it(lm, tmp_path):
    """A LoRA on the causal LM (init_lora_weights=False, so it changes the output) gives what
    peft's own PeftModel generates, text by text."""
    import dataclasses

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(2)
    base = AutoModelForCausalLM.from_pretrained(lm)
    lora = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=16, init_lora_weights=False,
                                           target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(tmp_path / "lora")
    adapted = settings(lm)
    adapted = dataclasses.replace(adapted, model=dataclasses.replace(adapted.model, adapter=str(tmp_path / "lora")))
    task = Generate.load(LoadContext(adapted, torch.device("cpu"), torch.float32))
    texts = prompts()[:6]
    got = run(task, texts, max_rows=3)
    tokenizer = AutoTokenizer.from_pretrained(lm)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lm), tmp_path / "lora").eval()
    plain = run(Generate.load(LoadContext(settings(lm), torch.device("cpu"), torch.float32)), texts, max_rows=3)
    for text, row in zip(texts, got):
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.inference_mode():
            out = peft_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                      do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=tokenizer.eos_token_id)
        assert row[0] == tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    assert got != plain  # the adapter changed the generations


def test_beams_in_the_models_generation_config_still_give_one_greedy_row_per_prompt(lm, reference):
    beamy = Generate.load(LoadContext(settings(lm), torch.device("cpu"), torch.float32))
    beamy.model.generation_config.num_beams = 3
    beamy.model.generation_config.num_return_sequences = 2
    texts = prompts()[:5]
    assert run(beamy, texts, max_rows=4) == [reference(text) for text in texts]
