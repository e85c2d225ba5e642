"""What the generation settings refuse together when the Snakefile loads (each in one line naming
the key), and the plan's reading of a conversation column."""

import dataclasses
import json

import pytest

from conftest import made_once
from shardinfer.core.errors import UserError
from tiny_models import build_tiny_bytes_lm

MAX_LENGTH = 48


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return made_once(tmp_path_factory, "bytes-lm", build_tiny_bytes_lm) / "tiny-bytes-lm"


def checked(tmp_path, lm, section: dict, **config):
    """A config through the Snakefile's checks: schema defaults, settings, the checks of each input."""
    from snakemake.utils import validate

    from shardinfer.settings.schema import SCHEMA_PATH
    from shardinfer.snakefile.checks import check_inputs
    from shardinfer.snakefile.configure import settings_by_input

    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"id": "a", "text": "hi", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    inp = {"path": str(data), "messages_column": "messages", "keep_columns": ["id"], **config.pop("input", {})}
    full = {"input": inp, "model": {"path": str(lm), "task": "generate", "max_length": MAX_LENGTH, "max_new_tokens": 8},
            "generate": section, **config}
    validate(full, str(SCHEMA_PATH))
    by_name = settings_by_input(full, auto_shards=1)
    check_inputs(by_name)
    return by_name[None]


@pytest.mark.parametrize("section,config,says", [
    ({"n": 2}, {}, "^generate.n 2 needs generate.do_sample: true"),
    ({"n": 2, "do_sample": True}, {"evaluate": {"label_column": "id"}}, "^evaluate compares one generated text"),
    ({}, {"input": {"text_column": "text"}}, None),
    ({}, {"input": {"text_column": "body"}}, "^input.messages_column `messages` and input.text_column `body` both"),
    ({"structured": {"choice": ["a"]}}, {"input": {"keep_columns": ["valid"]}}, "^input.keep_columns: `valid` clashes"),
])
def test_what_the_settings_refuse_together_in_one_line(tmp_path, lm, section, config, says):
    if says is None:
        assert checked(tmp_path, lm, section, **config).input.conversation_columns == ("messages",)
        return
    with pytest.raises(UserError, match=says) as refused:
        checked(tmp_path, lm, section, **config)
    assert "\n" not in str(refused.value)


def test_a_messages_column_is_for_task_generate(tmp_path, lm):
    with pytest.raises(UserError, match="^input.messages_column is for task generate; task classify reads"):
        checked(tmp_path, lm, {}, model={"path": str(lm), "task": "classify"})


def test_the_plan_refuses_a_column_without_conversations(tmp_path, lm):
    from shardinfer.plan.plan_file import make_plan

    inp = checked(tmp_path, lm, {}).input
    with pytest.raises(UserError, match=r"^input.messages_column `text` holds string in .*, not conversations"):
        make_plan(dataclasses.replace(inp, task_columns=("text",), conversation_columns=("text",)), 1, MAX_LENGTH)
    from shardinfer.input.scan import CHARS_PER_MESSAGE

    assert make_plan(inp, 1, MAX_LENGTH).costs == (-(-(2 + CHARS_PER_MESSAGE) // 4) + 2,)  # "hi" and one message


def test_generate_n_makes_a_new_plan(tmp_path, lm):
    """The plan balances max_new_tokens x n per row (the plan rule's `overhead` param): another n is
    another plan, as docs/configuration.md's "What reruns what" says."""
    from shardinfer.tasks import task_class

    overhead = task_class("generate").cost.overhead
    assert overhead(checked(tmp_path, lm, {})) == 8
    assert overhead(checked(tmp_path, lm, {"n": 2, "do_sample": True})) == 16
