"""Shard cuts (shardinfer.input.shard_cuts), without a server: what the plan writes for jobs that
share no filesystem, and what a shard job reads of it. The runs against a real S3 server are in
tests/test_storage.py."""

import dataclasses

import pyarrow.parquet as pq
import pytest

from factory import gzipped, input_frame, write_input
from factory import input_settings as settings_for
from shardinfer.core.errors import ProofError, UserError
from shardinfer.plan.plan_file import make_plan, read_plan, write_plan

SHARDS = 5


@pytest.mark.parametrize("suffix", [".csv.gz", ".jsonl", ".parquet"])
def test_each_cut_holds_exactly_its_shards_rows_in_the_plans_types(tmp_path, suffix):
    frame = input_frame(333, seed=4)
    target = tmp_path / f"in{suffix}"
    path = gzipped(frame, target) if suffix.endswith(".gz") else write_input(frame, target)
    settings = settings_for(path)
    plan = make_plan(settings, SHARDS, 32)
    cut = plan.write_cuts(settings, [str(tmp_path / f"{k}.parquet") for k in range(SHARDS)])
    for shard, (start, end) in enumerate(plan.ranges):
        expected = [batch for _, batch in plan.shard_rows(settings, shard)]
        table = pq.read_table(tmp_path / f"{shard}.parquet")
        assert table.num_rows == end - start == cut.cuts[shard].rows
        assert table.column("text").to_pylist() == [t for b in expected for t in b.column("text").to_pylist()]
        assert table.schema.remove_metadata() == expected[0].schema.remove_metadata()
        # a shard job reads it as it would read the input: the same rows, numbered from the shard's start
        local = cut.reading_cut(shard, str(tmp_path / f"{shard}.parquet"))
        rows = [(first, batch.column("id").to_pylist()) for first, batch in local.shard_rows(settings, shard)]
        assert rows[0][0] == start
        assert [i for _, ids in rows for i in ids] == frame["id"].tolist()[start:end]


def test_a_shard_with_no_rows_gets_an_empty_cut_that_types_its_columns(tmp_path):
    settings = settings_for(write_input(input_frame(3), tmp_path / "in.parquet"))
    plan = make_plan(settings, SHARDS, 32)  # 3 rows, 5 shards: two are empty
    cut = plan.write_cuts(settings, [str(tmp_path / f"{k}.parquet") for k in range(SHARDS)])
    empty = next(k for k, (s, e) in enumerate(plan.ranges) if s == e)
    local = cut.reading_cut(empty, str(tmp_path / f"{empty}.parquet"))
    assert list(local.shard_rows(settings, empty)) == []
    assert local.no_rows(settings).schema.names == ["text", "id"]


def test_the_plan_file_records_the_cuts_and_a_changed_cut_is_refused(tmp_path):
    settings = settings_for(write_input(input_frame(50), tmp_path / "in.csv"))
    paths = [str(tmp_path / f"{k}.parquet") for k in range(2)]
    plan = make_plan(settings, 2, 32).write_cuts(settings, paths)
    write_plan(plan, str(tmp_path / "plan.json"))
    again = read_plan(str(tmp_path / "plan.json"))
    assert again.cuts == plan.cuts
    (tmp_path / "1.parquet").write_bytes((tmp_path / "0.parquet").read_bytes())  # another shard's cut
    with pytest.raises(UserError, match=r"shard 1: its cut `.*1.parquet` is not the one planned"):
        again.for_shard(1, paths[1])
    # a plan made on a shared filesystem has no cuts to read
    with pytest.raises(UserError, match="has no shard cuts"):
        dataclasses.replace(again, cuts=None).for_shard(0, paths[0])


def test_parts_named_as_configured_plan_alike_wherever_their_copies_were(tmp_path):
    """The plan of storage copies names the objects as configured, without the copies' mtimes: the
    same objects downloaded twice give the same plan id (the shards of the first stay valid)."""
    frame = input_frame(40)
    first = write_input(frame, tmp_path / "a" / "in.parquet")
    second = write_input(frame, tmp_path / "b" / "in.parquet")
    # as the plan job reads them: input.path as configured, its part where the job's copy lies
    read = [dataclasses.replace(settings_for(path), path="data/in.parquet", parts=(str(path),))
            for path in (first, second)]
    plans = [make_plan(settings, 2, 32).named_as(("data/in.parquet",)) for settings in read]
    assert plans[0].plan_id == plans[1].plan_id
    assert plans[0].parts[0].path == "data/in.parquet" and plans[0].parts[0].mtime_ns == 0


def test_gather_refuses_downloaded_parts_other_than_the_planned_ones(tmp_path):
    """Each job lists the bucket again: a gather job whose listing found other parts (one renamed,
    added or removed since planning) refuses them before reading any."""
    from shardinfer.proof.prove import prove

    frame = input_frame(40)
    copies = [write_input(frame.iloc[a:b], tmp_path / "dl" / "s3" / "bucket" / "run" / "data" / name)
              for name, (a, b) in (("part-0.parquet", (0, 20)), ("part-1.parquet", (20, 40)))]
    names = ["data/part-0.parquet", "data/part-1.parquet"]
    read = dataclasses.replace(settings_for(copies[0]), path="data/", parts=tuple(map(str, copies)))
    plan = make_plan(read, 2, 32).named_as(tuple(names))
    shards = ["0.parquet", "1.parquet"]
    with pytest.raises(UserError, match=r"input `data/`: `data/part-2.parquet` is not a part of the plan \(added or "
                                        r"renamed since planning"):
        prove(plan, shards, read, "digest", local_parts=list(map(str, copies)),
              part_names=["data/part-0.parquet", "data/part-2.parquet"])
    with pytest.raises(UserError, match=r"input `data/part-1.parquet` has disappeared since planning"):
        prove(plan, shards, read, "digest", local_parts=list(map(str, copies[:1])), part_names=names[:1])
    # the planned names pass on to the shards' proof (here: no shard files)
    with pytest.raises(ProofError, match=r"shard 0 \(`0.parquet`\): file is missing"):
        prove(plan, shards, read, "digest", local_parts=list(map(str, copies)), part_names=names)
