"""Images in, for vision-language models (`input.image_column`, task generate, both engines).

- **The column** holds per row an image or a list of them: encoded bytes (Parquet binary), a
  path relative to the input's folder (a string: JSONL's base64 is not decoded), or a Hugging Face
  `datasets` Image struct {bytes, path}; null or an empty list: no image. Each image is decoded with
  PIL in the shard's prepare stage (the shard's own rows only) and converted to RGB, so both engines
  get the same pixels; one that cannot be read, or a row of more images than vLLM takes
  (`generate.vllm.limit_mm_per_prompt`), is its row's error (`row_errors: record`) or fails the
  shard in one line naming the row. A file read by path is recorded as read (size, times, SHA-256:
  `ImagePrompts.read`, the task's stats), which gather proves (`shardinfer.input.image_files`).
- **The prompt** (a text, or a conversation whose contents are strings or HF chat parts: an
  {"type": "image"} part takes the row's next image) gets its images where it holds the
  processor's image token (`<image>`) or image parts, one per image; where it holds none, in front: as
  {"type": "image"} parts opening its (first) user message under a chat template (the processor's
  own template, which renders them as that token), as tokens before the text otherwise. Under a
  chat template every content goes in the shape the template takes (`chat_content`, as vLLM's
  `LLM.chat`: parts, a string one text part; or a string, parts joined by line breaks with the image
  token for each image part in front), and a prompt that lost a message's text is refused for the
  row. A count of placeholders other than the images' is refused for the row: vLLM would read a
  spare `<image>` as text, silently.
- **The model's own processor** (transformers `AutoProcessor` of model.path) expands each image
  token into the model's image tokens: those expanded ids are the row's prompt, its length (costs,
  `n_prompt_tokens`) and what both engines run. A prompt with images is never cut: one longer than
  model.max_length once expanded is refused for the row (cutting would split an image's tokens).
- **The engines:** transformers gets a batch's prompts and images through the processor
  (`processor_batch`: its pixel values and masks beside the ids, checked equal to the row's
  expanded ids); vLLM gets the ids with one image token per image and the images as
  `multi_modal_data` (vLLM expands them itself: ids expanded already would be expanded twice), and
  its outputs' prompt ids are checked equal to the processor's expansion (`engines.vllm.matching`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from shardinfer.core.errors import UserError
from shardinfer.core.model_folder import PROCESSOR_FILES, model_config, processor_config
from shardinfer.hf.tokens import TokenWindow
from shardinfer.input.images import decoded, input_folder, row_images
from shardinfer.input.scan import text_values
from shardinfer.tasks.generate.chat_content import STRING, lost_text, shaped
from shardinfer.tasks.generate.prompts import Refused, conversation_of, with_system


class RowRefused(ValueError):
    """Why a row cannot run: its image (`of_image`), or its prompt with its images."""

    def __init__(self, why: str, of_image: bool = False) -> None:
        super().__init__(why)
        self.of_image = of_image


@dataclass(frozen=True)
class ImageRow:
    """A row's images (decoded) and its prompt ids with one image token per image (what vLLM gets)."""

    pictures: list
    placeholder_ids: list[int]
    prompt: str  # the rendered prompt text, for the processor's batch (transformers engine)
    special: bool  # whether the tokenizer adds its special tokens (not under a chat template)


class ImagePrompts:
    """A window's prompts with their images, rendered and expanded by the model's processor."""

    def __init__(self, processor, settings, chat_template: bool, system: str | None, form: str = STRING) -> None:
        """`form`: the processor's template's content format (`chat_content`)."""
        self.processor, self.tokenizer, self.form = processor, processor.tokenizer, form
        self.token = getattr(processor, "image_token", None) or "<image>"
        self.token_id = self.tokenizer.convert_tokens_to_ids(self.token)
        self.max_length = settings.model.max_length
        self.conversations = bool(settings.input.conversation_columns)
        self.chat_template, self.system = chat_template or self.conversations, system
        self.column = settings.input.image_columns[0]
        self.prompt_key = f"{settings.input.column_keys[0]} `{settings.input.task_columns[0]}`"
        self.folder = input_folder(settings.input.path)
        self.null_as_empty = settings.input.null_text == "empty"
        self.limit = image_limit(settings.task_settings)
        # The image files read by path: {name: {row, size, mtime_ns, ctime_ns, sha256}} (Task.finish).
        self.read: dict[str, dict] = {}

    def window(self, first: int, prompts: pa.Array, images: pa.Array) -> tuple[TokenWindow, dict[int, str]]:
        """Per row, its expanded prompt ids (and in token_data["images"] its ImageRow, None for a row
        without images), and the rows refused (position -> why)."""
        texts = prompts.to_pylist() if self.conversations else text_values(prompts, self.null_as_empty)
        ids, rows, refused = [], [], {}
        for position, (prompt, value) in enumerate(zip(texts, images.to_pylist())):
            try:
                row_ids, row = self.row(prompt, row_images(value), first + position)
            except RowRefused as why:
                row_ids, row = [], None
                key = f"input.image_column `{self.column}`" if why.of_image else self.prompt_key
                refused[position] = f"{key}, row {first + position}: {why}"
            ids.append(row_ids)
            rows.append(row)
        return TokenWindow(first, ids, [], {"images": rows}), refused

    def row(self, prompt: Any, images: list, index: int) -> tuple[list[int], ImageRow | None]:
        """(expanded ids, the row's ImageRow or None); RowRefused for a row that cannot run."""
        if self.limit is not None and len(images) > self.limit:
            raise RowRefused(f"{len(images)} images, above generate.vllm.limit_mm_per_prompt image {self.limit} (what "
                             "vLLM takes per prompt)", of_image=True)
        read: dict[str, dict] = {}
        try:
            pictures = [decoded(image, self.folder, read) for image in images]
        except ValueError as why:
            raise RowRefused(str(why), of_image=True) from None
        finally:
            self.read.update({name: {"row": index, **identity} for name, identity in read.items()})
        text = self.rendered(prompt, len(pictures))
        special = not self.chat_template  # a chat template writes its own special tokens
        placeholder_ids = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        held = placeholder_ids.count(self.token_id)
        if held != len(pictures):
            raise RowRefused(f"the prompt holds {held} image placeholder(s) ({self.token}) for {len(pictures)} "
                             "image(s)")
        if not pictures:
            expanded, row = placeholder_ids, None
        else:
            try:
                expanded = self.processor(text=[text], images=[pictures], add_special_tokens=special)["input_ids"][0]
            except (ValueError, TypeError, IndexError) as error:
                why = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise RowRefused(f"the model's processor refuses its image(s) ({why})", of_image=True) from None
            expanded, row = [int(i) for i in expanded], ImageRow(pictures, placeholder_ids, text, special)
        if len(expanded) > self.max_length:
            raise RowRefused(f"the prompt is {len(expanded)} tokens with its {len(pictures)} image(s) expanded, above "
                             f"model.max_length {self.max_length} (a prompt with images is not cut)")
        return expanded, row

    def rendered(self, prompt: Any, images: int) -> str:
        """The prompt as text, its images placed (the module's rule)."""
        if self.conversations:
            try:
                messages = with_system(conversation_of(prompt, images=True), self.system)
            except Refused as why:
                raise RowRefused(str(why)) from None
        else:
            head = [{"role": "system", "content": self.system}] if self.system else []
            messages = [*head, {"role": "user", "content": prompt}]
        if not self.chat_template:
            return prompt if self.token in prompt else self.token * images + prompt
        if images and not self.placed(messages):
            user = next((k for k, m in enumerate(messages) if m["role"] == "user"), len(messages) - 1)
            content = messages[user]["content"]
            parts = [{"type": "image"}] * images + ([{"type": "text", "text": content}] if isinstance(content, str)
                                                    else content)
            messages = [*messages[:user], {**messages[user], "content": parts}, *messages[user + 1:]]
        from jinja2 import TemplateError

        try:
            text = self.processor.apply_chat_template(shaped(messages, self.form, self.token),
                                                      add_generation_prompt=True, tokenize=False)
        except (TemplateError, ValueError, TypeError, KeyError) as error:
            why = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RowRefused(f"the chat template refuses it ({why})") from None
        lost = lost_text(messages, text)
        if lost:
            raise RowRefused(lost)
        return text

    def placed(self, messages: list[dict]) -> bool:
        """Whether the messages place images themselves: an image part, or the image token in a text."""
        for message in messages:
            content = message["content"]
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            if any(part["type"] == "image" or self.token in part["text"] for part in parts):
                return True
        return False


def image_limit(options) -> int | None:
    """The images vLLM takes per prompt, as `generate.vllm.limit_mm_per_prompt` sets them ({"image": N});
    None: unset (the model's own limit) or another engine."""
    if options.get("engine") != "vllm":
        return None
    limits = (options.get("vllm") or {}).get("limit_mm_per_prompt")
    if isinstance(limits, str):
        try:
            limits = json.loads(limits)
        except ValueError:
            return None
    image = limits.get("image") if isinstance(limits, dict) else None
    if isinstance(image, dict):  # vLLM's newer form: {"image": {"count": N, ...}}
        image = image.get("count")
    return image if isinstance(image, int) else None


def processor_batch(processor, rows: list[ImageRow], expected: list[list[int]], pad_id: int) -> dict:
    """A transformers batch of image rows through the processor (left-padded ids, pixel values and
    whatever else the model takes), its ids checked equal to each row's expanded prompt."""
    import torch

    out = processor(text=[row.prompt for row in rows], images=[row.pictures for row in rows], padding=True,
                    padding_side="left", return_tensors="pt", add_special_tokens=rows[0].special)
    ids, mask = out["input_ids"], out["attention_mask"]
    for k, want in enumerate(expected):
        got = ids[k][mask[k].bool()].tolist()
        if got != list(want):
            raise UserError(f"the model's processor gave a row other prompt ids in a batch than alone ({len(got)} "
                            f"tokens, not {len(want)})")
    inputs = {name: value for name, value in out.items() if isinstance(value, torch.Tensor)}
    inputs["input_ids"] = ids.masked_fill(mask == 0, pad_id)
    return inputs


# Tokens per image when neither the processor's nor the model's config says: LLaVA's 24 x 24 patches.
IMAGE_TOKENS_UNKNOWN = 576
SEQUENCE_KEYS = ("image_seq_len", "image_seq_length", "num_image_tokens")


def image_token_estimate(model_path: str) -> int:
    """Tokens an image adds to its prompt, for the plan's cost (never exact: the processor's expansion
    depends on the image's size), from the model folder's JSON: the processor's tokens per tile
    (`image_seq_len`, ...), else the vision config's patches (image_size / patch_size, squared,
    over a pixel shuffle's scale_factor squared), else IMAGE_TOKENS_UNKNOWN; times the tiles an
    image-splitting processor cuts a large image into (its size over its tile size, squared, plus
    the global tile). Torch-free: read when the Snakefile loads."""
    processor = processor_config(model_path)
    images = processor.get("image_processor") or processor
    config = model_config(model_path)
    vision = config.get("vision_config") or {}
    tokens = next((int(processor[key]) for key in SEQUENCE_KEYS if isinstance(processor.get(key), int)), None)
    if tokens is None and vision.get("image_size") and vision.get("patch_size"):
        patches = (int(vision["image_size"]) // int(vision["patch_size"])) ** 2
        tokens = patches // int(config.get("scale_factor") or 1) ** 2
    tiles = 1
    size = (images.get("size") or {}).get("longest_edge")
    tile = (images.get("max_image_size") or {}).get("longest_edge")
    if images.get("do_image_splitting") and size and tile:
        tiles = (-(-int(size) // int(tile))) ** 2 + 1
    return max(tokens or IMAGE_TOKENS_UNKNOWN, 1) * tiles


def has_processor(model_path: str) -> bool:
    return any((Path(model_path) / name).is_file() for name in PROCESSOR_FILES)


def check_image_settings(settings) -> None:
    """Before any job: a model folder with a processor, which images need."""
    path = settings.model.path
    if not has_processor(path):
        raise UserError(f"input.image_column `{settings.input.image_columns[0]}` needs the model's processor, and "
                        f"model.path `{path}` has none ({' or '.join(PROCESSOR_FILES)}): use a vision-language "
                        "model's folder as saved by save_pretrained with its processor")


def load_processor(settings):
    """The model folder's processor (its tokenizer and image processor), left-padding its batches."""
    from transformers import AutoProcessor

    from shardinfer.core.errors import first_line

    try:
        processor = AutoProcessor.from_pretrained(settings.model.path, local_files_only=True,
                                                  trust_remote_code=settings.model.trust_remote_code)
    except (OSError, ValueError, TypeError, ImportError) as error:
        raise UserError(f"model.path `{settings.model.path}`: its processor cannot be loaded for "
                        f"input.image_column ({first_line(error)})") from None
    if not hasattr(processor, "tokenizer") or not hasattr(processor, "image_processor"):
        raise UserError(f"model.path `{settings.model.path}`: its processor ({type(processor).__name__}) takes no "
                        "images, which input.image_column needs")
    processor.tokenizer.padding_side = "left"
    return processor
