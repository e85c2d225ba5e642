"""Prompts checked before any engine sees them (`generate_prompts.prompt_problem`), the same for
both engines: a token id the model cannot embed, a prompt that does not fit max_model_len with
its new tokens. Here the transformers engine, which raised a raw IndexError on such a token; vLLM's
runs are in tests/test_vllm.py (the same `Generate.prepare`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
import torch

from shardinfer.core.errors import UserError
from shardinfer.engines.transformers import Transformers
from shardinfer.settings.config import BatchSettings, RowErrorSettings
from shardinfer.shard.device_loop import RowErrors, predict_window, prepare_batches
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.generate.prompts import prompt_problem
from shardinfer.tasks.generate.task import Generate
from test_generate import settings
from tiny_models import with_unknown_tokens

TEXTS = ["red cat", "blue bird fly", "zebra bird", "green fish", "the yak", "dog run"]


@pytest.mark.parametrize("ids,new,says", [
    ([2, 5, 9], 4, None),
    ([], 4, None),  # runs as the pad token alone, on both engines
    ([2, 63, 5], 4, "token id 63 (prompt position 1) is outside the model's vocabulary (its config's vocab_size 63"),
    ([2, -1], 4, "token id -1 (prompt position 1)"),
    ([2] * 24, 10, None),  # max_length 24 + 10 new tokens: fits exactly
    ([2] * 24, 11, "its 24 prompt tokens + max_new_tokens 11 exceed 34 (model.max_length + model.max_new_tokens)"),
])
def test_prompt_problem(ids, new, says):
    problem = prompt_problem(ids, new, 34, 63)
    assert problem is None if says is None else problem.startswith(says)


@pytest.fixture(scope="module")
def models(causal_lm, tmp_path_factory):
    lm = causal_lm()
    return lm, with_unknown_tokens(lm, tmp_path_factory.mktemp("prompt-checks"))


def loaded(path, record: bool) -> Generate:
    chosen = dataclasses.replace(settings(path), row_errors=RowErrorSettings("record" if record else "fail", 0.5))
    return Generate.load(LoadContext(chosen, torch.device("cpu"), torch.float32))


def test_a_token_the_model_cannot_embed_fails_the_shard_in_one_line_naming_row_and_token(models):
    task = loaded(models[1], record=False)
    with pytest.raises(UserError) as error:
        task.prepare(10, pa.table({"text": TEXTS}))
    assert str(error.value) == ("row 12: token id 63 (prompt position 1) is outside the model's vocabulary (its "
                                "config's vocab_size 63: ids 0..62); the tokenizer knows tokens the model cannot "
                                "embed (2 such row(s) in this window; fix the input, or set row_errors.mode: record "
                                "to write them as row errors)")


def test_with_record_such_rows_are_errors_and_the_others_the_models_own(models):
    """The rows that hold "zebra" (id 63) or "yak" (64) are recorded; the others equal the same
    prompts on the model whose tokenizer lacks those words."""
    task, plain = loaded(models[1], record=True), loaded(models[0], record=False)
    errors = RowErrors(0, 10)
    with torch.inference_mode():
        window = task.prepare(10, pa.table({"text": TEXTS}))
        engine = Transformers(task)
        results = predict_window(engine, prepare_batches(engine, window, pa.table({}), BatchSettings(1000, 4, 64)),
                                 torch.device("cpu"), errors)
        good = [0, 1, 3, 5]
        rows = list(zip(*(c.to_pylist() for c in task.to_arrow(results, np.array(good) + 10))))
        reference = plain.prepare(0, pa.table({"text": [TEXTS[p] for p in good]}))
        engine = Transformers(plain)
        expected = predict_window(engine, prepare_batches(engine, reference, pa.table({}), BatchSettings(1000, 4, 64)),
                                  torch.device("cpu"))
        expected = list(zip(*(c.to_pylist() for c in plain.to_arrow(expected, np.arange(4)))))
    assert sorted(errors.window) == [2, 4] and errors.first_rows == [12, 14]
    assert errors.window[2].startswith("RowError: row 12: token id 63 (prompt position 1) is outside")
    assert errors.window[4].startswith("RowError: row 14: token id 64 (prompt position 2) is outside")
    assert rows == expected


def test_a_row_asking_more_new_tokens_than_fit_is_refused(models):
    """A row's own max_new_tokens (a per-row input) beyond max_length + model.max_new_tokens."""
    task = loaded(models[0], record=True)
    params = [task.params, dataclasses.replace(task.params, max_new_tokens=task.max_model_len)]
    found = task.refused_prompts(5, [[2, 5], [2, 5]], params, {})
    assert found == {1: f"row 6: its 2 prompt tokens + max_new_tokens {task.max_model_len} exceed "
                        f"{task.max_model_len} (model.max_length + model.max_new_tokens)"}
