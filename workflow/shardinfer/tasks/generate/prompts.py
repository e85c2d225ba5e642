"""Prompts as both engines get them: token ids, made here once, from a text or a conversation.

- **A text** (`input.text_column`) is tokenized as it is, or wrapped as a user message (after an
  optional system message) in the tokenizer's chat template (`generate.chat_template`). A prompt
  longer than max_length loses its beginning (a leading BOS kept), as before.
- **A conversation** (`input.messages_column`: a list of {role, content} per row, a content a
  string or a list of text parts) is checked, then rendered with the chat template and its
  generation prompt, every content in the shape the template takes (`chat_content`: a string, or
  parts, as vLLM's `LLM.chat` detects and passes them), so the ids are those `LLM.chat` would make:
  we render for both engines. `generate.system_prompt`, when set, goes first unless the
  conversation has a system message of its own. A malformed conversation (not a non-empty list, a
  message without a string role or a content, a part that is not text, a role the template
  refuses) and a rendered prompt that lost a message's text (`chat_content.lost_text`) are refused
  naming the row: the shard fails, or with row_errors: record the row is an error.
- **A conversation longer than max_length** keeps, predictably: (1) everything, when it fits; else
  (2) its leading system message(s) and its latest whole turns that fit (a turn: a user message
  and the replies after it), dropping the oldest first; else (3) the system message(s) and the last
  turn with the last message's content (its texts, in order) cut from the left, at a character, so
  that its end (the question) stays; else (4) the rendered ids cut from the left like a text. (2)-(4) count the row
  as truncated.
- **Checked before any engine sees them** (`prompt_problem`), the same for both engines: a token
  id the model cannot embed (outside its config's vocab_size: a tokenizer with added tokens and an
  embedding never resized; vLLM would read a padding row, transformers would raise), and a prompt
  whose tokens plus the row's max_new_tokens exceed max_length + model.max_new_tokens (possible
  only where a row asks for more new tokens than the config). Such a row is refused naming it.
  An empty prompt is not refused: both engines run it as the pad token alone.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.hf.tokens import TokenWindow, outside_vocabulary
from shardinfer.input.scan import text_values
from shardinfer.tasks.generate.chat_content import STRING, lost_text, shaped, texts_of


def prompt_token_ids(tokenizer, prompts: list[str], max_length: int, chat_template: bool
                     ) -> tuple[list[list[int]], list[int]]:
    """Token ids per prompt, cut from the left to max_length (a leading BOS kept), and the cut
    positions: what both engines are given."""
    special = not chat_template  # a chat template writes its own special tokens
    ids = tokenizer(prompts, add_special_tokens=special, truncation=False, verbose=False)["input_ids"]
    truncated = [i for i, row in enumerate(ids) if len(row) > max_length]
    for i in truncated:
        ids[i] = cut_left(tokenizer, ids[i], max_length)
    return ids, truncated


def prompt_problem(ids: list[int], max_new_tokens: int, max_model_len: int, vocab_size: int | None) -> str | None:
    """Why a prompt cannot go to an engine, or None: a token id the model has no embedding for, or
    too many tokens with the new ones (`max_model_len`: max_length + model.max_new_tokens)."""
    outside = outside_vocabulary(ids, vocab_size, "prompt position")
    if outside:
        return outside
    length = max(len(ids), 1)  # an empty prompt runs as the pad token alone
    if length + max_new_tokens > max_model_len:
        return (f"its {length} prompt tokens + max_new_tokens {max_new_tokens} exceed {max_model_len} "
                "(model.max_length + model.max_new_tokens)")
    return None


def cut_left(tokenizer, ids: list[int], max_length: int) -> list[int]:
    """The last max_length ids, a leading BOS kept in front."""
    bos = tokenizer.bos_token_id
    keep = 1 if bos is not None and ids and ids[0] == bos and max_length > 1 else 0
    return ids[:keep] + ids[len(ids) - (max_length - keep):]


class Refused(Exception):
    """A conversation the template cannot take, and why."""


def conversation_of(messages: Any, images: bool = False) -> list[dict]:
    """The conversation as the template may get it (unset keys dropped, a Parquet struct's absent
    fields), each content a string or a list of parts: {type: text, text} and, where the row's images
    come from (`images`), {type: image}; raises Refused naming what is malformed."""
    if not isinstance(messages, list) or not messages:
        raise Refused("the conversation is empty" if isinstance(messages, list) else "the conversation is null")
    cleaned = []
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            raise Refused(f"message {k} is not a {{role, content}} object")
        message = {key: value for key, value in message.items() if value is not None}
        if not isinstance(message.get("role"), str):
            raise Refused(f"message {k} has no string role ({held(message.get('role'))})")
        content = message.get("content")
        if isinstance(content, list):
            message["content"] = [part_of(part, k, images) for part in content]
        elif not isinstance(content, str):
            raise Refused(f"message {k} has no string or list content ({held(content)})")
        cleaned.append(message)
    return cleaned


def held(value: Any) -> str:
    return "missing" if value is None else f"a {type(value).__name__}"


def part_of(part: Any, k: int, images: bool) -> dict:
    """A content part, its unset keys dropped; Refused unless a text part (or an image part, with images)."""
    part = {key: value for key, value in part.items() if value is not None} if isinstance(part, dict) else {}
    if part.get("type") == "text" and isinstance(part.get("text"), str) or images and part.get("type") == "image":
        return part
    allowed = ("neither {type: text, text} nor {type: image}" if images
               else "not {type: text, text} (an image part needs input.image_column)")
    raise Refused(f"message {k} has a content part that is {allowed}")


def with_system(messages: list[dict], system: str | None) -> list[dict]:
    """The conversation's messages, `system` first unless it opens with a system message."""
    if system and messages[0]["role"] != "system":
        return [{"role": "system", "content": system}, *messages]
    return messages


def cut_from_left(content: Any, start: int) -> Any:
    """A content without its first `start` characters of text (parts: across their texts, in order)."""
    if isinstance(content, str):
        return content[start:]
    kept = []
    for part in content:
        if part.get("type") == "text":
            part, start = {**part, "text": part["text"][start:]}, max(start - len(part["text"]), 0)
        kept.append(part)
    return kept


def turns(messages: list[dict]) -> tuple[list[dict], list[list[dict]]]:
    """(the leading system messages, the turns after them): a turn opens at a user message."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    groups: list[list[dict]] = []
    for message in messages[head:]:
        if message["role"] == "user" or not groups:
            groups.append([])
        groups[-1].append(message)
    return messages[:head], groups


class Conversations:
    """Renders a window's conversations with the chat template, each fitted to max_length."""

    def __init__(self, tokenizer, max_length: int, system: str | None, column: str, form: str = STRING) -> None:
        """`column`: where the conversations come from, as errors name it (`input.messages_column `m``);
        `form`: the template's content format (`chat_content`)."""
        self.tokenizer, self.max_length, self.system, self.column = tokenizer, max_length, system, column
        self.form = form

    def render(self, messages: list[dict]) -> list[int]:
        """The template's text, its contents shaped as `LLM.chat` shapes them, tokenized without
        special tokens (the template writes its own): the ids of vLLM's `LLM.chat`, without the
        tokenizer's warning that a text exceeds its length (the rule below cuts it). Refused: a
        prompt that lost a message's text (`chat_content.lost_text`)."""
        text = self.tokenizer.apply_chat_template(shaped(messages, self.form), add_generation_prompt=True,
                                                  tokenize=False)
        lost = lost_text(messages, text)
        if lost:
            raise Refused(lost)
        return self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]

    def window(self, first: int, values: pa.Array) -> tuple[TokenWindow, dict[int, str]]:
        """Token ids per row, the truncated rows, and the refused ones (position -> why)."""
        ids, truncated, refused = [], [], {}
        for position, messages in enumerate(values.to_pylist()):
            try:
                row, cut = self.fitted(messages)
            except Refused as why:
                row, cut = [], False
                refused[position] = f"{self.column}, row {first + position}: {why}"
            ids.append(row)
            if cut:
                truncated.append(position)
        return TokenWindow(first, ids, truncated), refused

    def fitted(self, messages: Any) -> tuple[list[int], bool]:
        """(ids, whether cut) by the rule in this module's docstring; raises Refused."""
        from jinja2 import TemplateError

        messages = with_system(conversation_of(messages), self.system)
        try:
            ids = self.render(messages)
        except (TemplateError, ValueError, TypeError, KeyError) as error:
            why = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise Refused(f"the chat template refuses it ({why})") from None
        if len(ids) <= self.max_length:
            return ids, False
        return self.shortened(messages, ids), True

    def shortened(self, messages: list[dict], ids: list[int]) -> list[int]:
        system, groups = turns(messages)
        while len(groups) > 1:
            groups = groups[1:]
            ids = self.render(system + [m for group in groups for m in group])
            if len(ids) <= self.max_length:
                return ids
        kept = system + [m for group in groups for m in group]
        last = kept[-1]["content"]
        chars = sum(map(len, texts_of(last)))

        def cut_at(start: int) -> list[int]:
            return self.render([*kept[:-1], {**kept[-1], "content": cut_from_left(last, start)}])

        if len(cut_at(chars)) > self.max_length:  # the rest alone is too long: cut the ids
            return cut_left(self.tokenizer, ids, self.max_length)
        low, high = 0, chars  # the smallest start that fits
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if len(cut_at(middle)) <= self.max_length else (middle + 1, high)
        ids = cut_at(low)
        return ids if len(ids) <= self.max_length else cut_left(self.tokenizer, ids, self.max_length)


def text_prompts(tokenizer, values: pa.Array, null_as_empty: bool, chat_template: bool, system: str | None,
                 form: str = STRING) -> tuple[list[str], dict[int, str]]:
    """A window's texts as prompts: as they are, or each a user message in the chat template (its
    contents shaped as `form` takes them); and the rows whose text the template lost (position -> why)."""
    texts = text_values(values, null_as_empty)
    if not chat_template:
        return texts, {}
    head = [{"role": "system", "content": system}] if system else []
    prompts, lost = [], {}
    for position, text in enumerate(texts):
        messages = [*head, {"role": "user", "content": text}]
        prompts.append(tokenizer.apply_chat_template(shaped(messages, form), tokenize=False,
                                                     add_generation_prompt=True))
        why = lost_text(messages, prompts[-1])
        if why:
            lost[position] = why
    return prompts, lost


def refuse_without_template(tokenizer, model_path: str, why: str) -> None:
    """A chat template is needed (`why`) and the tokenizer has none: refused at load, in one line."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"model.path `{model_path}`: its tokenizer has no chat template, which {why} needs "
                        "(tokenizer_config.json's chat_template or chat_template.jinja)")
