"""Message contents in the shape a chat template takes, as vLLM's `LLM.chat` gives them: the prompts
of both engines are the ids `LLM.chat` would make, for every template.

- **The content format**: a template that loops over a message's content (`{% for part in
  message['content'] %}`, SmolVLM's and Idefics3's) takes content as a list of parts ("openai"),
  any other a string ("string"). vLLM reads it from the template's syntax tree
  (`vllm.renderers.hf._detect_content_format`); the vLLM engine asks vLLM itself, the transformers
  engine `content_format` here: the same rule over the same tree (transformers' Jinja
  environment), without torch or vLLM, kept equal to vLLM's by tests/test_chat_content.py.
- **The shape** (`shaped`), as vLLM's `parse_chat_messages`: under "openai" a string becomes one
  text part, parts stay parts (a tool message of text parts alone: their texts joined by a line
  break); under "string" parts become their texts joined by a line break, each image part the
  image token, those the text does not hold already in front.
- **A turn's text lost** (`lost_text`): a rendered prompt that holds no trace of a message's text
  (its text after a last `</think>`, which reasoning models' templates keep alone, stripped, as
  `| trim` leaves it; or that as `| tojson` writes it, as Llama 3.1's does a tool's answer) is
  refused for its row: a template that drops text silently (a shape it does not take) would
  otherwise run prompts of empty turns.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from typing import Any

STRING, PARTS = "string", "openai"  # vLLM's names for the two formats
THINK_END = "</think>"


def template_text(holder) -> str | None:
    """The chat template a tokenizer or processor renders with when none is named (a dict of
    named templates: its "default")."""
    template = getattr(holder, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) else None


def content_format(template: str | None) -> str:
    """vLLM's content format of a template, by vLLM's rule (`_detect_content_format`, default
    "string"), read without vLLM: "openai" where a loop iterates a message's content."""
    if not template:
        return STRING
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        tree = _compile_jinja_template(template).environment.parse(template)
        next(_content_loops(tree))
    except StopIteration:
        return STRING
    except Exception:  # noqa: BLE001 - vLLM's default for a template it cannot parse
        return STRING
    return PARTS


def vllm_content_format(template: str | None) -> str:
    """The content format vLLM itself detects (the vLLM engine's jobs, where vLLM is imported)."""
    if not template:
        return STRING
    from vllm.renderers.hf import _detect_content_format

    return _detect_content_format(template, default=STRING)


# vLLM's rule (vllm/renderers/hf.py, Apache-2.0), over jinja2's nodes.

def _is_name(node, name: str) -> bool:
    from jinja2 import nodes

    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _is_key(node, name: str, key: str) -> bool:
    from jinja2 import nodes

    if isinstance(node, nodes.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    return isinstance(node, nodes.Getattr) and _is_name(node.node, name) and node.attr == key


def _reads(node, name: str, key: str | None = None) -> bool:
    """`name` (or its `key`), through filters, tests and slices."""
    from jinja2 import nodes

    if isinstance(node, nodes.Filter):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Test):
        return _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    return _is_key(node, name, key) if key else _is_name(node, name)


def _name(target) -> str:
    """A loop's or assignment's single variable; vLLM's rule fails on any other (then: its default)."""
    from jinja2 import nodes

    if not isinstance(target, nodes.Name):
        raise TypeError("not a single variable")
    return target.name


def _aliases(tree, name: str) -> list[str]:
    """`name` and the variables assigned from it (or its elements), transitively."""
    from jinja2 import nodes

    found, pending = [name], deque([name])
    while pending:
        current = pending.popleft()
        for assign in tree.find_all(nodes.Assign):
            if _reads(assign.node, current) and (target := _name(assign.target)) not in found:
                found.append(target)  # each once (vLLM's loops forever on `set a = b` and `set b = a`)
                pending.append(target)
    return found


def _message_names(tree) -> list[str]:
    from jinja2 import nodes

    names = _aliases(tree, "messages")
    return [_name(loop.target) for loop in tree.find_all(nodes.For)
            if any(_reads(loop.iter, name) for name in names)]


def _macro_content_params(tree, messages: list[str]) -> tuple[dict[int, set[str]], set[int]]:
    """Per loop inside a macro, the macro's parameters given a message's content; and those loops."""
    from jinja2 import nodes

    params_of, in_macros = {}, set()
    for macro in tree.find_all(nodes.Macro):
        names, params = [arg.name for arg in macro.args], set()
        for call in tree.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            params |= {names[i] for i, arg in enumerate(call.args)
                       if i < len(names) and any(_reads(arg, m, "content") for m in messages)}
            params |= {kw.key for kw in call.kwargs if kw.key in names
                       and any(_reads(kw.value, m, "content") for m in messages)}
        for loop in macro.find_all(nodes.For):
            in_macros.add(id(loop))
            if params:
                params_of[id(loop)] = params
    return params_of, in_macros


def _content_loops(tree) -> Iterator[str]:
    """The loops over a message's content: `message['content']`, a macro's parameter given it, or a
    variable named `content` outside macros."""
    from jinja2 import nodes

    messages = _message_names(tree)
    params_of, in_macros = _macro_content_params(tree, messages)
    for loop in tree.find_all(nodes.For):
        over = loop.iter
        if any(_reads(over, m, "content") for m in messages) or (isinstance(over, nodes.Name) and (
                over.name in params_of.get(id(loop), ()) or (id(loop) not in in_macros and over.name == "content"))):
            yield _name(loop.target)


def texts_of(content: Any) -> list[str]:
    """A content's texts: the string, or its text parts' texts."""
    if isinstance(content, str):
        return [content]
    return [part["text"] for part in content or () if part.get("type") == "text"]


def shaped(messages: list[dict], form: str, image_token: str = "<image>") -> list[dict]:
    """The messages as vLLM's `parse_chat_messages` hands them to a template of format `form`."""
    return [{**message, "content": _content(message, form, image_token)} for message in messages]


def _content(message: dict, form: str, image_token: str) -> Any:
    content = message["content"]
    if form == PARTS:
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if message.get("role") == "tool" and all(part.get("type") == "text" for part in parts):
            return "\n".join(texts_of(parts))
        return parts
    if isinstance(content, str):
        return content
    text = "\n".join(texts_of(content))
    missing = sum(part.get("type") == "image" for part in content) - text.count(image_token)
    return "\n".join([image_token] * max(missing, 0) + ([text] if text else []))


def lost_text(messages: list[dict], rendered: str) -> str | None:
    """Why a rendered prompt lost a message's text (the first such message), or None."""
    for k, message in enumerate(messages):
        for text in texts_of(message["content"]):
            kept = text.rsplit(THINK_END, 1)[-1].strip()
            if kept and kept not in rendered and json.dumps(kept, ensure_ascii=False)[1:-1] not in rendered:
                return (f"the chat template rendered message {k}'s text (role {message.get('role')}) nowhere in the "
                        "prompt; refused rather than run without it")
    return None
