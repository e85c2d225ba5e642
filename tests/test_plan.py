"""Planning: ranges that cover the input exactly, and refusals of inputs with nothing usable."""

import json
import os

import pytest

from factory import input_frame, write_input
from factory import input_settings as settings_for
from shardinfer.errors import UserError
from shardinfer.plan import make_plan, read_plan, split_ranges, write_plan


@pytest.mark.parametrize("rows", [0, 1, 5, 7, 499, 1000, 1001])
@pytest.mark.parametrize("shards", [1, 2, 4, 7, 8, 1500])
def test_ranges_cover_rows_exactly_with_sizes_within_one(rows, shards):
    ranges = split_ranges(rows, shards)
    assert len(ranges) == shards
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a_end == b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
    sizes = [end - start for start, end in ranges]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    assert sum(sizes) == rows


def test_more_shards_than_rows_gives_empty_shards():
    assert split_ranges(5, 8) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 5), (5, 5), (5, 5)]


@pytest.mark.parametrize("shards", [0, -3])
def test_shards_must_be_positive(shards):
    with pytest.raises(UserError, match=f"shards must be an integer >= 1; got {shards}"):
        split_ranges(10, shards)


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_plan_round_trips_and_records_rows_and_fingerprint(tmp_path, suffix):
    path = write_input(input_frame(10), tmp_path / f"in{suffix}")
    plan = make_plan(settings_for(path), 3)
    write_plan(plan, tmp_path / "plan.json")
    again = read_plan(str(tmp_path / "plan.json"))
    assert again == plan
    assert again.rows == 10 and again.ranges == ((0, 4), (4, 7), (7, 10))
    assert json.loads((tmp_path / "plan.json").read_text())["input"]["size"] == os.stat(path).st_size


def test_plan_id_changes_with_the_input(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.parquet")
    first = make_plan(settings_for(path), 3)
    write_input(input_frame(11), path)
    assert make_plan(settings_for(path), 3).plan_id != first.plan_id


def test_changed_input_is_detected(tmp_path):
    path = write_input(input_frame(10), tmp_path / "in.csv")
    plan = make_plan(settings_for(path), 2)
    write_input(input_frame(12), path)
    with pytest.raises(UserError, match="changed since planning.*rerun the plan"):
        plan.check_input_unchanged()


def test_empty_input_is_refused(tmp_path):
    path = write_input(input_frame(0), tmp_path / "in.csv")
    with pytest.raises(UserError, match="has no rows"):
        make_plan(settings_for(path), 2)


def test_null_texts_are_refused_with_count_and_first_rows(tmp_path):
    frame = input_frame(20)
    frame.loc[[3, 9, 11], "text"] = None
    path = write_input(frame, tmp_path / "in.parquet")
    with pytest.raises(UserError, match=r"is null in 3 row\(s\) \(first: 3, 9, 11\).*null_text: empty"):
        make_plan(settings_for(path), 2)
    assert make_plan(settings_for(path, null_text="empty"), 2).rows == 20
