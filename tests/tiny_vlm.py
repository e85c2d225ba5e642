"""A tiny vision-language model built from a config (no downloads): Idefics3, the architecture of
SmolVLM and SmolDocling, which loads on both engines here (vLLM's CPU build without torchvision:
the LLaVA and Qwen-VL processors need it). A SigLIP-style vision tower of 32x32 tiles in 8x8
patches, a pixel shuffle (scale 2: 4 image tokens per tile) and the tests' tiny Llama over WORDS;
random weights with a large spread, as tiny_models.tiny_llama's, and eos drawn like a word so that
some rows end early. Its processor: Idefics3's PIL image processor (at most 2x2 tiles of 32 plus a
global tile) and a word-level tokenizer that knows the image tokens, with a chat template of SmolVLM's
shape: it takes content parts only ({"type": "image"}, {"type": "text", "text": ...}), no string.
"""

from __future__ import annotations

import io
from pathlib import Path

from factory import WORDS
from tiny_models import CAUSAL_SPECIALS, CAUSAL_WORDS, spread_weights

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]
# SmolVLM's default template's shape: each message's content looped over as parts, no branch for a
# string (a string's characters would render as nothing: the prompt is given parts, as LLM.chat gives them).
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %} {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def word_tokenizer_with_images():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [*CAUSAL_SPECIALS, *IMAGE_TOKENS]
    vocab = {token: i for i, token in enumerate([*specials, *CAUSAL_WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>", model_max_length=512)
    tokenizer.add_special_tokens({"additional_special_tokens": specials[4:]})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    return tokenizer, vocab


def build_tiny_vlm(root: Path) -> Path:
    """The tiny Idefics3 and its processor, saved in root/tiny-vlm."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, LlamaConfig
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    path = root / "tiny-vlm"
    tokenizer, vocab = word_tokenizer_with_images()
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=32, patch_size=8)
    text = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                       pad_token_id=0, bos_token_id=2, eos_token_id=3, tie_word_embeddings=False)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(), scale_factor=2,
                            image_token_id=vocab["<image>"], tie_word_embeddings=False, pad_token_id=0,
                            eos_token_id=3)
    torch.manual_seed(31)
    model = spread_weights(Idefics3ForConditionalGeneration(config))
    with torch.no_grad():
        head = model.lm_head.weight
        head[3] = 1.25 * head[vocab[WORDS[WORDS.index("bird")]]]
    model.save_pretrained(path)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 64}, max_image_size={"longest_edge": 32},
                                                do_image_splitting=True)
    Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                      chat_template=VLM_CHAT_TEMPLATE).save_pretrained(path)
    return path


def image_bytes(seed: int, kind: str = "PNG") -> bytes:
    """A random RGB image of a size between 10x10 and 100x80, encoded (PNG or JPEG)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = int(rng.integers(10, 101)), int(rng.integers(10, 81))
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format=kind)
    return buffer.getvalue()
