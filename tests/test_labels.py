"""A LoRA adapter's classifier head decides how many labels there are, `model.labels` names them: a base
model works as shipped, without editing its config.json to name the adapter's labels."""

import numpy as np
import pytest
import torch

import reference
from factory import LABELS, bert_config, input_settings, save_tokenizer, settings_for, texts
from shardinfer.core.errors import UserError
from shardinfer.hf.labels import label_names
from shardinfer.settings.config import BatchSettings, ModelSettings, Settings
from shardinfer.snakefile.settings_digest import output_digest
from shardinfer.tasks import task_class
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.classify import Classify
from tiny_models import build_lora_on_plain_base

NAMES = ("neg", "neu", "pos")


def check_labels(model: ModelSettings) -> None:
    """The task's own check of `model.labels`, as the config checks run it."""
    task_class(model.task).check_labels(model)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """(base as shipped, its LoRA with a 3-row head, the base with config.json edited to name 3 labels)."""
    return build_lora_on_plain_base(tmp_path_factory.mktemp("plain"))


def model_settings(path, adapter=None, labels=None, task="classify") -> ModelSettings:
    return ModelSettings(path=str(path), adapter=adapter and str(adapter), task=task, max_length=32, dtype="float32",
                         trust_remote_code=False, allow_pickle=False, labels=labels)


def classify(settings: ModelSettings, rows: list[str]) -> tuple[list[str], np.ndarray]:
    """The classify task's label names and probabilities for `rows`, run as one padded batch."""
    from transformers import AutoTokenizer

    task = Classify.load(LoadContext(settings_for(settings), torch.device("cpu"), torch.float32))
    tokenizer = AutoTokenizer.from_pretrained(settings.path)
    with torch.inference_mode():
        inputs = tokenizer(rows, padding=True, truncation=True, max_length=32, return_tensors="pt")
        results = {key: value.numpy() for key, value in task.predict(dict(inputs)).items()}
    return task.to_arrow(results, np.arange(len(rows)))[0].to_pylist(), results["probs"]


def test_base_as_shipped_takes_the_adapters_head_and_matches_peft(plain):
    base, adapter, edited = plain
    rows = texts(30, seed=7)
    names, probs = classify(model_settings(base, adapter, NAMES), rows)
    want_ids, want = reference.classify(edited, rows, 32, adapter=adapter)  # peft's PeftModel, config edited by hand
    np.testing.assert_allclose(probs, want, atol=1e-5)
    assert names == [NAMES[i] for i in want_ids]


def test_a_base_head_of_another_width_gives_way_to_the_adapters(plain, tmp_path):
    """A base classifier with 2 labels under an adapter trained with 3: the adapter's head replaces it."""
    from transformers import BertForSequenceClassification

    base, adapter, edited = plain
    two = tmp_path / "two-labels"
    torch.manual_seed(9)
    BertForSequenceClassification.from_pretrained(base, config=bert_config(num_labels=2)).save_pretrained(two)
    save_tokenizer(two)
    rows = texts(12, seed=8)
    names, probs = classify(model_settings(two, adapter), rows)
    want_ids, want = reference.classify(edited, rows, 32, adapter=adapter)
    np.testing.assert_allclose(probs, want, atol=1e-5)
    assert names == [f"LABEL_{i}" for i in want_ids]


def test_names_without_model_labels(plain):
    base, adapter, edited = plain
    assert label_names(str(base), str(adapter), None) == ["LABEL_0", "LABEL_1", "LABEL_2"]  # config names 2
    assert label_names(str(edited), str(adapter), None) == list(LABELS.values())  # config names the head's 3
    assert label_names(str(edited), None, ("x", "y", "z")) == ["x", "y", "z"]  # no adapter: the config's count


def test_labels_of_another_count_are_refused_before_loading(plain):
    base, adapter, _ = plain
    with pytest.raises(UserError, match=r"^model.labels gives 2 names but the adapter `.*plain-base-lora`'s classifier "
                                        r"`classifier.weight` has 3 labels; give 3 names or leave model.labels out$"):
        check_labels(model_settings(base, adapter, ("neg", "pos")))
    with pytest.raises(UserError, match=r"^model.labels gives 3 names but the config of model.path `.*plain-base` has "
                                        r"2 labels; give 2 names"):
        classify(model_settings(base, None, NAMES), ["a cat"])
    with pytest.raises(UserError, match=r"^model.labels names the labels of task classify; task embed has none"):
        check_labels(model_settings(base, adapter, NAMES, task="embed"))


def test_labels_enter_the_digest_and_survive_the_params(plain, tmp_path):
    base, adapter, _ = plain

    def settings(labels):
        return Settings(input=input_settings(tmp_path / "in.parquet"), model=model_settings(base, adapter, labels),
                        batch=BatchSettings(256, 16, 128), shards=2)

    assert len({output_digest(settings(labels)) for labels in (None, NAMES, ("a", "b", "c"))}) == 3
    data = settings(NAMES).to_dict()
    data["model"]["labels"] = list(NAMES)  # as YAML or JSON hands a list back
    assert Settings.from_dict(data) == settings(NAMES)
