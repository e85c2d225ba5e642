"""The model without a shared filesystem (shardinfer.stored_model): what the main process hands its
jobs, the copies' names, and the digests a job computes from the handed facts equal the main
process's. The runs through a real bucket are in tests/test_storage.py."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

import factory
from shardinfer.config import ModelSettings
from shardinfer.errors import UserError
from shardinfer.settings_digest import output_digest, tokenizer_digest
from shardinfer.stored_model import HANDED_VAR, ModelFiles, hand_on, stage, with_staged


def settings_of(models, tokenize_ahead: bool = True, adapter=None):
    model = ModelSettings(path=str(models.classifier), adapter=adapter and str(adapter), task="classify",
                          max_length=32, dtype="float32", trust_remote_code=False, allow_pickle=False)
    return factory.settings_for(model, tokenize_ahead=tokenize_ahead)


def test_a_job_takes_the_facts_the_main_process_read_and_computes_its_digests(models):
    settings, env = settings_of(models, adapter=models.lora), {}
    main = hand_on(settings, is_main_process=True, env=env)
    handed = hand_on(settings, is_main_process=False, env=dict(env))
    assert handed == main and main.model and main.adapter
    # a job's digests from the handed facts equal those the main process read from the folders
    assert output_digest(settings, (handed.model, handed.adapter)) == output_digest(settings)
    assert tokenizer_digest(settings, handed.tokenizer) == tokenizer_digest(settings)
    # ... whatever its node holds at model.path: nothing there is read
    elsewhere = dataclasses.replace(settings, model=dataclasses.replace(settings.model, path="/nowhere"))
    assert output_digest(elsewhere, (handed.model, handed.adapter)) != output_digest(elsewhere)
    assert json.loads(env[HANDED_VAR])["model"] == main.model


def test_a_job_without_the_handed_facts_stops_in_one_line(models):
    with pytest.raises(UserError, match=f"{HANDED_VAR} is not set: without a shared filesystem"):
        hand_on(settings_of(models), is_main_process=False, env={})


def test_another_model_is_another_folder_and_tokenize_gets_no_weights(models, tmp_path):
    files = ModelFiles.of(settings_of(models))
    copies = files.staged()
    folder = f"results/model/{files.key()}/model"
    names = sorted(path.name for path in models.classifier.iterdir())
    assert sorted(copies["model"]) == [f"{folder}/{name}" for name in names]
    assert f"{folder}/config.json" in copies["tokenizer"] and f"{folder}/tokenizer.json" in copies["tokenizer"]
    assert not [path for path in copies["tokenizer"] if path.endswith(".safetensors")]
    assert "adapter" not in copies
    # a changed file (its size or mtime) is another key, so stale copies of the last model are never mixed in
    changed = tmp_path / "classifier"
    shutil.copytree(models.classifier, changed)
    (changed / "config.json").write_text((changed / "config.json").read_text() + " ")
    other = ModelFiles.of(dataclasses.replace(settings_of(models), model=dataclasses.replace(
        settings_of(models).model, path=str(changed))))
    assert other.key() != files.key()


def test_the_staged_copies_are_what_the_job_loads(models, tmp_path):
    settings = settings_of(models, adapter=models.lora)
    files = ModelFiles.of(settings)
    copies = files.staged()
    outputs = [str(tmp_path / path) for path in copies["model"] + copies["adapter"]]
    stage(files.sources(settings), outputs)
    for source, copy in zip(files.sources(settings), outputs):
        assert open(copy, "rb").read() == open(source, "rb").read()
    staged = with_staged(settings, outputs[:len(copies["model"])], outputs[len(copies["model"]):])
    assert staged.model.path == str(tmp_path / f"results/model/{files.key()}/model")
    assert staged.model.adapter == str(tmp_path / f"results/model/{files.key()}/adapter")
    assert with_staged(settings, None) == settings  # on a shared filesystem: model.path itself
