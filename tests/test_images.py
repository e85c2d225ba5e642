"""Images in (`input.image_column`): a tiny vision-language model (Idefics3, tests/tiny_vlm.py) through
real `snakemake` runs on both engines, and the rules that place images in a prompt.

The model's chat template has SmolVLM's shape (it loops over content parts, no branch for a string).
Two runs, made together and shared, both through the chat template (each image a part in front of
its prompt, unless the prompt places it) and with `row_errors: record`: a Parquet file of image bytes
on vLLM's engine in one shard, at most two images a prompt (`limit_mm_per_prompt`), and a folder of
images named by relative paths (the same images, as files) on the transformers engine in three
shards, one more row naming an image that is not an image. Row for row they must agree: three shards
equal one, paths equal bytes, transformers equals vLLM (greedy, float32); the unreadable image is its
row's error alone, and so on vLLM is the row of three images. Then the paths' run again, once, after
an image was replaced under its name (older mtime, as `cp -p` leaves it) and another edited with its
size and mtime put back: exactly the replaced image's shard reruns, and gather refuses the edited one.
Beside the runs, a probe (tests/image_probe.py) asks vLLM's `LLM.chat` for the prompt ids of the
rows that give their images as parts (and of the row without one): the vLLM task's are the same.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from conftest import made_once
from factory import WORDS, python_env, read_predictions, run_workflow, run_workflows
from tiny_vlm import build_tiny_vlm, image_bytes

ROWS = 14  # the shared rows; the paths' input has one more, whose image cannot be read
COLUMNS = ["generated", "n_prompt_tokens", "n_generated_tokens", "finish_reason"]
JPEG_START = bytes([0xFF, 0xD8])
NO_IMAGE, PLACED, TWO, THREE = 5, 8, 11, 13  # a row without an image; whose text places it; of two; of three
VLLM_LIMIT = {"image": 2}  # generate.vllm.limit_mm_per_prompt: row THREE is refused on vLLM alone


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
    rows[THREE] = [image_bytes(102), image_bytes(103), image_bytes(104)]
    return rows


def vlm_config(data: Path, vlm: Path, shards: int, engine: str, **extra) -> dict:
    return {"input": {"path": str(data), "image_column": "image", "keep_columns": ["id"]},
            "model": {"path": str(vlm), "task": "generate", "max_length": 96, "max_new_tokens": 12},
            "generate": {"engine": engine, "chat_template": True,
                         **({"vllm": {"limit_mm_per_prompt": VLLM_LIMIT}} if engine == "vllm" else {})},
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
    """The two runs at once: vLLM over the bytes in one shard, transformers over the paths in three;
    the LLM.chat probe beside them (it reads the vLLM run's config)."""
    root = tmp_path_factory.mktemp("image-runs")
    record = {"mode": "record", "max": 1}
    planned = {"vllm": (root / "vllm-1", vlm_config(bytes_input(root), vlm, 1, "vllm", row_errors=record)),
               "transformers": (root / "transformers-3",
                                vlm_config(paths_input(root), vlm, 3, "transformers", row_errors=record))}
    (root / "vllm-1" / "config").mkdir(parents=True)
    (root / "vllm-1" / "config" / "config.yaml").write_text(json.dumps(planned["vllm"][1]))
    probe = subprocess.Popen([sys.executable, str(Path(__file__).with_name("image_probe.py")), str(root / "vllm-1"),
                              str(root / "chat.json")], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=python_env())
    results = dict(zip(planned, run_workflows(list(planned.values()))))
    for result in results.values():
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    out, err = probe.communicate(timeout=900)
    assert probe.returncode == 0, out[-3000:] + err[-6000:]
    runs = {name: (workdir, results[name], config) for name, (workdir, config) in planned.items()}
    return {**runs, "chat": json.loads((root / "chat.json").read_text())}


def rows_of(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(row) for row in frame[COLUMNS].itertuples(index=False)]


pytestmark = pytest.mark.e2e


def test_three_shards_of_paths_on_transformers_equal_one_shard_of_bytes_on_vllm(runs):
    vllm, transformers = read_predictions(runs["vllm"][0]), read_predictions(runs["transformers"][0])
    assert vllm["id"].tolist() == [f"r{i}" for i in range(ROWS)]
    others = [i for i in range(ROWS) if i != THREE]
    assert [rows_of(transformers)[i] for i in others] == [rows_of(vllm)[i] for i in others]
    assert {"eos", "length"} <= set(vllm["finish_reason"])  # rows end both ways: the comparison covers both


def test_a_row_over_vllms_image_limit_is_its_rows_error_there_alone(runs):
    """Checked before the engine: vLLM would fail the whole window on it."""
    vllm, transformers = read_predictions(runs["vllm"][0]), read_predictions(runs["transformers"][0])
    assert vllm["error"].dropna().to_dict() == {
        THREE: f"RowError: input.image_column `image`, row {THREE}: 3 images, above generate.vllm.limit_mm_per_prompt "
               "image 2 (what vLLM takes per prompt)"}
    assert pd.isna(vllm["generated"][THREE]) and isinstance(transformers["generated"][THREE], str)


def test_each_prompt_is_the_processors_expansion(runs, vlm):
    """vLLM ran (its outputs' prompt ids are checked against them) the ids the model's own processor
    makes of each row in the chat template, images expanded: n_prompt_tokens counts them, and a
    row without an image has its words and the template's three markers alone."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vlm)
    frames = {"vllm": read_predictions(runs["vllm"][0]), "transformers": read_predictions(runs["transformers"][0])}
    for i, (text, pictures) in enumerate(zip(texts(), images())):
        frame = frames["transformers" if i == THREE else "vllm"]  # vLLM refuses three images (VLLM_LIMIT)
        opened = [Image.open(io.BytesIO(picture)).convert("RGB") for picture in pictures]
        in_front = [] if "<image>" in text else [{"type": "image"}] * len(opened)
        content = [*in_front, {"type": "text", "text": text}]  # parts: the template takes no string
        prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                                tokenize=False)
        expected = processor(text=[prompt], images=[opened] if opened else None,
                             add_special_tokens=False)["input_ids"][0]
        assert frame["n_prompt_tokens"][i] == len(expected), i
    assert frames["vllm"]["n_prompt_tokens"][NO_IMAGE] == len(texts()[NO_IMAGE].split()) + 2  # <|user|>, <|assistant|>


def test_every_prompt_is_llm_chats(runs):
    """The rows that give their images as parts in front of the text, and the row without an image
    (a string, which the template takes as a text part only): LLM.chat's ids are the vLLM task's,
    which its run ran (their counts too)."""
    chat = runs["chat"]
    assert chat["rows"] == [i for i in range(ROWS) if i not in (PLACED, TWO, THREE)] and NO_IMAGE in chat["rows"]
    assert chat["chat"] == chat["ours"]
    counts = read_predictions(runs["vllm"][0])["n_prompt_tokens"]
    assert [counts[i] for i in chat["rows"]] == [len(ids) for ids in chat["chat"]]


def test_an_unreadable_image_is_its_rows_error(runs):
    workdir, result, _ = runs["transformers"]
    frame = read_predictions(workdir)
    errors = frame["error"].dropna()
    assert errors.index.tolist() == [ROWS]
    assert "input.image_column `image`, row 14: cannot read the image (`images/broken.png`" in errors[ROWS]
    assert pd.isna(frame["generated"][ROWS]) and pd.isna(frame["n_prompt_tokens"][ROWS])
    summary = json.loads((workdir / "results" / "summary.json").read_text())
    shards = summary["per_shard"]
    assert [s["row_errors"] for s in shards] == [0, 0, 1] and shards[2]["first_row_errors"] == [ROWS]
    assert f"WARNING 1 of {ROWS + 1} rows failed (first rows: {ROWS})" in result.stdout + result.stderr


def one_image_rows(plan: dict, shard: int) -> list[int]:
    """The rows of a shard of the paths' run that hold exactly one image."""
    counts = [len(pictures) for pictures in images()]
    entry = plan["shards"][shard]
    return [i for i in range(entry["start"], min(entry["end"], ROWS)) if counts[i] == 1]


def image_name(folder: Path, row: int) -> str:
    return next(path.name for path in (folder / "images").glob(f"{row}-0.*"))


@pytest.fixture(scope="module")
def changed_images(runs):
    """The paths' run again after row `replaced`'s image (in shard 1) was replaced by another under its
    name, with an older mtime, and row `edited`'s image (in shard 0) edited with its size and mtime put
    back: what each shard file was before and after, and the run."""
    import os

    workdir, _, config = runs["transformers"]
    folder = Path(config["input"]["path"]).parent
    plan = json.loads((workdir / "results" / "plan.json").read_text())
    replaced, edited = one_image_rows(plan, 1)[0], one_image_rows(plan, 0)[0]
    shards = [workdir / "results" / "shards" / f"{k}.parquet" for k in range(3)]
    before = [(path.stat().st_mtime_ns, pd.read_parquet(path)) for path in shards]
    target = folder / "images" / image_name(folder, replaced)
    old = target.stat()
    target.write_bytes(image_bytes(200, "JPEG" if target.suffix == ".jpg" else "PNG"))
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns - 10**9))
    other = folder / "images" / image_name(folder, edited)
    stat, data = other.stat(), bytearray(other.read_bytes())
    data[len(data) // 2] ^= 0xFF
    other.write_bytes(bytes(data))
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = run_workflow(workdir, config)
    after = [(path.stat().st_mtime_ns, pd.read_parquet(path)) for path in shards]
    return {"replaced": replaced, "edited": edited, "before": before, "after": after, "result": result,
            "plan": plan, "workdir": workdir, "folder": folder}


def test_a_replaced_image_reruns_exactly_its_shard(changed_images):
    before, after = changed_images["before"], changed_images["after"]
    assert [b[0] == a[0] for b, a in zip(before, after)] == [True, False, True]  # shard 1 alone was rewritten
    row = changed_images["replaced"]
    old, new = before[1][1].set_index("index"), after[1][1].set_index("index")
    assert old.loc[row, COLUMNS].tolist() != new.loc[row, COLUMNS].tolist()  # the new image's row
    assert old.drop(index=row)[COLUMNS].equals(new.drop(index=row)[COLUMNS])  # its other rows: as they were
    plan = json.loads((changed_images["workdir"] / "results" / "plan.json").read_text())
    assert plan == changed_images["plan"]  # not replanned


def test_gather_refuses_an_image_edited_since_its_shard_read_it(changed_images):
    result, row = changed_images["result"], changed_images["edited"]
    assert result.returncode != 0
    name = image_name(changed_images["folder"], row)
    found = [line for line in (result.stdout + result.stderr).splitlines()
             if f"image `images/{name}` (row {row}) has other content" in line]
    assert found and found[0].endswith("since shard 0 read it; rerun that shard (snakemake --forcerun "
                                       "results/shards/0.parquet)"), result.stderr[-3000:]
    assert not (changed_images["workdir"] / "results" / "predictions.parquet").exists()  # no stale table
