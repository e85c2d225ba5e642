"""Loading refuses, in one line, what would fail obscurely or run untrusted code."""

import shutil

import pytest
import torch

from factory import LABELS, bert_config, save_lora
from shardinfer.config import ModelSettings
from shardinfer.errors import UserError
from shardinfer.models import load_model, load_tokenizer
from shardinfer.tasks import load_task


def model_settings(path, adapter=None, **overrides) -> ModelSettings:
    values = dict(path=str(path), adapter=adapter and str(adapter), task="classify", max_length=32, dtype="float32",
                  trust_remote_code=False, allow_pickle=False, pooling="mean", normalize=False)
    return ModelSettings(**{**values, **overrides})


def load_classifier(settings: ModelSettings):
    task_class = load_task("classify")
    return task_class(load_model(settings, task_class.auto_class, torch.float32, torch.device("cpu")), settings)


def test_pickle_weights_are_refused_unless_allowed(models, tmp_path):
    copy = shutil.copytree(models.classifier, tmp_path / "pickled")
    from safetensors.torch import load_file

    torch.save(load_file(copy / "model.safetensors"), copy / "pytorch_model.bin")
    (copy / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"has only pickle weights \(pytorch_model.bin\), which can run code.*allow_pickle"):
        load_classifier(model_settings(copy))
    task = load_classifier(model_settings(copy, allow_pickle=True))
    assert task.model.config.num_labels == 3


def test_missing_tokenizer(models, tmp_path):
    copy = shutil.copytree(models.classifier, tmp_path / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (copy / name).unlink(missing_ok=True)
    with pytest.raises(UserError, match=r"model.path `.*no-tokenizer`: no tokenizer there \(none of tokenizer.json, vocab.txt"):
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
    with pytest.raises(UserError, match=r"does not fit .*: `bert.encoder.layer.0.attention.self.query` has width 32 in the "
                                        r"model but 48 in the adapter \(an adapter for another base model\?\)"):
        load_classifier(model_settings(models.classifier, adapter=tmp_path / "wider-lora"))


def test_num_labels_mismatch_between_adapter_and_model(models, tmp_path):
    from transformers import BertForSequenceClassification

    two = tmp_path / "two-labels"
    BertForSequenceClassification(bert_config(num_labels=2)).save_pretrained(two)
    with pytest.raises(UserError, match=r"its classifier `classifier.(weight|bias)` has 3 labels, the model's config 2; "
                                        r"set num_labels/id2label"):
        load_classifier(model_settings(two, adapter=models.lora))


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
