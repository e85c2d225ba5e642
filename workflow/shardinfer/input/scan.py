"""The plan's scan of one input file: its rows counted, the task's columns checked, each row's
text measured for the plan's cost, and the marks where shards may start reading (the format's
positions, each with the row that starts there), in one pass.

Every format gives its rows the same way (`shardinfer.input.formats`), so the scan names none:
it reads only the task's columns, streaming, and never holds the whole table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardinfer.contract.content_digest import table_digest
from shardinfer.core.errors import UserError
from shardinfer.input.formats import format_named
from shardinfer.input.formats.base import Mark, Span
from shardinfer.input.images import column_images, image_kind_problem
from shardinfer.settings.config import InputSettings

NULLS_LISTED = 5
# A conversation's cost beyond its contents' characters: the chat template's markers around each
# message (`<|user|>`, a turn end: a few tokens), as characters at the plan's ~4 per token.
CHARS_PER_MESSAGE = 16


@dataclass(frozen=True)
class InputScan:
    rows: int
    null_texts: int
    first_null_rows: tuple[int, ...]
    chars: np.ndarray  # characters of each row's text (0 for null, and for a custom task's rows), for the cost estimate
    marks: tuple[Mark, ...] = ()  # where each block of rows starts, for shards to start at (text, Arrow)
    fields: pa.Schema | None = None  # JSONL: every field, typed over the whole file
    # input.image_column: images per row (their cost), and (row, name) of each named by path
    images: np.ndarray | None = None
    image_names: tuple[tuple[int, str], ...] = ()

    def spans(self, ranges: list[tuple[int, int]]) -> tuple[Span | None, ...]:
        """Each range's span: from the last mark at or before its first row to the first mark at or
        after its end (the file's end when none), so a shard reads less than one block it does not
        need on either side. None for a format without positions (Parquet's row groups and Arrow's
        batches are their own index)."""
        if not self.marks:
            return tuple(None for _ in ranges)
        rows = np.array([mark.row for mark in self.marks])
        firsts = np.searchsorted(rows, [start for start, _ in ranges], side="right") - 1
        afters = np.searchsorted(rows, [end for _, end in ranges], side="left")
        spans = []
        for first, after in zip(firsts, afters):
            at = self.marks[max(int(first), 0)]
            stop = self.marks[after].position if after < len(rows) else None
            spans.append(Span(at.row, at.position, stop, self.fields))
        return tuple(spans)


def _check_columns(inp: InputSettings, fields: pa.Schema | None) -> None:
    """Each column the run reads is in the file once: a name twice (csv `id,text,id`, parquet too)
    would be read as one of them, silently; Arrow takes the first in csv and the last in parquet.
    JSONL: in `fields`, those of every part (a field only some parts carry is null in the others)."""
    names = format_named(inp.format).column_names(inp, fields)
    roles = [*zip(inp.task_columns, inp.column_keys), *((c, "input.keep_columns") for c in inp.keep_columns)]
    for column, role in roles:
        if column not in names:
            raise UserError(f"{role}: column `{column}` is not in `{inp.path}`; "
                            f"its columns are: {', '.join(names)}")
        if names.count(column) > 1:
            raise UserError(f"{role}: `{inp.path}` has {names.count(column)} columns named `{column}`; "
                            "rename them so that each name is one column")


def _check_image_types(inp: InputSettings, fields: pa.Schema | None) -> None:
    """An image column holds images (`generate_images.image_kind_problem`): found at the plan."""
    if not inp.image_columns:
        return
    types = format_named(inp.format).column_types(inp, fields)
    for column in inp.image_columns:
        problem = image_kind_problem(types[column])
        if problem:
            raise UserError(f"input.image_column `{column}` {problem}; in `{inp.path}`")


def _check_keep_types(inp: InputSettings, fields: pa.Schema | None) -> None:
    """Each kept column's type is one a shard can write and prove (`keeps_type`): found at the
    plan, not by every shard after its model has loaded."""
    if not inp.keep_columns:
        return
    types = format_named(inp.format).column_types(inp, fields)
    for column, kind in ((column, types[column]) for column in inp.keep_columns):
        if not keeps_type(kind):
            raise UserError(f"input.keep_columns: `{column}` holds {kind} in `{inp.path}`, which a shard table "
                            "cannot hold and prove; allowed: numbers, text, binary, booleans, dates and times, "
                            "decimals, and lists, structs and maps of them")


def keeps_type(kind: pa.DataType) -> bool:
    """Whether a column of this type can be written to a shard's Parquet file and digested."""
    try:
        probe = pa.table({"probe": pa.nulls(1, kind)})
        table_digest(probe)
        pq.write_table(probe, pa.BufferOutputStream())
    except (pa.ArrowException, NotImplementedError, TypeError, ValueError):
        return False
    return True


def _check_text_type(inp: InputSettings, column: str, text: pa.Array) -> None:
    kind = text.type.value_type if pa.types.is_dictionary(text.type) else text.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        key = dict(zip(inp.task_columns, inp.column_keys)).get(column, "input.text_column")
        raise UserError(f"{key} `{column}` holds {text.type}, not text (strings) in `{inp.path}`")


def _check_conversation_type(inp: InputSettings, column: str, kind: pa.DataType) -> None:
    """A conversation column holds lists of structs with a `role` string and a `content` string or
    list of parts ({type, text}, and {type: image} with images: `generate_prompts.conversation_of`);
    more fields are allowed: the template gets those that are set."""
    message = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else None
    fields = {f.name: f.type for f in message} if message is not None and pa.types.is_struct(message) else {}
    if content_parts(fields.get("content")):
        fields["content"] = pa.string()
    if not all(key in fields and (pa.types.is_string(fields[key]) or fields[key] == pa.null())
               for key in ("role", "content")):
        raise UserError(f"input.messages_column `{column}` holds {kind} in `{inp.path}`, not conversations: a list of "
                        "{role, content} messages per row, role a string and content a string or a list of parts "
                        "(Parquet list<struct<role: string, content: string>> or content list<struct<type: string, "
                        "text: string>>, JSONL arrays of objects)")


def content_parts(kind: pa.DataType | None) -> bool:
    """Whether a message's content is a list of parts with a `type` ({type, text}, {type: image})."""
    if kind is None or not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return False
    part = kind.value_type
    return pa.types.is_struct(part) and "type" in {f.name for f in part}


def content_lengths(contents: pa.Array) -> np.ndarray:
    """Characters per message content: a string's, or its text parts' together."""
    if not content_parts(contents.type):
        return text_lengths(contents)
    parts = pc.list_flatten(contents)
    if "text" not in {f.name for f in parts.type}:
        return np.zeros(len(contents), dtype=np.int32)
    owner = pc.list_parent_indices(contents).to_numpy(zero_copy_only=False)
    chars = text_lengths(pc.struct_field(parts, "text"))
    return np.bincount(owner, weights=chars, minlength=len(contents)).astype(np.int32)


def conversation_lengths(conversations: pa.Array) -> np.ndarray:
    """Characters per conversation, its contents' plus CHARS_PER_MESSAGE per message (0 for null)."""
    if conversations.type == pa.null():
        return np.zeros(len(conversations), dtype=np.int32)
    messages = pc.list_flatten(conversations)
    owner = pc.list_parent_indices(conversations).to_numpy(zero_copy_only=False)
    chars = content_lengths(pc.struct_field(messages, "content")) + CHARS_PER_MESSAGE
    return np.bincount(owner, weights=chars, minlength=len(conversations)).astype(np.int32)


class _TextMeasure:
    """Characters per row (summed over the task's text and conversation columns: the plan's cost)
    and the rows where any of them is null, batch by batch."""

    def __init__(self, inp: InputSettings) -> None:
        self.inp, self.chars, self.nulls, self.first_nulls = inp, [], 0, []

    def add(self, batch: pa.RecordBatch, first_row: int) -> None:
        chars, null = np.zeros(batch.num_rows, dtype=np.int32), np.zeros(batch.num_rows, dtype=bool)
        for column in (*self.inp.text_columns, *self.inp.conversation_columns):
            text = batch.column(column)
            conversations = column in self.inp.conversation_columns
            if text.type != pa.null():
                (_check_conversation_type(self.inp, column, text.type) if conversations
                 else _check_text_type(self.inp, column, text))
            chars += conversation_lengths(text) if conversations else text_lengths(text)
            if text.null_count:
                null |= text.is_null().to_numpy(zero_copy_only=False)
        self.chars.append(chars)
        if null.any():
            positions = np.flatnonzero(null)
            self.nulls += len(positions)
            self.first_nulls.extend(first_row + int(p) for p in positions[: NULLS_LISTED - len(self.first_nulls)])


def scan_input(inp: InputSettings, fields: pa.Schema | None = None) -> InputScan:
    """Count the rows, measure and check every text value once, streaming, and mark where each
    block starts (the format's positions); raises on anything unusable. Columns that are not text (a custom
    task's) are counted and read (so a bad value is found here), not measured (chars 0).
    `fields`: a JSONL part's fields typed over the whole input (default: this file's own)."""
    fmt = format_named(inp.format)
    fields = fields if fields is not None else fmt.fields(inp)
    _check_columns(inp, fields)
    _check_keep_types(inp, fields)
    _check_image_types(inp, fields)
    measure = _TextMeasure(inp) if inp.text_columns or inp.conversation_columns else None
    rows, marks, images, names = 0, [], [], []
    task_only = dataclasses.replace(inp, keep_columns=())  # the task's columns only (images: counted, named)
    for position, batch in fmt.batches(task_only, None, fields):
        if position is not None and (not marks or marks[-1].position != position):
            marks.append(Mark(rows, position))
        if measure:
            measure.add(batch, rows)
        for column in inp.image_columns:
            counts, named = column_images(batch.column(column))
            images.append(counts)
            names.extend((rows + k, name) for k, name in named)
        rows += batch.num_rows
    chars = [np.zeros(rows, dtype=np.int32)] if measure is None else measure.chars
    return InputScan(rows=rows, null_texts=measure.nulls if measure else 0,
                     first_null_rows=tuple(measure.first_nulls) if measure else (),
                     chars=np.concatenate(chars) if chars else np.zeros(0, dtype=np.int32), marks=tuple(marks),
                     fields=fields, images=_concatenated(images, rows) if inp.image_columns else None,
                     image_names=tuple(names))


def _concatenated(arrays: list[np.ndarray], rows: int) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(rows, dtype=np.int32)


def text_lengths(text: pa.Array) -> np.ndarray:
    """Characters per value (0 for null) as int32."""
    if text.type == pa.null():
        return np.zeros(len(text), dtype=np.int32)
    if pa.types.is_dictionary(text.type):
        text = text.dictionary_decode()
    if pa.types.is_string_view(text.type):
        text = text.cast(pa.string())
    return pc.fill_null(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False).astype(np.int32)


def count_rows(inp: InputSettings, fields: pa.Schema | None = None) -> int:
    """The file's rows, as gather proves them (`fields`: the plan's types over all parts)."""
    return format_named(inp.format).count_rows(inp, fields)


def text_values(text: pa.Array, null_as_empty: bool) -> list[str]:
    """Texts as Python strings; nulls become '' only where the config allows it."""
    if pa.types.is_dictionary(text.type):
        text = text.dictionary_decode()
    if text.null_count and null_as_empty:
        text = pc.fill_null(text.cast(pa.string()), "")
    return text.to_pylist()
