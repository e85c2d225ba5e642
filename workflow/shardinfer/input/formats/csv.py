"""CSV and TSV: a header line, then one record per line; a quoted value may hold line breaks.

CSV has no types: the read columns are the strings they are ("02139" stays "02139"). A `.tsv`
file is the same with a tab between values; `input.csv.delimiter` (or today's `input.delimiter`)
names any other one-character separator (`;`, `|`) for either. Records are cut by this module, as
Arrow's parser reads them: a line break inside a quoted value is part of the value, so a shard may
start at any record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from shardinfer.core.errors import UserError
from shardinfer.input.formats.base import FormatOptions, Position, empty_batch
from shardinfer.input.formats.text_blocks import Reader, TextFormat, opened_at, position
from shardinfer.settings.config import InputSettings

QUOTE, LF, CR = (ord(c) for c in '"\n\r')


def record_ends(data: bytes, delimiter: int) -> Iterator[int]:
    """The line breaks that end a record in `data` (which starts at a record's start), from the
    last one backwards, found lazily: a line break inside a quoted value is part of the value."""
    opens, closes = quoted_spans(np.frombuffer(data, np.uint8), delimiter)
    end = len(data)
    while (end := _last_break(data, end)) >= 0:
        holder = int(np.searchsorted(opens, end)) - 1  # the quoted value that may hold this break
        if holder < 0 or end > closes[holder]:
            yield end
        else:
            end = int(opens[holder])


def _last_break(data: bytes, end: int) -> int:
    """The last line break before `end`: LF, or a CR not followed by LF (Arrow's three line ends).
    A CR that ends the data may be the first half of a CRLF: not a break yet."""
    lf = data.rfind(b"\n", 0, end)
    cr = data.rfind(b"\r", lf + 1, end)
    if cr == len(data) - 1:
        cr = data.rfind(b"\r", lf + 1, cr)
    return max(lf, cr)


def quoted_spans(buf: np.ndarray, delimiter: int) -> tuple[np.ndarray, np.ndarray]:
    """Where quoted values open and close (a value still open at the end closes at len(buf)), as
    Arrow's parser reads them: a quote opens one only at a value's start; inside, "" is a quote and
    any other quote closes it; elsewhere a quote is a character (12" pizza). When the quotes pair
    up as RFC 4180 writes them (nearly every file), they are simply taken two by two; a block where
    they do not is walked quote by quote."""
    quotes = np.flatnonzero(buf == QUOTE)
    before = buf[np.maximum(quotes - 1, 0)]
    at_start = (quotes == 0) | (before == delimiter) | (before == LF) | (before == CR)
    opens, closes = quotes[0::2], quotes[1::2]
    after = buf[np.minimum(closes + 1, len(buf) - 1)]  # a quote that ends the data reads itself: fine
    paired = (at_start[0::2] | (before[0::2] == QUOTE)).all() and np.isin(after, (delimiter, LF, CR, QUOTE)).all()
    if not paired:
        opens, closes = _walk_quotes(quotes, at_start)
    return opens, np.append(closes, len(buf))[: len(opens)]


def _walk_quotes(quotes: np.ndarray, at_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrow's quoting rules (see `quoted_spans`), one quote at a time."""
    quotes, at_start = quotes.tolist(), at_start.tolist()
    opens, closes, inside, k = [], [], False, 0
    while k < len(quotes):
        if not inside:
            if at_start[k]:
                inside = True
                opens.append(quotes[k])
        elif k + 1 < len(quotes) and quotes[k + 1] == quotes[k] + 1:
            k += 1  # "" inside a quoted value: one quote character
        else:
            inside = False
            closes.append(quotes[k])
        k += 1
    return np.array(opens, dtype=np.int64), np.array(closes, dtype=np.int64)


@dataclass(frozen=True)
class CsvOptions(FormatOptions):
    """`input.csv`: the one character between values (None: the format's own, `,` or a tab)."""
    delimiter: str | None = None

    def check(self, key: Callable[[str], str]) -> None:
        """A delimiter is one character that is not a quote or a line break (Arrow's rule)."""
        if self.delimiter is not None and (len(self.delimiter) != 1 or self.delimiter in '"\r\n'):
            raise UserError(f"{key('delimiter')} {self.delimiter!r} is not allowed: one character other than a quote "
                            "or a line break, e.g. `;`, `|` or a tab")


class Csv(TextFormat):
    name = "csv"
    extensions = (".csv",)
    default_delimiter = ","
    blank = b"\r\n"  # Arrow reads a line of spaces as a row: only empty lines hold none
    header_lines = 1
    options_type = CsvOptions

    def delimiter(self, inp: InputSettings) -> str:
        return self.options(inp).delimiter or self.default_delimiter

    def column_names(self, inp: InputSettings, fields: pa.Schema | None = None) -> list[str]:
        with self.reading(inp.path):
            return self.header(inp.path, self.delimiter(inp))[0]

    def no_rows(self, inp: InputSettings, fields: pa.Schema | None = None) -> pa.RecordBatch:
        """Every column is read as text (`reader`), so without rows too."""
        columns = inp.read_columns
        return empty_batch(pa.schema([(column, pa.string()) for column in dict.fromkeys(columns)]), columns)

    def header(self, path: str, delimiter: str) -> tuple[list[str], Position]:
        """The header's column names and where the rows begin (a header may hold a quoted newline)."""
        data, end, size = b"", 0, 1 << 12  # every shard reads the header: a small read, doubled while it does not end
        with opened_at(path, 0) as stream:
            while not end and (more := stream.read(size)):
                data, size = data + more, 2 * size
                end = min((e + 1 for e in record_ends(data, ord(delimiter)) if data[: e + 1].strip()), default=0)
        header = data[:end] if end else data
        options = pacsv.ParseOptions(newlines_in_values=True, delimiter=delimiter)
        names = pacsv.read_csv(pa.BufferReader(header), parse_options=options).column_names
        return names, position(1 + header.count(b"\n"), len(header))

    def reader(self, inp: InputSettings, fields: pa.Schema | None) -> Reader:
        delimiter = self.delimiter(inp)
        names, rows_begin = self.header(inp.path, delimiter)
        columns = list(dict.fromkeys(inp.read_columns))
        read = pacsv.ConvertOptions(column_types={c: pa.string() for c in columns}, include_columns=columns)
        parse = pacsv.ParseOptions(newlines_in_values=True, delimiter=delimiter)

        def parsed(line: int, block: bytes) -> pa.Table:
            options = pacsv.ReadOptions(column_names=names, block_size=len(block) + 1, use_threads=False)
            return pacsv.read_csv(pa.BufferReader(block), read_options=options, parse_options=parse,
                                  convert_options=read)

        def cut(data: bytes) -> int:
            return next(record_ends(data, ord(delimiter)), -1) + 1

        return cut, parsed, rows_begin

    def write(self, table: pa.Table, path: str, block_rows: int) -> None:
        pacsv.write_csv(table, path, pacsv.WriteOptions(delimiter=self.default_delimiter, quoting_style="needed"))


class Tsv(Csv):
    """CSV with a tab between values, as `.tsv` files (and spreadsheet exports) hold them."""
    name = "tsv"
    extensions = (".tsv", ".tab")
    default_delimiter = "\t"

    @property
    def options_section(self) -> str:  # CSV's settings: `input.csv.delimiter` reads a .tsv file too
        return "csv"


FORMATS = (Csv(), Tsv())
