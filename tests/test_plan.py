"""Planning: ranges that cover the input exactly, and refusals of inputs with nothing usable."""

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from factory import bytes_read, input_frame, write_empty_input, write_input
from factory import input_settings as settings_for
from shardinfer.core.errors import UserError
from shardinfer.input.formats import text_blocks as tables
from shardinfer.input.parts import iter_pieces
from shardinfer.plan.balance import balanced_ranges, estimated_tokens
from shardinfer.plan.plan_file import PLAN_VERSION, make_plan, read_plan, write_plan


def costs_of(rows: int, seed: int) -> np.ndarray:
    """Long-tailed per-row costs, as a real length mix gives."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(30), 1.0, size=rows), 1, 512).astype(np.int64)


def check_cover(ranges, rows, shards):
    assert len(ranges) == shards
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
    assert all(end >= start for start, end in ranges)


@pytest.mark.parametrize("rows", [0, 1, 5, 7, 499, 1000, 1001])
@pytest.mark.parametrize("shards", [1, 2, 4, 7, 8, 1500])
def test_equal_costs_give_contiguous_ranges_with_sizes_within_one(rows, shards):
    ranges = balanced_ranges(np.full(rows, 3), shards)
    check_cover(ranges, rows, shards)
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == rows


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shards", [2, 7, 64])
def test_each_shard_holds_its_share_of_the_cost_within_one_row(seed, shards):
    costs = costs_of(5000, seed)
    ranges = balanced_ranges(costs, shards)
    check_cover(ranges, len(costs), shards)
    share = costs.sum() / shards
    for start, end in ranges:
        assert abs(costs[start:end].sum() - share) <= costs.max()


def test_cost_balance_beats_equal_row_counts_on_a_skewed_input():
    """Long texts bunched at the start: equal row counts would give the first shard most of the work."""
    costs = np.concatenate([np.full(1000, 400), np.full(9000, 10)])
    by_cost = [costs[s:e].sum() for s, e in balanced_ranges(costs, 4)]
    by_rows = [costs[i : i + 2500].sum() for i in range(0, 10000, 2500)]
    assert max(by_cost) / min(by_cost) < 1.01 < 3 < max(by_rows) / min(by_rows)


def test_more_shards_than_rows_gives_empty_shards():
    ranges = balanced_ranges(np.ones(5), 8)
    check_cover(ranges, 5, 8)
    assert sorted(end - start for start, end in ranges) == [0, 0, 0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("shards", [0, -3])
def test_shards_must_be_positive(shards):
    with pytest.raises(UserError, match=f"shards must be an integer >= 1; got {shards}"):
        balanced_ranges(np.ones(10), shards)


def test_estimated_tokens_count_characters_and_stop_at_max_length():
    assert estimated_tokens(np.array([0, 1, 4, 5, 4000]), 128).tolist() == [2, 3, 3, 4, 128]


def test_plan_records_each_shards_estimated_cost(tmp_path):
    frame = input_frame(40)
    frame.loc[:9, "text"] = "word " * 200  # the first quarter is long
    path = write_input(frame, tmp_path / "in.parquet")
    plan = make_plan(settings_for(path), 4, 512)
    write_plan(plan, tmp_path / "plan.json")
    recorded = json.loads((tmp_path / "plan.json").read_text())
    assert [s["cost"] for s in recorded["shards"]] == list(plan.costs)
    assert recorded["cost"]["total"] == sum(plan.costs) and "characters" in recorded["cost"]["estimate"]
    sizes = [e - s for s, e in plan.ranges]
    assert sizes[0] < sizes[-1]  # long rows share fewer per shard
    assert max(plan.costs) - min(plan.costs) <= 252  # one long row's estimate


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_plan_round_trips_and_records_rows_and_fingerprint(tmp_path, suffix):
    path = write_input(input_frame(10), tmp_path / f"in{suffix}")
    plan = make_plan(settings_for(path), 3, 32)
    write_plan(plan, tmp_path / "plan.json")
    again = read_plan(str(tmp_path / "plan.json"))
    assert again == plan
    assert again.rows == 10 and len(again.costs) == 3
    check_cover(again.ranges, 10, 3)
    part = json.loads((tmp_path / "plan.json").read_text())["input"]["parts"][0]
    assert part["size"] == os.stat(path).st_size
    assert (part["path"], part["first_row"], part["rows"]) == (str(path), 0, 10)


def test_plan_id_changes_with_the_input(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.parquet")
    first = make_plan(settings_for(path), 3, 32)
    write_input(input_frame(11), path)
    assert make_plan(settings_for(path), 3, 32).plan_id != first.plan_id


def test_changed_input_is_detected(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.csv")
    plan = make_plan(settings_for(path), 2, 32)
    write_input(input_frame(12), path)
    with pytest.raises(UserError, match="changed since planning.*rerun the plan"):
        plan.check_input_unchanged()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_an_input_without_rows_plans_empty_shards(tmp_path, suffix):
    """A daily job on an empty split: no error, every shard empty, and the columns' types known
    without a row (CSV reads every column as text)."""
    path = write_empty_input(tmp_path / f"in{suffix}")
    inp = settings_for(path)
    plan = make_plan(inp, 2, 32)
    assert (plan.rows, plan.ranges, plan.pieces) == (0, ((0, 0), (0, 0)), ((), ()))
    empty = plan.no_rows(inp)
    assert empty.num_rows == 0 and empty.schema.names == ["text", "id"]
    assert empty.schema.field("id").type == pa.string()


def test_null_texts_are_refused_with_count_and_first_rows(tmp_path):
    frame = input_frame(20)
    frame.loc[[3, 9, 11], "text"] = None
    path = write_input(frame, tmp_path / "in.parquet")
    with pytest.raises(UserError, match=r"is null in 3 row\(s\) \(first: 3, 9, 11\).*null_text: empty"):
        make_plan(settings_for(path), 2, 32)
    assert make_plan(settings_for(path, null_text="empty"), 2, 32).rows == 20


@pytest.mark.parametrize("shards", [2, 4, 7, 21])
def test_no_empty_shard_while_rows_suffice_even_with_one_huge_row(shards):
    costs = np.array([512] + [3] * 20)
    ranges = balanced_ranges(costs, shards)
    check_cover(ranges, 21, shards)
    assert all(end > start for start, end in ranges)
    assert ranges[0] == (0, 1)  # the long row alone; the short ones shared by the rest


@pytest.mark.parametrize("seed", range(3))
def test_no_empty_shard_on_random_costs(seed):
    rng = np.random.default_rng(seed)
    for rows in (1, 2, 5, 40):
        for shards in range(1, rows + 1):
            costs = rng.integers(1, 1000, size=rows)
            ranges = balanced_ranges(costs, shards)
            check_cover(ranges, rows, shards)
            assert all(end > start for start, end in ranges)


def read_shard(settings, plan, shard) -> tuple[list[str], int]:
    """A shard's ids, read as its job reads them (from its span), and the bytes that took."""
    before = bytes_read()
    ids = [i for _, batch in iter_pieces(settings, plan.pieces[shard])
           for i in batch.column("id").to_pylist()]
    return ids, bytes_read() - before


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts bytes read with /proc/self/io")
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_shards_read_their_part_of_the_file_not_all_before_it(tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(tables, "BLOCK_BYTES", 16 << 10)
    frame = input_frame(20_000)
    path = write_input(frame, tmp_path / f"in{suffix}")
    settings = settings_for(path)
    plan = make_plan(settings, 16, 512)
    write_plan(plan, tmp_path / "plan.json")
    plan, size, total = read_plan(str(tmp_path / "plan.json")), os.path.getsize(path), 0
    for shard, (start, end) in enumerate(plan.ranges):
        ids, read = read_shard(settings, plan, shard)
        assert ids == frame["id"].tolist()[start:end]
        (piece,) = plan.pieces[shard]
        span = piece.span
        stop = span.stop["byte"] if span.stop else size
        assert read <= stop - span.at["byte"] + 8192  # its span, the csv header, /proc/self/io
        total += read
    assert read_shard(settings, plan, 8)[1] < size / 8
    assert total <= 1.2 * size, (total, size)


def test_plan_file_records_each_shards_span_and_the_jsonl_fields_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "BLOCK_BYTES", 1024)
    path = write_input(input_frame(500), tmp_path / "in.jsonl")
    write_plan(make_plan(settings_for(path), 4, 32), tmp_path / "plan.json")
    recorded = json.loads((tmp_path / "plan.json").read_text())
    assert recorded["version"] == PLAN_VERSION == 7
    assert recorded["input"]["fields"]["types"] == {"id": "string", "gold": "int64", "text": "string"}
    spans = [piece["span"] for shard in recorded["shards"] for piece in shard["pieces"]]
    assert len(spans) == 4
    assert spans[0] == {"row": 0, "at": {"line": 1, "byte": 0}, "stop": spans[1]["at"]}
    assert spans[-1]["stop"] is None
    lines = path.read_bytes().split(b"\n")
    for span in spans:  # a text span starts where its row's line begins (the JSONL format's position)
        line, byte = span["at"]["line"], span["at"]["byte"]
        assert len(b"\n".join(lines[: line - 1])) + (line > 1) == byte
        assert json.loads(lines[line - 1])["id"] == f"row-{span['row']}"
    assert read_plan(str(tmp_path / "plan.json")).pieces[3][0].span.fields.names == ["id", "gold", "text"]


def test_parquet_plan_has_no_spans(tmp_path):
    path = write_input(input_frame(300), tmp_path / "in.parquet")
    plan = make_plan(settings_for(path), 3, 32)
    assert [[piece.span for piece in pieces] for pieces in plan.pieces] == [[None], [None], [None]]


def test_a_plan_of_an_earlier_version_is_refused(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.csv")
    write_plan(make_plan(settings_for(path), 2, 32), tmp_path / "plan.json")
    recorded = json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "plan.json").write_text(json.dumps({**recorded, "version": 3}))
    with pytest.raises(UserError, match=r"has version 3, expected 7; rerun the plan"):
        read_plan(str(tmp_path / "plan.json"))


def as_version_6(recorded: dict) -> dict:
    """A plan file as version 6 wrote it: text spans {row, line, byte, stop_byte}, `input.split`."""
    def span(entry):
        return entry and {"row": entry["row"], **entry["at"], "stop_byte": entry["stop"] and entry["stop"]["byte"]}

    shards = [{**shard, "pieces": [{**piece, "span": span(piece["span"])} for piece in shard["pieces"]]}
              for shard in recorded["shards"]]
    options = recorded["input"].pop("options")
    return {**recorded, "version": 6, "shards": shards, "input": {**recorded["input"], "split": None, **options}}


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_plan_of_version_6_reads_as_the_plan_it_was(tmp_path, monkeypatch, suffix):
    """A plan written before spans held the format's own positions is read, not replanned (a new
    plan file would rerun every finished shard): the same pieces, and the same rows from them."""
    monkeypatch.setattr(tables, "BLOCK_BYTES", 1024)
    path = write_input(input_frame(300), tmp_path / f"in{suffix}")
    settings = settings_for(path)
    write_plan(make_plan(settings, 4, 32), tmp_path / "plan.json")
    now = read_plan(str(tmp_path / "plan.json"))
    recorded = json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "old.json").write_text(json.dumps(as_version_6(recorded)))
    old = read_plan(str(tmp_path / "old.json"))
    assert (old.plan_id, old.ranges, old.options) == (now.plan_id, now.ranges, {})
    for shard, (start, end) in enumerate(now.ranges):
        assert [p.span and (p.span.row, p.span.at) for p in old.pieces[shard]] == [
            p.span and (p.span.row, p.span.at) for p in now.pieces[shard]]
        assert read_shard(settings, old, shard)[0] == [f"row-{i}" for i in range(start, end)]
