"""What the text formats (CSV, TSV, JSONL) share: reading in blocks of whole records, marks where
shards seek to, staging by decompressing, and a row bound from line breaks.

A text file is read in blocks of whole records (BLOCK_BYTES each, cut here, not by Arrow: a CSV
value may hold a quoted newline). A block's position is where it starts, `{"line": l, "byte": b}`
(its line number, for errors that name the file's line, and its byte offset, decompressed for
.gz); a shard seeks to the last block at or before its first row and stops at the first one
after its last (the plan's `Span`), so all shards together read the file about once. A compressed file
cannot seek: read in place, a shard decompresses it from the start and drops the bytes before its
span (decompressing only; nothing before the span is parsed). Where that would make its shards
read it many times over, the plan stages a decompressed copy (`shardinfer.input.staging`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import pyarrow as pa

from shardinfer.contract.file_digest import CHUNK_BYTES, DIGEST_ALGORITHM
from shardinfer.core.atomic import atomic_path
from shardinfer.input.formats.base import Format, Held, Position, Span, compressed, select
from shardinfer.settings.config import InputSettings

BLOCK_BYTES = 1 << 20  # the parsing unit, and so how far before its rows a shard may start reading
LINE_CHUNK_BYTES = 1 << 22

BlockParser = Callable[[int, bytes], pa.Table]  # (the block's first line, its bytes) -> its rows
Reader = tuple[Callable[[bytes], int], BlockParser, Position]  # how to cut blocks, parse one, where rows begin


def position(line: int, byte: int) -> Position:
    """Where a block starts: its line number (from 1) and its byte offset."""
    return {"line": line, "byte": byte}


def span_of_plan_v6(data: dict, fields: pa.Schema | None) -> Span:
    """A span as plans of version 6 wrote it, `{row, line, byte, stop_byte}`: only the text formats
    had spans then, so it is a text span (a stop needs only its byte)."""
    stop = data["stop_byte"]
    return Span(data["row"], position(data["line"], data["byte"]), None if stop is None else {"byte": stop}, fields)


@contextmanager
def opened_at(path: str, byte: int) -> Iterator[pa.NativeFile]:
    """The file from `byte` on. A compressed file (by its extension) cannot seek: it is decompressed
    from the start and the bytes before `byte` are dropped."""
    with pa.input_stream(path) as stream:
        if stream.seekable():
            stream.seek(byte)
        while not stream.seekable() and byte > 0 and (skipped := len(stream.read(min(byte, BLOCK_BYTES)))):
            byte -= skipped
        yield stream


def blocks(path: str, cut: Callable[[bytes], int], at: Position, stop: int | None,
           blank: bytes | None = None) -> Iterator[tuple[int, int, bytes]]:
    """The file from position `at` to byte `stop` in blocks of whole records, each with its byte offset and line
    number; `cut(data)` says where the last whole record in `data` ends (0: none yet). Blocks of
    nothing but `blank` bytes (None: whitespace) are passed over: for CSV only line breaks, since
    Arrow reads a line of spaces as a row. A record longer than a block makes the next read as
    long as all that is pending, so that even a huge value is cut in linear time."""
    byte, line, carry = at["byte"], at["line"], b""
    left = float("inf") if stop is None else stop - byte
    with opened_at(path, byte) as stream:
        while data := stream.read(min(max(BLOCK_BYTES, len(carry)), left)):
            left -= len(data)
            data = carry + data
            end = cut(data)
            block, carry = data[:end], data[end:]
            if block.strip(blank):
                yield byte, line, block
            byte, line = byte + len(block), line + block.count(b"\n")
    if carry.strip(blank):
        yield byte, line, carry


def line_cut(data: bytes) -> int:
    return data.rfind(b"\n") + 1


def lines(path: str, enough: int) -> int:
    """Lines in the file, counted in 4 MiB chunks until there are `enough` (then `enough` or more).
    A line ends at \\n, \\r\\n or a lone \\r, as Arrow's CSV reader takes them (a \\r\\n cut by a chunk's
    end counts twice: still a bound); a last line without an end counts."""
    count, last = 0, b"\n"
    with open(path, "rb", buffering=0) as handle:
        while count < enough and (chunk := handle.read(LINE_CHUNK_BYTES)):
            count += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            last = chunk[-1:]
    return count + (last not in b"\r\n")


class TextFormat(Format):
    """A format of records in lines. Subclasses say how to cut and parse blocks, and where rows begin."""

    compressible = True
    blank: ClassVar[bytes | None] = None  # bytes a block of nothing else holds no row of
    header_lines: ClassVar[int] = 0  # lines before the rows that hold no row (CSV: its header)

    def reader(self, inp: InputSettings, fields: pa.Schema | None) -> Reader:
        """How to cut the file's blocks, how to parse one, and the position where its rows begin."""
        raise NotImplementedError

    @property
    def staged_suffix(self) -> str:  # a compressed part's copy is the same format, decompressed
        return f".{self.name}"

    def batches(self, inp: InputSettings, span: Span | None = None, fields: pa.Schema | None = None
                ) -> Iterator[tuple[Position, pa.RecordBatch]]:
        with self.reading(inp.path):
            cut, parse, rows_begin = self.reader(inp, fields if fields is not None else span and span.fields)
            at, stop = (span.at, span.stop and span.stop["byte"]) if span else (rows_begin, None)
            for byte, line, block in blocks(inp.path, cut, at, stop, self.blank):
                for batch in parse(line, block).to_batches():
                    yield position(line, byte), select(batch, inp.read_columns)

    def rows_at_most(self, path: str, enough: int) -> tuple[int, bool] | None:
        """Its lines, less the header's: a bound (a blank line or a quoted newline is not a row).
        None for a file whose name does not end in the format's extension: Arrow decompresses .gz,
        .bz2, .zst, .lz4 ... by the name, and their newlines would be no bound."""
        if Path(path).suffix.lower() not in self.extensions:
            return None
        return max(lines(path, enough + self.header_lines) - self.header_lines, 0), False

    def rows_read(self, path: str, held: Held) -> int:
        """A compressed file is read from its start to each range's end; a plain one by its spans."""
        return sum(hi for _, hi in held) if compressed(path) else super().rows_read(path, held)

    def stage(self, inp: InputSettings, path: str, held: Held, target: Path) -> tuple[str, None]:
        """The part's bytes decompressed into `target` (the plan's spans are offsets in the
        decompressed bytes already); returns their digest."""
        hasher = hashlib.new(DIGEST_ALGORITHM)
        with atomic_path(target) as tmp, open(tmp, "wb") as sink:
            for chunk in self._chunks(path):
                hasher.update(chunk)
                sink.write(chunk)
        return f"{DIGEST_ALGORITHM}:{hasher.hexdigest()}", None

    def _chunks(self, path: str) -> Iterator[bytes]:
        """The decompressed bytes, read faults named as the input's (the writer's pass through)."""
        with self.reading(path), pa.input_stream(path) as source:
            while chunk := source.read(CHUNK_BYTES):
                yield chunk
