"""Images in, without Snakemake: where a prompt's images go (its image token, else in front: a
chat template's first user message, or tokens before a text), what is refused for a row (an
unreadable image, a count of placeholders other than the images', a prompt too long once its
images expand) and for a run (a column that holds no images, a model without a processor, a task
that reads none), and the transformers batch the processor makes (the rows' ids, left-padded)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import made_once
from factory import settings_for
from shardinfer.core.errors import UserError
from shardinfer.input.images import decoded, image_kind_problem, input_folder, row_images
from shardinfer.settings.config import BatchSettings, InputSettings, ModelSettings
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.generate.images import processor_batch
from shardinfer.tasks.generate.task import Generate
from tiny_vlm import build_tiny_vlm, image_bytes


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> Path:
    return made_once(tmp_path_factory, "tiny-vlm", build_tiny_vlm) / "tiny-vlm"


def settings(vlm: Path, conversations: bool = False, max_length: int = 80, path: str = "data/unused.parquet",
             **options):
    model = ModelSettings(path=str(vlm), adapter=None, task="generate", max_length=max_length, dtype="float32",
                          trust_remote_code=False, allow_pickle=False, max_new_tokens=4)
    prompt = "messages" if conversations else "text"
    inp = InputSettings(path=path, format="parquet", text_column="text", keep_columns=(), null_text="error",
                        task_columns=(prompt, "image"),
                        column_keys=("input.messages_column" if conversations else "input.text_column",
                                     "input.image_column"),
                        text_columns=() if conversations else ("text",),
                        conversation_columns=(prompt,) if conversations else (), image_columns=("image",))
    return settings_for(model, inp=inp, batch=BatchSettings(1000, 4, 64), task_settings=options)


@pytest.fixture(scope="module")
def task(vlm):
    """`task(**settings)`: the transformers engine's task with images, loaded once per settings."""
    cache = {}

    def loaded(**keys) -> Generate:
        key = repr(sorted(keys.items()))
        if key not in cache:
            cache[key] = Generate.load(LoadContext(settings(vlm, **keys), torch.device("cpu"), torch.float32))
        return cache[key]

    return loaded


def window(task: Generate, prompts: list, images: list, first: int = 0):
    kind = pa.list_(pa.binary())
    return task.images.window(first, pa.array(prompts), pa.array(images, type=kind))


def tokens(task: Generate, ids: list[int]) -> list[str]:
    return task.tokenizer.convert_ids_to_tokens(ids)


def test_an_image_goes_in_front_of_a_text_unless_the_text_places_it(task):
    picture = image_bytes(1)
    found, refused = window(task(), ["red cat", "red <image> cat", "red cat"], [[picture], [picture], []])
    assert not refused
    front, placed, none = (row.placeholder_ids for row in found.token_data["images"][:2]), found.ids[2], None
    assert tokens(task(), next(front)) == ["<s>", "<image>", "red", "cat"]
    assert tokens(task(), next(front)) == ["<s>", "red", "<image>", "cat"]
    assert tokens(task(), placed) == ["<s>", "red", "cat"] and found.token_data["images"][2] is none
    expanded = tokens(task(), found.ids[0])
    assert expanded.count("<image>") > 4 and "<fake_token_around_image>" in expanded  # the processor's expansion


def test_under_a_chat_template_images_open_the_first_user_message(task):
    picture = image_bytes(2)
    conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "red cat"},
                    {"role": "assistant", "content": "dog"}, {"role": "user", "content": "blue"}]
    found, refused = task(conversations=True).images.window(
        0, pa.array([conversation]), pa.array([[picture, picture]], type=pa.list_(pa.binary())))
    assert not refused
    assert found.token_data["images"][0].prompt == ("<|system|> be brief <|user|> <image><image>red cat "
                                                    "<|assistant|> dog <|user|> blue <|assistant|>")
    text, _ = window(task(chat_template=True, system_prompt="look"), ["red cat"], [[picture]])
    assert text.token_data["images"][0].prompt == "<|system|> look <|user|> <image>red cat <|assistant|>"


def test_a_conversations_image_parts_place_its_images(task):
    """HF's chat format: {"type": "image"} parts take the row's images in order; the parts' count
    must be the images'; any other part is refused for the row."""
    picture = image_bytes(10)
    parts = [{"type": "text", "text": "red", "image": None}, {"type": "image", "text": None},
             {"type": "text", "text": "cat", "image": None}]
    rows = [[{"role": "user", "content": parts}], [{"role": "user", "content": parts}],
            [{"role": "user", "content": [{"type": "video"}]}]]
    found, refused = task(conversations=True).images.window(
        0, pa.array(rows), pa.array([[picture], [picture, picture], [picture]], type=pa.list_(pa.binary())))
    assert found.token_data["images"][0].prompt == "<|user|> red<image>cat <|assistant|>"
    assert refused == {1: "input.messages_column `messages`, row 1: the prompt holds 1 image placeholder(s) "
                          "(<image>) for 2 image(s)",
                       2: "input.messages_column `messages`, row 2: message 0 has a content part that is neither "
                          "{type: text, text} nor {type: image}"}


def test_the_plan_measures_a_conversations_text_parts(vlm, tmp_path):
    from shardinfer.input.scan import scan_input

    data = tmp_path / "parts.parquet"
    parts = [{"type": "image", "text": None}, {"type": "text", "text": "red cat"}]
    pq.write_table(pa.table({"messages": [[{"role": "user", "content": parts}]], "image": [[image_bytes(11)]]}), data)
    scan = scan_input(settings(vlm, conversations=True, path=str(data)).input)
    assert scan.rows == 1 and scan.chars.tolist() == [len("red cat") + 16]  # the text, and the message's markers


def test_rows_that_cannot_run_are_refused_naming_the_row_and_why(task, tmp_path):
    picture = image_bytes(3)
    found, refused = window(task(), ["red", "red <image> <image>", "red <image>", "cat " * 90],
                            [[b"not an image"], [picture], [], [picture]], first=100)
    assert found.ids[0] == [] and sorted(refused) == [0, 1, 2, 3]
    assert refused[0].startswith("input.image_column `image`, row 100: cannot read the image (12 bytes: ")
    assert refused[1] == ("input.text_column `text`, row 101: the prompt holds 2 image placeholder(s) (<image>) "
                          "for 1 image(s)")
    assert refused[2].endswith("row 102: the prompt holds 1 image placeholder(s) (<image>) for 0 image(s)")
    assert "row 103: the prompt is" in refused[3] and "above model.max_length 80 (a prompt with images is not cut)" \
        in refused[3]


def test_a_shard_without_record_fails_in_one_line_naming_the_row(task):
    table = pa.table({"text": ["red", "cat"], "image": pa.array([[image_bytes(4)], [b"\x89PNG broken"]],
                                                                  type=pa.list_(pa.binary()))})
    with pytest.raises(UserError, match=r"^input.image_column `image`, row 8: cannot read the image \(11 bytes: "):
        task().prepare(7, table)


def test_the_processors_batch_holds_each_rows_ids_left_padded(task):
    loaded = task()
    found, _ = window(loaded, ["red cat", "a", "<image> one <image> two big"],
                      [[image_bytes(5)], [image_bytes(6)], [image_bytes(7), image_bytes(8)]])
    rows = found.token_data["images"]
    batch = processor_batch(loaded.images.processor, rows, found.ids, loaded.pad_id)
    width = max(len(ids) for ids in found.ids)
    for k, ids in enumerate(found.ids):
        assert batch["input_ids"][k].tolist() == [loaded.pad_id] * (width - len(ids)) + ids
    assert batch["pixel_values"].shape[0] == 3 and "pixel_attention_mask" in batch
    with pytest.raises(UserError, match="gave a row other prompt ids in a batch than alone"):
        processor_batch(loaded.images.processor, rows, [found.ids[1], found.ids[0], found.ids[2]], loaded.pad_id)


def png(seed: int) -> bytes:
    return image_bytes(seed, "PNG")


def test_image_values_paths_and_types(tmp_path):
    assert row_images(None) == [] and row_images(b"x") == [b"x"] and row_images("a.png") == ["a.png"]
    assert row_images([{"bytes": None, "path": "a.png"}, {"bytes": b"x", "path": "b.png"}]) == ["a.png", b"x"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.png").write_bytes(png(9))
    assert input_folder(str(tmp_path / "in")) == tmp_path / "in"
    assert input_folder(str(tmp_path / "in" / "rows.jsonl")) == tmp_path / "in"
    assert input_folder(str(tmp_path / "in" / "*.jsonl")) == tmp_path / "in"
    assert decoded("a.png", tmp_path / "in").mode == "RGB"
    with pytest.raises(ValueError, match="`b.png`: .*No such file"):
        decoded("b.png", tmp_path / "in")
    with pytest.raises(ValueError, match="is a URL; images are read from bytes or local paths only"):
        decoded("https://example.com/a.png", tmp_path)
    for allowed in (pa.binary(), pa.string(), pa.list_(pa.large_binary()),
                    pa.struct([("bytes", pa.binary()), ("path", pa.string())])):
        assert image_kind_problem(allowed) is None
    assert image_kind_problem(pa.int64()).startswith("holds int64, not images: encoded image bytes (binary)")


def test_what_images_need_is_refused_before_any_job(vlm, tmp_path):
    from shardinfer.input.scan import scan_input
    from shardinfer.snakefile.configure import task_inputs
    from shardinfer.tasks.generate.images import check_image_settings

    inp = {"text_column": "text", "image_column": "image", "messages_column": None}
    with pytest.raises(UserError, match=r"^input.image_column is for task generate \(vision-language models\); "
                                        "task embed reads no images"):
        task_inputs("embed", inp, {})
    with pytest.raises(UserError, match="input.image_column `text` is the prompts' column too"):
        task_inputs("generate", {**inp, "image_column": "text"}, {})
    assert task_inputs("generate", inp, {}).columns == ("text", "image")
    bare = tmp_path / "no-processor"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"model.path `.*no-processor` has none \(processor_config.json or "):
        check_image_settings(settings(bare))
    data = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": ["a"], "image": [3]}), data)
    with pytest.raises(UserError, match=r"^input.image_column `image` holds int64, not images"):
        scan_input(settings(vlm, path=str(data)).input)


def test_the_digest_takes_the_image_column_only_when_set(vlm):
    import dataclasses

    from shardinfer.snakefile.settings_digest import output_digest

    with_images = settings(vlm)
    without = dataclasses.replace(with_images, input=dataclasses.replace(
        with_images.input, task_columns=("text",), column_keys=("input.text_column",), image_columns=()))
    assert output_digest(with_images, ([], [])) != output_digest(without, ([], []))


def test_decoded_images_are_rgb_whatever_their_mode(tmp_path):
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (7, 5), 128).save(buffer, format="PNG")
    assert decoded(buffer.getvalue(), tmp_path).mode == "RGB"


def test_a_row_with_more_images_than_vllm_takes_is_refused_before_the_engine(task, vlm):
    """vLLM fails a whole call on a prompt over its `limit_mm_per_prompt`: the row is refused first."""
    from shardinfer.tasks.generate.images import ImagePrompts

    limited = settings(vlm, engine="vllm", vllm={"limit_mm_per_prompt": {"image": 1}})
    prompts = ImagePrompts(task().images.processor, limited, False, None)
    images = pa.array([[image_bytes(1)], [image_bytes(2), image_bytes(3)]], pa.list_(pa.binary()))
    found, refused = prompts.window(20, pa.array(["red", "cat"]), images)
    assert refused == {1: "input.image_column `image`, row 21: 2 images, above generate.vllm.limit_mm_per_prompt "
                          "image 1 (what vLLM takes per prompt)"}
    assert found.ids[0] and found.ids[1] == []
