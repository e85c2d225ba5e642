"""Images in (`input.image_column`): a tiny vision-language model (Idefics3, tests/tiny_vlm.py) through
real `snakemake` runs on both engines, and the rules that place images in a prompt.

Two runs, made together and shared, both through the chat template (each image a part in front of
its prompt, unless the prompt places it): a Parquet file of image bytes on vLLM's engine in one shard,
and a folder of images named by relative paths (the same images, as files) on the transformers
engine in three shards with `row_errors: record`, one more row naming an image that is not an
image. Row for row they must agree: three shards equal one, paths equal bytes, transformers equals
vLLM (greedy, float32), and the unreadable image is its row's error alone.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from conftest import made_once
from factory import WORDS, read_predictions, run_workflows
from tiny_vlm import build_tiny_vlm, image_bytes

ROWS = 14  # the shared rows; the paths' input has one more, whose image cannot be read
COLUMNS = ["generated", "n_prompt_tokens", "n_generated_tokens", "finish_reason"]
JPEG_START = bytes([0xFF, 0xD8])
NO_IMAGE, PLACED, TWO = 5, 8, 11  # a row without an image; one whose text places it; one with two images


def texts() -> list[str]:
    rng = random.Random(5)
    rows = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(ROWS)]
    rows[PLACED] = f"red cat <image> {rows[PLACED]}"
    rows[TWO] = f"<image> one <image> two {rows[TWO]}"
    return rows


def images() -> list[list[bytes]]:
    rows = [[image_bytes(seed, "JPEG" if seed % 3 == 0 else "PNG")] for seed in range(ROWS)]
    rows[NO_IMAGE] = []
    rows[TWO] = [image_bytes(100), image_bytes(101)]
    return rows


def vlm_config(data: Path, vlm: Path, shards: int, engine: str, **extra) -> dict:
    return {"input": {"path": str(data), "image_column": "image", "keep_columns": ["id"]},
            "model": {"path": str(vlm), "task": "generate", "max_length": 80, "max_new_tokens": 12},
            "generate": {"engine": engine, "chat_template": True},
            "batch": {"max_tokens": 4096, "max_rows": 4, "sort_window": 8},
            "shards": shards, **extra}


def bytes_input(root: Path) -> Path:
    """Parquet: the image column list<binary> (a row of two images, a row of none)."""
    path = root / "bytes.parquet"
    table = pa.table({"id": [f"r{i}" for i in range(ROWS)], "text": texts(),
                      "image": pa.array(images(), type=pa.list_(pa.binary()))})
    import pyarrow.parquet as pq

    pq.write_table(table, path)
    return path


def paths_input(root: Path) -> Path:
    """A folder: the same images as files under images/, a JSONL naming them relative to it, and a
    last row naming a file that is not an image."""
    folder = root / "by-path"
    (folder / "images").mkdir(parents=True)
    rows = []
    for i, (text, pictures) in enumerate(zip(texts(), images())):
        names = []
        for k, picture in enumerate(pictures):
            suffix = "jpg" if picture.startswith(JPEG_START) else "png"
            name = f"images/{i}-{k}.{suffix}"
            (folder / name).write_bytes(picture)
            names.append(name)
        rows.append({"id": f"r{i}", "text": text, "image": names})
    (folder / "images" / "broken.png").write_bytes(b"not an image")
    rows.append({"id": f"r{ROWS}", "text": "red cat", "image": ["images/broken.png"]})
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return made_once(tmp_path_factory, "tiny-vlm", build_tiny_vlm) / "tiny-vlm"


@pytest.fixture(scope="module")
def runs(vlm, tmp_path_factory):
    """The two runs at once: vLLM over the bytes in one shard, transformers over the paths in three."""
    root = tmp_path_factory.mktemp("image-runs")
    planned = {"vllm": (root / "vllm-1", vlm_config(bytes_input(root), vlm, 1, "vllm")),
               "transformers": (root / "transformers-3",
                                vlm_config(paths_input(root), vlm, 3, "transformers",
                                           row_errors={"mode": "record", "max": 1}))}
    results = dict(zip(planned, run_workflows(list(planned.values()))))
    for result in results.values():
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return {name: (workdir, results[name]) for name, (workdir, _) in planned.items()}


def rows_of(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(row) for row in frame[COLUMNS].itertuples(index=False)]


pytestmark = pytest.mark.e2e


def test_three_shards_of_paths_on_transformers_equal_one_shard_of_bytes_on_vllm(runs):
    vllm, transformers = read_predictions(runs["vllm"][0]), read_predictions(runs["transformers"][0])
    assert vllm["id"].tolist() == [f"r{i}" for i in range(ROWS)]
    assert rows_of(transformers)[:ROWS] == rows_of(vllm)
    assert {"eos", "length"} <= set(vllm["finish_reason"])  # rows end both ways: the comparison covers both


def test_each_prompt_is_the_processors_expansion(runs, vlm):
    """vLLM ran (its outputs' prompt ids are checked against them) the ids the model's own processor
    makes of each row in the chat template, images expanded: n_prompt_tokens counts them, and a
    row without an image has its words and the template's three markers alone."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vlm)
    frame = read_predictions(runs["vllm"][0])
    for i, (text, pictures) in enumerate(zip(texts(), images())):
        opened = [Image.open(io.BytesIO(picture)).convert("RGB") for picture in pictures]
        content = text if "<image>" in text else [*[{"type": "image"}] * len(opened), {"type": "text", "text": text}]
        prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                                tokenize=False)
        expected = processor(text=[prompt], images=[opened] if opened else None,
                             add_special_tokens=False)["input_ids"][0]
        assert frame["n_prompt_tokens"][i] == len(expected), i
    assert frame["n_prompt_tokens"][NO_IMAGE] == len(texts()[NO_IMAGE].split()) + 2  # <|user|>, <|assistant|>


def test_an_unreadable_image_is_its_rows_error(runs):
    workdir, result = runs["transformers"]
    frame = read_predictions(workdir)
    errors = frame["error"].dropna()
    assert errors.index.tolist() == [ROWS]
    assert "input.image_column `image`, row 14: cannot read the image (`images/broken.png`" in errors[ROWS]
    assert pd.isna(frame["generated"][ROWS]) and pd.isna(frame["n_prompt_tokens"][ROWS])
    summary = json.loads((workdir / "results" / "summary.json").read_text())
    shards = summary["per_shard"]
    assert [s["row_errors"] for s in shards] == [0, 0, 1] and shards[2]["first_row_errors"] == [ROWS]
    assert f"WARNING 1 of {ROWS + 1} rows failed (first rows: {ROWS})" in result.stdout + result.stderr
