"""The tiny random models the tests build beside tiny_workflow's classifier and encoder: causal LMs
(a Llama over a word-level vocabulary, one over a byte-level BPE, a copy whose tokenizer knows
words its embedding lacks), a cross-encoder for task score, a tagger for task token-classify, and
a LoRA on an encoder as shipped. BERTs with heads of 32 dimensions (`POOLING_SHAPE`) serve the
encoder tasks on vLLM's CPU build (its attention takes sizes 32 and up; tiny_workflow's have two of
16). Nothing is downloaded: each is drawn from a config with a fixed seed, so every build is the
same model (tests/conftest.py builds the shared ones once per test run). tests/factory.py holds the
inputs, settings and runs that use them.
"""

from __future__ import annotations

import random
from pathlib import Path

from tiny_workflow import LABELS, MAX_POSITIONS, WORDS, bert_config, save_lora, save_tokenizer


def spread_weights(model, std: float = 0.5):
    """The model with its matrices drawn again from normal(0, std): a large spread, so that a tiny random
    model's outputs differ visibly from row to row (and from a wrong reading of its inputs)."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, std)
    return model


TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC", 5: "MISC"}  # the tagger's labels


def build_tiny_tagger(root: Path) -> Path:
    """A tiny BERT token classifier over WORDS for task token-classify, tagging TAGS, its weights spread
    wide (normal(0, 0.5)) so that every tag occurs and entities of several tokens form."""
    import torch
    from transformers import BertForTokenClassification

    path = root / "tagger"
    torch.manual_seed(5)
    config = bert_config(num_labels=len(TAGS), id2label=TAGS, label2id={v: k for k, v in TAGS.items()})
    spread_weights(BertForTokenClassification(config)).save_pretrained(path)
    save_tokenizer(path)
    return path


def build_tiny_cross_encoder(root: Path, num_labels: int = 1) -> Path:
    """A tiny BERT cross-encoder over WORDS for task score: one label (its logit is a pair's score;
    other counts for the refusal), two token types. Random weights drawn with a large spread
    (normal(0, 0.5)), so scores vary from pair to pair and a pair read as one segment (token types
    all 0) scores visibly otherwise."""
    import torch
    from transformers import BertForSequenceClassification

    path = root / f"cross-encoder-{num_labels}"
    torch.manual_seed(13)
    model = spread_weights(BertForSequenceClassification(bert_config(num_labels=num_labels, type_vocab_size=2)))
    model.save_pretrained(path)
    save_tokenizer(path)
    return path


# One head of 32 dimensions: the smallest BERT vLLM's CPU attention runs (tiny_workflow's have two of 16).
POOLING_SHAPE = {"num_attention_heads": 1}
TAGS = {0: "O", 1: "B-PER", 2: "I-PER"}


def build_tiny_pooling_models(root: Path) -> None:
    """Tiny BERTs for the encoder tasks on vLLM's pooling runner, one head of 32 (`pooling_model_paths`
    names them): an encoder (embed) and a LoRA on it (init_lora_weights=False, no head), a classifier
    (3 labels), a cross-encoder (score: one label, two token types) and a tagger (token-classify:
    O, B-PER, I-PER), their weights drawn with a large spread so that rows differ visibly."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BertForSequenceClassification, BertForTokenClassification, BertModel

    paths = pooling_model_paths(root)
    shapes = {"encoder": (BertModel, {}),
              "classifier": (BertForSequenceClassification, {"num_labels": 3, "id2label": LABELS}),
              "cross_encoder": (BertForSequenceClassification, {"num_labels": 1, "type_vocab_size": 2}),
              "tagger": (BertForTokenClassification, {"num_labels": 3, "id2label": TAGS,
                                                      "label2id": {v: k for k, v in TAGS.items()}})}
    for seed, (name, (kind, extra)) in enumerate(shapes.items()):
        torch.manual_seed(20 + seed)
        spread_weights(kind(bert_config(**POOLING_SHAPE, **extra))).save_pretrained(paths[name])
        save_tokenizer(paths[name])
    torch.manual_seed(3)
    lora = get_peft_model(BertModel.from_pretrained(paths["encoder"]),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False))
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_" in name:
                parameter.normal_(0.0, 0.5)
    lora.save_pretrained(paths["encoder_lora"])


def pooling_model_paths(root: Path) -> dict[str, Path]:
    """Where build_tiny_pooling_models saves each model under `root`, by name."""
    return {name: root / name for name in ("encoder", "encoder_lora", "classifier", "cross_encoder", "tagger")}


CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CAUSAL_SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# transformers' StopStringCriteria reads each token's text by decoding it after "abcdef", which a
# word-level vocabulary must therefore know (subword vocabularies spell it out of pieces).
CAUSAL_WORDS = [*WORDS, "abcdef"]


def save_word_tokenizer(path: Path) -> None:
    """A word-level tokenizer over WORDS that puts <s> before every text, with eos, pad and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*CAUSAL_SPECIALS, *CAUSAL_WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>", model_max_length=MAX_POSITIONS)
    tokenizer.add_special_tokens({"additional_special_tokens": CAUSAL_SPECIALS[4:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)


def tiny_llama(vocab_size: int, eos: int, eos_like: int, intermediate_size: int = 37, **special_ids):
    """A tiny Llama (hidden 32, two layers, heads of 32 dimensions: the smallest vLLM's CPU attention
    takes), its weights drawn with a large spread (normal(0, 0.5)) so greedy logits are far from
    ties, and the eos row of its head 1.25 times the row of the token `eos_like`: eos wins wherever
    that token would lead strongly, so some greedy rows end on eos and others run to max_new_tokens.
    vLLM splits every layer's outputs between tensor-parallel workers, so a model for tensor parallel 2
    needs an even `intermediate_size` (38; the heads, 4 and 2 KV, divide already)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=intermediate_size,
                         num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=2 * MAX_POSITIONS, eos_token_id=eos, tie_word_embeddings=False,
                         **special_ids)
    torch.manual_seed(11)
    model = spread_weights(LlamaForCausalLM(config))
    with torch.no_grad():
        model.lm_head.weight[eos] = 1.25 * model.lm_head.weight[eos_like]
    return model


def causal_lm_path(root: Path, intermediate_size: int = 37) -> Path:
    """Where build_tiny_causal_lm saves the Llama of that size under `root`."""
    return root / ("tiny-causal-lm" if intermediate_size == 37 else f"tiny-causal-lm-{intermediate_size}")


def build_tiny_causal_lm(root: Path, intermediate_size: int = 37) -> Path:
    """`tiny_llama` over WORDS, saved with its word-level tokenizer; eos is drawn like "bird". The tests
    take it from tests/conftest.py's `causal_lm`, built once per test run for each size."""
    path = causal_lm_path(root, intermediate_size)
    model = tiny_llama(len(CAUSAL_SPECIALS) + len(CAUSAL_WORDS), 3, len(CAUSAL_SPECIALS) + WORDS.index("bird"),
                       intermediate_size, pad_token_id=0, bos_token_id=2)
    model.save_pretrained(path)
    save_word_tokenizer(path)
    return path


BYTES_SPECIALS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# Each message ends with <|end|>; the generation prompt opens the assistant's turn. Roles other than
# system, user and assistant are refused (a TemplateError), as many real templates do.
BYTES_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# BYTES_CHAT_TEMPLATE in the shape of SmolVLM's default template: it loops over each message's
# content as parts, with no branch for a string; given text parts, it renders what BYTES_CHAT_TEMPLATE
# renders of their texts joined.
PARTS_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def bytes_corpus(lines: int = 3000, seed: int = 0) -> list[str]:
    """Sentences, small JSON objects, dates and labels: enough that the merges spell what the
    structured-output tests' grammars emit."""
    import json

    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.4:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))))
        elif kind < 0.8:
            keys = ["name", "age", "color", "city", "label", "score", "tags"]
            values = [rng.choice(WORDS), rng.randint(0, 999), rng.random(), [rng.choice(WORDS)], True, None]
            out.append(json.dumps({rng.choice(keys): rng.choice(values) for _ in range(3)}))
        else:
            out.append(f"{rng.randint(1900, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                       f"{rng.choice(['yes', 'no', 'maybe', 'positive', 'negative', 'neutral'])}")
    return out


def with_unknown_tokens(lm: Path, root: Path) -> Path:
    """A copy of the tiny Llama (63 embedding rows) whose tokenizer knows two words the model has no
    embedding for (a tokenizer saved with added tokens and an embedding never resized, as happens):
    "zebra" is id 63, which vLLM reads from its padding row (its table padded to 64 rows) and would
    answer silently; "yak" is id 64."""
    import shutil

    from transformers import AutoTokenizer

    copy = root / "lm-extra-tokens"
    if copy.exists():
        return copy
    shutil.copytree(lm, copy)
    tokenizer = AutoTokenizer.from_pretrained(copy)
    tokenizer.add_tokens(["zebra", "yak"])
    tokenizer.save_pretrained(copy)
    return copy


def with_chat_template(lm: Path, copy: Path, template: str) -> Path:
    """A copy of a model folder whose tokenizer has `template` as its chat template."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(lm, copy)
    tokenizer = AutoTokenizer.from_pretrained(copy)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(copy)
    return copy


def save_bytes_tokenizer(path: Path, vocab_size: int = 400):
    """A byte-level BPE (all 256 bytes, then merges learned from `bytes_corpus`: deterministic, ~0.5 s),
    as real LLM tokenizers are: xgrammar reads it as a byte-level vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BYTES_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(bytes_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        model_max_length=2 * MAX_POSITIONS)
    tokenizer.add_special_tokens({"additional_special_tokens": BYTES_SPECIALS[3:]})
    tokenizer.chat_template = BYTES_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return tokenizer


def build_tiny_bytes_lm(root: Path) -> Path:
    """`tiny_llama` over a byte-level BPE of ~400 tokens that can spell JSON, dates and labels, with
    a chat template that refuses unknown roles: for conversations, log-probabilities and structured
    output on both engines. eos is drawn like `}`, so JSON rows often end on eos after their brace."""
    from transformers import GenerationConfig

    path = root / "tiny-bytes-lm"
    tokenizer = save_bytes_tokenizer(path)
    model = tiny_llama(len(tokenizer), tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("}"),
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    config = model.config
    model.save_pretrained(path)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(path)
    return path


def build_lora_on_plain_base(root: Path) -> tuple[Path, Path, Path]:
    """A base encoder as shipped, whose config names none of the labels (transformers' default 2), a LoRA
    adapter on it whose classifier head has 3 rows, and a copy of the base whose config.json was edited by
    hand to name the adapter's 3 labels (what users had to do before `model.labels`), for references."""
    import json
    import shutil

    import torch
    from transformers import BertModel

    base, adapter, edited = root / "plain-base", root / "plain-base-lora", root / "plain-base-edited"
    torch.manual_seed(5)
    BertModel(bert_config()).save_pretrained(base)
    save_tokenizer(base)
    save_lora(base, adapter, ["classifier"])
    shutil.copytree(base, edited)
    config = json.loads((edited / "config.json").read_text())
    config["id2label"] = {str(i): name for i, name in LABELS.items()}
    config["label2id"] = {name: i for i, name in LABELS.items()}
    (edited / "config.json").write_text(json.dumps(config))
    return base, adapter, edited




SEQ2SEQ_SPECIALS = ["<pad>", "</s>", "<unk>"]  # T5's ids: pad 0 (also the decoder's start), eos 1


def build_tiny_seq2seq(root: Path) -> Path:
    """A tiny T5 (hidden 32, two layers each side) over WORDS for task seq2seq, with a word-level
    tokenizer that ends every text with </s> as T5's does. Its weights are drawn with a large spread
    (normal(0, 0.5)) so greedy and beam choices are far from ties, its head untied, its pad and unk
    rows zero (rarely chosen: texts of words), and its eos row 1.1 times the row of "bird": some rows
    end on eos, most after a few words, others run to max_new_tokens."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    path = root / "tiny-t5"
    vocab = {token: i for i, token in enumerate([*SEQ2SEQ_SPECIALS, *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                            model_max_length=MAX_POSITIONS, model_input_names=["input_ids", "attention_mask"]
                            ).save_pretrained(path)
    config = T5Config(vocab_size=len(vocab), d_model=32, d_kv=16, d_ff=37, num_layers=2, num_heads=2,
                      relative_attention_num_buckets=8, dropout_rate=0.0, tie_word_embeddings=False,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(17)
    model = spread_weights(T5ForConditionalGeneration(config))
    with torch.no_grad():
        model.lm_head.weight[1] = 1.1 * model.lm_head.weight[vocab["bird"]]
        model.lm_head.weight[[0, 2]] = 0.0
    model.save_pretrained(path)
    return path
