"""The image-transfer example (examples/image-transfer): its hook keeps the `task: custom`
contract, and a row's PNG is the same bytes whatever batch it lands in. No workflow run: the
example is built into tmp_path with make_example's own functions and the hook is called directly."""

from __future__ import annotations

import importlib.util
import io
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "image-transfer"
ROWS = 13  # not a multiple of the hook's micro-batch (8), so padding is exercised


def import_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """(models folder, input table, hook module), built once for this module."""
    make_example = import_file("image_transfer_make_example", EXAMPLE / "make_example.py")
    out = tmp_path_factory.mktemp("image-transfer")
    paths = make_example.make_example(out, rows=ROWS)
    table = pq.read_table(paths["input"])
    return paths["models"], table, make_example.load_hook(EXAMPLE / "hooks" / "transfer.py")


def predict(example, options: dict, rows: list[int]) -> dict[str, list]:
    """The hook's predictions for `rows` (global row numbers) in one batch, in that order."""
    models, table, hook = example
    predictor = hook.build(str(models), options, torch.device("cpu"))
    batch = table.select(["img", "cond"]).take(pa.array(rows))
    result = predictor.predict(batch, np.array(rows, dtype=np.int64))
    assert set(result) == set(predictor.outputs) and all(len(values) == len(rows) for values in result.values())
    return result


def test_outputs_are_declared_in_the_runners_types(example):
    from shardinfer.contract.shard_file import arrow_type, file_columns

    outputs = example[2].build(str(example[0]), {"steps": 2}, torch.device("cpu")).outputs
    assert outputs == {"image": "file:.png", "mean_change": "float32"}
    assert file_columns(outputs) == {"image": ".png"} and arrow_type(outputs["mean_change"]) == pa.float32()


def test_a_rows_png_does_not_depend_on_its_batch(example):
    options = {"steps": 20, "seed": 0}
    whole = predict(example, options, list(range(ROWS)))
    first, rest = predict(example, options, list(range(5))), predict(example, options, list(range(ROWS - 1, 4, -1)))
    split = {key: first[key] + rest[key][::-1] for key in whole}
    assert split["image"] == whole["image"]  # byte-identical PNGs, row by row
    assert split["mean_change"] == whole["mean_change"]
    alone = predict(example, options, [7])
    assert alone["image"] == [whole["image"][7]] and alone["mean_change"] == [whole["mean_change"][7]]


def test_each_value_is_a_32x32_png_that_changed(example):
    _, table, _ = example
    result = predict(example, {"steps": 20}, list(range(ROWS)))
    for row, data in enumerate(result["image"]):
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        with Image.open(io.BytesIO(data)) as image:
            assert (image.format, image.size, image.mode) == ("PNG", (32, 32), "RGB")
            after = np.asarray(image, dtype=np.int16)
        with Image.open(io.BytesIO(table.column("img")[row].as_py())) as image:
            before = np.asarray(image.convert("RGB"), dtype=np.int16)
        assert result["mean_change"][row] == pytest.approx(np.abs(after - before).mean())
        assert result["mean_change"][row] > 0


def test_steps_and_seed_change_the_output(example):
    rows = list(range(4))
    base = predict(example, {"steps": 20, "seed": 0}, rows)["image"]
    fewer = predict(example, {"steps": 5, "seed": 0}, rows)["image"]
    other_seed = predict(example, {"steps": 20, "seed": 1}, rows)["image"]
    assert all(a != b for a, b in zip(base, fewer)) and all(a != b for a, b in zip(base, other_seed))


def test_a_row_without_image_gets_no_file_and_a_bad_option_is_refused(example):
    models, table, hook = example
    predictor = hook.build(str(models), {"steps": 3}, torch.device("cpu"))
    batch = pa.table({"img": pa.array([None, table.column("img")[0].as_py()], pa.binary()), "cond": [0.5, 0.5]})
    result = predictor.predict(batch, np.array([0, 1], dtype=np.int64))
    assert result["image"][0] is None and result["mean_change"][0] is None and result["image"][1] is not None
    with pytest.raises(ValueError, match="unknown model.options"):
        hook.build(str(models), {"step": 3}, torch.device("cpu"))


def test_weights_are_safetensors_not_pickle(example):
    from safetensors import safe_open

    models = example[0]
    assert sorted(path.name for path in models.iterdir()) == ["config.json", "first.safetensors", "second.safetensors"]
    shapes = json.loads((models / "config.json").read_text())["models"]
    for name in shapes:
        raw = (models / f"{name}.safetensors").read_bytes()
        assert not raw.startswith((b"PK", b"\x80"))  # neither torch.save's zip nor a bare pickle
        (header_size,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + header_size])
        assert header["__metadata__"] == {"format": "pt"}
        with safe_open(str(models / f"{name}.safetensors"), framework="pt") as weights:
            parameters = sum(weights.get_tensor(key).numel() for key in weights.keys())
        assert 1_000 < parameters < 10_000
