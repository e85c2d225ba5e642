"""Contents in the shape the chat template takes (`shardinfer.tasks.generate.chat_content`), without an engine:
the content format by vLLM's rule (tests/chat_templates.py; vLLM's own detector is asked about the
same templates in tests/generation_probe.py), contents shaped as vLLM's `LLM.chat` shapes them, a
template that loops over parts rendering every turn (the tiny byte-level Llama with
tiny_models.PARTS_CHAT_TEMPLATE: the ids of its string template, of conversations given as strings
or as text parts), and a prompt that lost a message's text refused in one line naming the row."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
import torch

from chat_templates import TEMPLATES
from conftest import made_once
from generation_data import LONG_ROW, conversations
from shardinfer.core.errors import UserError
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.generate.chat_content import PARTS, STRING, content_format, lost_text, shaped
from shardinfer.tasks.generate.prompts import Conversations, text_prompts
from shardinfer.tasks.generate.task import Generate
from test_generation_units import settings
from tiny_models import build_tiny_bytes_lm, with_chat_template

# Detected "string" (no loop over a content), yet it reads a content as parts: a string's first
# character has no 'text', so every turn renders empty.
FIRST_PART_ONLY = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
                   "{{ message['content'][0]['text'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>"
                   "{% endif %}")


@pytest.fixture(scope="module")
def bytes_lm(tmp_path_factory):
    return made_once(tmp_path_factory, "bytes-lm", build_tiny_bytes_lm) / "tiny-bytes-lm"


@pytest.fixture(scope="module")
def tokenizers(bytes_lm, parts_lm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bytes_lm), AutoTokenizer.from_pretrained(parts_lm)


def as_parts(conversation: list[dict]) -> list[dict]:
    return [{**message, "content": [{"type": "text", "text": message["content"]}]} for message in conversation]


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_content_format_follows_vllms_rule(name):
    template, expected = TEMPLATES[name]
    assert content_format(template) == expected


def test_contents_are_shaped_as_llm_chat_shapes_them():
    parts = [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]
    tool = [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": parts},
                {"role": "tool", "content": tool}]
    assert shaped(messages, PARTS) == [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                       {"role": "user", "content": parts}, {"role": "tool", "content": "x\ny"}]
    assert shaped(messages, STRING) == [{"role": "user", "content": "hi"}, {"role": "user", "content": "<image>\na\nb"},
                                        {"role": "tool", "content": "x\ny"}]
    placed = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "see <image>"}]}]
    assert shaped(placed, STRING) == [{"role": "user", "content": "see <image>"}]  # the text holds its image token


def test_a_lost_text_is_told_and_a_trimmed_or_reasoned_one_is_not():
    messages = [{"role": "user", "content": "  hi there\n"},
                {"role": "assistant", "content": "<think>long</think>\nthe answer"}]
    assert lost_text(messages, "<user>hi there<assistant>the answer") is None  # `| trim`, reasoning dropped
    quoted = [{"role": "tool", "content": 'say "yes"\nnow'}]
    assert lost_text(quoted, '<tool>"say \\"yes\\"\\nnow"') is None  # `| tojson`
    assert lost_text(messages, "<user>hi there<assistant>") == (
        "the chat template rendered message 1's text (role assistant) nowhere in the prompt; refused rather than run "
        "without it")
    assert lost_text([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " "}]}], "") is None


def test_a_template_over_parts_renders_what_the_string_template_renders(tokenizers):
    """Conversations as strings or as text parts, with a system prompt, one far too long (cut by the
    documented rule): the parts template's ids are the string template's, turn for turn."""
    strings, parts = tokenizers
    own = [Conversations(strings, 48, "be kind", "m", STRING), Conversations(parts, 48, "be kind", "m", PARTS)]
    for conversation in conversations():
        expected = own[0].fitted(conversation)
        assert own[1].fitted(conversation) == expected and own[1].fitted(as_parts(conversation)) == expected
    assert own[1].fitted(conversations()[LONG_ROW])[1]  # cut, its last message's parts from the left
    two = [{"role": "user", "content": [{"type": "text", "text": "red "}, {"type": "text", "text": "cat"}]}]
    assert parts.decode(own[1].fitted(two)[0]) == "<s><|system|>be kind<|end|><|user|>red cat<|end|><|assistant|>"
    assert strings.decode(own[0].fitted(two)[0]).startswith("<s><|system|>be kind<|end|><|user|>red \ncat<|end|>")
    texts = pa.array(["the cat sat", "happy"])
    assert text_prompts(parts, texts, False, True, "be kind", PARTS) == text_prompts(strings, texts, False, True,
                                                                                      "be kind", STRING)


@pytest.fixture(scope="module")
def losing_lm(bytes_lm, tmp_path_factory):
    return with_chat_template(bytes_lm, tmp_path_factory.mktemp("losing") / "lm", FIRST_PART_ONLY)


@pytest.mark.parametrize("column,key", [("messages", "input.messages_column `messages`"),
                                        (None, "input.text_column `text`")])
def test_a_prompt_that_lost_a_turns_text_is_refused_naming_the_row(losing_lm, column, key):
    task = Generate.load(LoadContext(settings(losing_lm, column, chat_template=column is None), torch.device("cpu"),
                                     torch.float32))
    assert task.form == STRING
    rows = [[{"role": "user", "content": "the cat"}]] * 2 if column else ["the cat"] * 2
    why = "the chat template rendered message 0's text (role user) nowhere in the prompt"
    with pytest.raises(UserError, match=re.escape(f"{key}, row 8: {why}; refused rather than run without it (2 such")):
        task.prepare(7 + 1, pa.table({column or "text": rows}))


def test_a_conversation_of_text_parts_runs_and_an_image_part_without_images_is_refused(parts_lm):
    task = Generate.load(LoadContext(settings(parts_lm, "messages"), torch.device("cpu"), torch.float32))
    assert task.form == PARTS
    rows = [[{"role": "user", "content": [{"type": "text", "text": "red"}, {"type": "text", "text": " cat"}]}],
            [{"role": "user", "content": [{"type": "image"}]}]]
    with pytest.raises(UserError, match=re.escape("input.messages_column `messages`, row 1: message 0 has a content "
                                                  "part that is not {type: text, text} (an image part needs "
                                                  "input.image_column) (1 such")):
        task.prepare(0, pa.table({"messages": rows}))
    window = task.prepare(0, pa.table({"messages": rows[:1]}))
    assert task.tokenizer.decode(window.data.ids[0]) == "<s><|user|>red cat<|end|><|assistant|>"
