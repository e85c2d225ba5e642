"""ORC input (`shardinfer.input.formats.orc`): what the format contract (tests/test_format_contract.py)
does not already hold it to. Stripes are its positions: the plan records the stripe a shard starts
at and the one it stops before, and a shard reads those alone; parts are typed together; rows are
counted from the footer; an empty file still names its columns' types; a file that is not ORC is
refused in one line."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.orc as orc
import pytest

from factory import input_frame
from shardinfer.core.errors import UserError
from shardinfer.input.discovery import resolve_input
from shardinfer.input.formats import format_named
from shardinfer.input.parts import iter_pieces
from shardinfer.input.scan import count_rows
from shardinfer.input.shard_bound import check_shard_count
from shardinfer.plan.plan_file import make_plan, read_plan, write_plan
from shardinfer.settings.config import InputSettings

ORC = format_named("orc")


def settings(path, keep=("id", "gold")) -> InputSettings:
    fmt, parts = resolve_input(str(path))
    return InputSettings(path=str(path), format=fmt, parts=parts, text_column="text", keep_columns=keep,
                         null_text="error")


def table(rows: int) -> pa.Table:
    return pa.Table.from_pandas(input_frame(rows), preserve_index=False)


def test_a_shard_starts_at_the_stripe_that_holds_its_first_row(tmp_path):
    ORC.write(table(5000), str(tmp_path / "in.orc"), 500)
    assert orc.ORCFile(str(tmp_path / "in.orc")).nstripes >= 8
    inp = settings(tmp_path / "in.orc", keep=("id", "text"))  # the text column kept: read twice, stored once
    write_plan(make_plan(inp, 4, 64), str(tmp_path / "plan.json"))
    spans = [shard["pieces"][0]["span"] for shard in json.loads((tmp_path / "plan.json").read_text())["shards"]]
    assert spans[0]["at"] == {"stripe": 0} and spans[-1]["stop"] is None
    assert all(span["stop"]["stripe"] in (later["at"]["stripe"], later["at"]["stripe"] + 1)
               for span, later in zip(spans, spans[1:]))  # the next shard's stripe, or the one after it
    assert spans[-1]["at"]["stripe"] > 0 and spans[-1]["row"] > 0
    plan = read_plan(str(tmp_path / "plan.json"))
    for (start, end), pieces in zip(plan.ranges, plan.pieces):
        got = pa.Table.from_batches([batch for _, batch in iter_pieces(inp, pieces, plan.fields)])
        assert got.column("id").to_pylist() == [f"row-{i}" for i in range(start, end)]
        assert got.column_names == ["text", "id", "text"]


def test_orc_parts_of_other_types_are_read_in_one_type(tmp_path):
    """Two parts whose writers typed `gold` int32 and int64: one type holds both (int64)."""
    whole = table(60)
    (tmp_path / "parts").mkdir()
    first = whole.slice(0, 20)
    first = first.set_column(first.schema.get_field_index("gold"), "gold", first.column("gold").cast(pa.int32()))
    orc.write_table(first, str(tmp_path / "parts" / "part-0.orc"))
    orc.write_table(whole.slice(20), str(tmp_path / "parts" / "part-1.orc"))
    inp = settings(tmp_path / "parts")
    plan = make_plan(inp, 3, 64)
    assert plan.fields.field("gold").type == pa.int64()
    got = [batch for pieces in plan.pieces for _, batch in iter_pieces(inp, pieces, plan.fields)]
    assert pa.Table.from_batches(got).column("gold").to_pylist() == whole.column("gold").to_pylist()


def test_rows_are_counted_from_the_footer_and_an_empty_file_names_its_types(tmp_path):
    ORC.write(table(1234), str(tmp_path / "in.orc"), 100)
    assert count_rows(settings(tmp_path / "in.orc")) == 1234
    assert ORC.rows_at_most(str(tmp_path / "in.orc"), 10) == (1234, True)
    orc.write_table(table(0).cast(pa.schema([("id", pa.string()), ("gold", pa.int64()), ("text", pa.string())])),
                    str(tmp_path / "empty.orc"))
    empty = settings(tmp_path / "empty.orc")
    assert make_plan(empty, 2, 64).rows == 0
    assert ORC.column_types(empty) == {"text": pa.string(), "id": pa.string(), "gold": pa.int64()}


def test_a_file_that_is_not_orc_is_refused_in_one_line(tmp_path):
    (tmp_path / "broken.orc").write_bytes(b"ORC but not really")
    with pytest.raises(UserError, match=r"^input `.*broken.orc`: cannot read it as orc: ") as caught:
        check_shard_count(settings(tmp_path / "broken.orc"), 5000)
    assert "\n" not in str(caught.value)
