"""Images given by path (`input.image_column` of strings), without Snakemake: the plan records per
shard the files its rows name, the infer job's trigger says "planned" until one of them changes (and
then only for its shard), the shard job records what it read, and gather's check tells a file
touched from one replaced. And the plan's balance counts each image's tokens."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardinfer.core.errors import UserError
from shardinfer.input.image_files import (
    PLANNED,
    gather_image_trigger,
    image_changed,
    image_trigger,
    read_image_file,
)
from shardinfer.input.images import column_images
from shardinfer.plan.plan_file import make_plan, read_plan, run_plan, write_plan
from shardinfer.settings.config import InputSettings
from shardinfer.tasks.generate.images import image_limit, image_token_estimate
from tiny_vlm import image_bytes


def image_input(path: str) -> InputSettings:
    return InputSettings(path=path, format="parquet", text_column="text", keep_columns=(), null_text="error",
                         task_columns=("text", "image"), column_keys=("input.text_column", "input.image_column"),
                         text_columns=("text",), image_columns=("image",))


def named_input(tmp_path, rows: list[list[str]]) -> InputSettings:
    """A Parquet file naming image files beside it (each name's file written, with its name as seed)."""
    for name in {name for names in rows for name in names}:
        (tmp_path / name).write_bytes(image_bytes(len(name) + sum(map(ord, name))))
    pq.write_table(pa.table({"text": ["red cat"] * len(rows), "image": pa.array(rows, pa.list_(pa.string()))}),
                   tmp_path / "rows.parquet")
    return image_input(str(tmp_path / "rows.parquet"))


def test_a_replaced_file_changes_the_trigger_of_the_shards_naming_it_alone(tmp_path):
    inp = named_input(tmp_path, [["a.png"], ["b.png"], [], ["c.png", "a.png"], ["d.png"], ["d.png"]])
    plan = make_plan(inp, 3, 80)
    assert [shard["paths"] for shard in plan.images] == [["a.png", "b.png"], ["a.png", "c.png"], ["d.png"]]
    write_plan(plan, str(tmp_path / "plan.json"))
    assert read_plan(str(tmp_path / "plan.json")).images == plan.images

    def triggers() -> list[str]:
        return [image_trigger(str(tmp_path / "plan.json"), shard, tmp_path) for shard in range(3)]

    assert triggers() == [PLANNED] * 3
    before = os.stat(tmp_path / "c.png")
    (tmp_path / "c.png").write_bytes(image_bytes(77))
    os.utime(tmp_path / "c.png", ns=(before.st_atime_ns, before.st_mtime_ns - 10**9))  # older, as cp -p leaves it
    changed = triggers()
    assert changed[0] == changed[2] == PLANNED and changed[1].startswith("changed ")
    assert triggers() == changed  # stable: the next run reruns nothing more
    (tmp_path / "a.png").unlink()
    assert PLANNED not in triggers()[:2] and triggers()[1] != changed[1]
    assert image_trigger(str(tmp_path / "no-plan.json"), 0, tmp_path) == PLANNED  # no plan yet: all run anyway


def test_a_file_rewritten_with_its_size_and_mtime_put_back_reruns_gather_alone(tmp_path):
    inp = named_input(tmp_path, [["a.png"], ["b.png"]])
    write_plan(make_plan(inp, 2, 80), str(tmp_path / "plan.json"))
    plan = str(tmp_path / "plan.json")
    assert gather_image_trigger(plan, tmp_path) == PLANNED
    stat, data = os.stat(tmp_path / "b.png"), bytearray((tmp_path / "b.png").read_bytes())
    data[-5] ^= 0xFF
    (tmp_path / "b.png").write_bytes(bytes(data))
    os.utime(tmp_path / "b.png", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert [image_trigger(plan, shard, tmp_path) for shard in range(2)] == [PLANNED, PLANNED]
    assert gather_image_trigger(plan, tmp_path).startswith("changed ")
    assert gather_image_trigger(str(tmp_path / "no-plan.json"), tmp_path) == PLANNED


def test_gather_tells_a_touched_file_from_a_replaced_one(tmp_path):
    (tmp_path / "a.png").write_bytes(image_bytes(1))
    data, read = read_image_file(tmp_path, "a.png")
    assert data == image_bytes(1) and read["size"] == len(data) and len(read["sha256"]) == 64
    assert image_changed(tmp_path, "a.png", read) is None
    os.utime(tmp_path / "a.png")  # touched: other stats, the same bytes
    assert image_changed(tmp_path, "a.png", read) is None
    same_size = bytearray(data)
    same_size[-5] ^= 0xFF
    (tmp_path / "a.png").write_bytes(bytes(same_size))
    os.utime(tmp_path / "a.png", ns=(read["mtime_ns"], read["mtime_ns"]))  # an edit with its mtime put back
    assert image_changed(tmp_path, "a.png", read).startswith(f"has other content (size {len(data)} -> {len(data)}, ")
    (tmp_path / "a.png").unlink()
    assert image_changed(tmp_path, "a.png", read) == "is gone"


def test_images_by_path_are_refused_in_a_bucket_and_bytes_are_not(tmp_path):
    """Without a shared filesystem (the plan job cuts the shards' rows: `cut_paths`), a shard job could
    not read a path from the bucket nor could anything prove it: the plan job refuses, writing nothing."""
    inp = named_input(tmp_path, [["a.png"], [], ["b.png"]])
    cuts = [str(tmp_path / f"cut{shard}.parquet") for shard in range(2)]
    with pytest.raises(UserError) as refused:
        run_plan(inp, 2, 80, str(tmp_path / "plan.json"), local_parts=[inp.path], cut_paths=cuts)
    assert str(refused.value).startswith("input.image_column `image` names image files by path (`a.png`, ...)")
    assert "hold the images' bytes in the column (binary" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not any(path.name.startswith(("plan", "cut")) for path in tmp_path.iterdir())
    pq.write_table(pa.table({"text": ["red cat"] * 3, "image": [image_bytes(1), None, image_bytes(2)]}),
                   tmp_path / "bytes.parquet")
    inp = image_input(str(tmp_path / "bytes.parquet"))
    run_plan(inp, 2, 80, str(tmp_path / "plan.json"), local_parts=[inp.path], cut_paths=cuts)
    assert read_plan(str(tmp_path / "plan.json")).rows == 3 and all(os.path.isfile(cut) for cut in cuts)


def test_the_plan_counts_an_images_tokens(tmp_path):
    """Eight rows, the first four of three images each: by characters alone two shards would split
    them 4 + 4; at 20 tokens an image, the rows with images weigh more and their shard holds fewer."""
    rows = [["a.png", "b.png", "c.png"]] * 4 + [[]] * 4
    inp = named_input(tmp_path, rows)
    assert make_plan(inp, 2, 80).ranges == ((0, 4), (4, 8))
    weighted = make_plan(inp, 2, 80, image_cost=20)
    assert weighted.ranges[0][1] < 4 and weighted.costs[0] - weighted.costs[1] < 60 + 10
    counts, named = column_images(pa.array([b"x", None, b"y"], pa.binary()))
    assert counts.tolist() == [1, 0, 1] and named == []
    counts, named = column_images(pa.array([[b"x", b"y"], None, []], pa.list_(pa.binary())))
    assert counts.tolist() == [2, 0, 0]
    counts, named = column_images(pa.array([{"bytes": None, "path": "p.png"}, {"bytes": b"z", "path": "q.png"}]))
    assert counts.tolist() == [1, 1] and named == [(0, "p.png")]


def test_an_images_tokens_are_estimated_from_the_model_folder(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps(
        {"image_seq_len": 4, "image_processor": {"do_image_splitting": True, "size": {"longest_edge": 64},
                                                 "max_image_size": {"longest_edge": 32}}}))
    assert image_token_estimate(str(tmp_path)) == 4 * (2 * 2 + 1)  # 4 tiles and the global one
    (tmp_path / "processor_config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"image_size": 384, "patch_size": 14}}))
    assert image_token_estimate(str(tmp_path)) == 27 * 27
    (tmp_path / "config.json").unlink()
    assert image_token_estimate(str(tmp_path)) == 576


@pytest.mark.parametrize(("options", "limit"), [
    ({"engine": "vllm", "vllm": {"limit_mm_per_prompt": {"image": 2}}}, 2),
    ({"engine": "vllm", "vllm": {"limit_mm_per_prompt": '{"image": 3}'}}, 3),
    ({"engine": "vllm", "vllm": {"limit_mm_per_prompt": {"image": {"count": 1}}}}, 1),
    ({"engine": "vllm", "vllm": {}}, None),
    ({"engine": "transformers", "vllm": {"limit_mm_per_prompt": {"image": 2}}}, None),
])
def test_vllms_image_limit_as_configured(options, limit):
    assert image_limit(options) == limit
