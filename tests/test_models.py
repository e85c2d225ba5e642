"""Loading refuses, in one line, what would fail obscurely or run untrusted code."""

import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch

from factory import LABELS, bert_config, save_lora, settings_for
from shardinfer.core.errors import UserError
from shardinfer.engines.transformers import Transformers
from shardinfer.hf.models import load_tokenizer
from shardinfer.settings.config import ModelSettings
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.classify import Classify


def model_settings(path, adapter=None, **overrides) -> ModelSettings:
    values = dict(path=str(path), adapter=adapter and str(adapter), task="classify", max_length=32, dtype="float32",
                  trust_remote_code=False, allow_pickle=False)
    return ModelSettings(**{**values, **overrides})


def load_classifier(settings: ModelSettings):
    return Classify.load(LoadContext(settings_for(settings), torch.device("cpu"), torch.float32))


def test_pickle_weights_are_refused_unless_allowed(models, tmp_path):
    copy = shutil.copytree(models.classifier, tmp_path / "pickled")
    from safetensors.torch import load_file

    torch.save(load_file(copy / "model.safetensors"), copy / "pytorch_model.bin")
    (copy / "model.safetensors").unlink()
    with pytest.raises(UserError,
                       match=r"has only pickle weights \(pytorch_model.bin\), which can run code.*allow_pickle"):
        load_classifier(model_settings(copy))
    task = load_classifier(model_settings(copy, allow_pickle=True))
    assert task.model.config.num_labels == 3


def test_missing_tokenizer(models, tmp_path):
    copy = shutil.copytree(models.classifier, tmp_path / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (copy / name).unlink(missing_ok=True)
    with pytest.raises(UserError,
                       match=r"model.path `.*no-tokenizer`: no tokenizer there \(none of tokenizer.json, vocab.txt"):
        load_tokenizer(model_settings(copy))


def test_a_directory_that_is_not_a_model(models, tmp_path):
    copy = shutil.copytree(models.classifier, tmp_path / "broken")
    (copy / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(UserError, match=r"model.path `.*broken`: cannot load it as AutoModelForSequenceClassification"):
        load_classifier(model_settings(copy))


def test_adapter_for_another_base_model(models, tmp_path):
    from transformers import BertForSequenceClassification

    wider = tmp_path / "wider"
    BertForSequenceClassification(bert_config(num_labels=3, id2label=LABELS, hidden_size=48)).save_pretrained(wider)
    save_lora(wider, tmp_path / "wider-lora", ["classifier"])
    with pytest.raises(UserError, match=r"does not fit .*: `bert.encoder.layer.0.attention.self.query` has width 32 "
                                        r"in the model but 48 in the adapter \(an adapter for another base model\?\)"):
        load_classifier(model_settings(models.classifier, adapter=tmp_path / "wider-lora"))


def test_trust_remote_code_stays_off(models, tmp_path, monkeypatch):
    seen = {}
    from transformers import AutoModelForSequenceClassification

    original = AutoModelForSequenceClassification.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", spy)
    load_classifier(model_settings(models.classifier))
    assert seen["trust_remote_code"] is False and seen["use_safetensors"] is True and seen["local_files_only"] is True


def test_cls_pooling_takes_the_first_real_token_under_left_padding():
    from shardinfer.tasks.embed import pool

    hidden = torch.arange(2 * 3 * 1, dtype=torch.float32).reshape(2, 3, 1)
    mask = torch.tensor([[1, 1, 1], [0, 0, 1]])
    assert pool(hidden, mask, "cls").flatten().tolist() == [0.0, 5.0]
    assert pool(hidden, mask, "mean").flatten().tolist() == [1.0, 5.0]


def test_pad_token_settles_on_one_id_for_tokenizer_and_model():
    from types import SimpleNamespace

    from shardinfer.hf.models import settle_pad_token

    model = SimpleNamespace(config=SimpleNamespace(pad_token_id=None))
    tokenizer = SimpleNamespace(pad_token_id=None, eos_token_id=151643)
    assert settle_pad_token(tokenizer, model) == 151643 and model.config.pad_token_id == 151643
    tokenizer = SimpleNamespace(pad_token_id=None, eos_token_id=2)
    assert settle_pad_token(tokenizer, SimpleNamespace(config=SimpleNamespace(pad_token_id=7))) == 7


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_decoder_classifier_batched_equals_unbatched(models, tmp_path, padding_side):
    """A Qwen2-shape classifier reads its logit at each row's last real token, whatever the padding."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    from factory import texts
    from shardinfer.hf.models import LoadedModel, settle_pad_token
    from shardinfer.settings.config import BatchSettings
    from shardinfer.shard.device_loop import predict_window, prepare_batches

    tokenizer = AutoTokenizer.from_pretrained(models.classifier)
    tokenizer.padding_side = padding_side
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=37, num_labels=3, pad_token_id=None)
    model = Qwen2ForSequenceClassification(config).eval()
    pad_id = settle_pad_token(tokenizer, model)
    context = LoadContext(settings_for(model_settings(models.classifier)), torch.device("cpu"), torch.float32)
    task = Classify(LoadedModel(model, set(), set()), tokenizer, pad_id, context)
    rows = texts(40, seed=4)
    with torch.inference_mode():
        window = task.prepare(0, pa.table({"text": rows}))
        engine = Transformers(task)
        got = predict_window(engine, prepare_batches(engine, window, pa.table({}), BatchSettings(256, 16, 64)),
                             torch.device("cpu"))
        want = [torch.softmax(model(**tokenizer(t, truncation=True, max_length=32, return_tensors="pt")).logits[0], -1)
                for t in rows]
    np.testing.assert_allclose(got["probs"], torch.stack(want).numpy(), atol=1e-5)
