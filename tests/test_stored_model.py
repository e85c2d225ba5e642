"""The model without a shared filesystem (shardinfer.snakefile.stored_model): what the main process hands its
jobs, the copies' names, and the digests a job computes from the handed facts equal the main
process's. The runs through a real bucket are in tests/test_storage.py."""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import factory
from shardinfer.core.errors import UserError
from shardinfer.settings.config import ModelSettings
from shardinfer.snakefile.configure import settings_by_input
from shardinfer.snakefile.settings_digest import output_digest, tokenizer_digest
from shardinfer.snakefile.stored_model import (
    HANDED_VAR,
    ModelFiles,
    hand_on,
    handed,
    stage,
    with_handed_paths,
    with_staged,
)

REPO = Path(__file__).resolve().parents[1]


def settings_of(models, tokenize_ahead: bool = True, adapter=None):
    model = ModelSettings(path=str(models.classifier), adapter=adapter and str(adapter), task="classify",
                          max_length=32, dtype="float32", trust_remote_code=False, allow_pickle=False)
    return factory.settings_for(model, tokenize_ahead=tokenize_ahead)


def test_a_job_takes_the_facts_the_main_process_read_and_computes_its_digests(models):
    settings, env = settings_of(models, adapter=models.lora), {}
    main = hand_on(settings, env=env)
    job = handed(dict(env))
    assert job == main and main.model and main.adapter
    assert main.paths == [str(models.classifier), str(models.lora)]
    # a job's digests from the handed facts equal those the main process read from the folders
    assert output_digest(settings, (job.model, job.adapter)) == output_digest(settings)
    assert tokenizer_digest(settings, job.tokenizer) == tokenizer_digest(settings)
    # ... whatever its node holds at model.path: nothing there is read
    elsewhere = dataclasses.replace(settings, model=dataclasses.replace(settings.model, path="/nowhere"))
    assert output_digest(elsewhere, (job.model, job.adapter)) != output_digest(elsewhere)
    # JSON in base64: nothing in it needs quoting on the way to a job
    assert json.loads(base64.b64decode(env[HANDED_VAR]))["model"] == main.model
    assert set(env[HANDED_VAR]) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def validated(config: dict) -> dict:
    from snakemake.utils import validate

    config = json.loads(json.dumps(config))
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))  # fills the defaults
    return config


def test_a_job_whose_node_lacks_a_pkg_model_takes_the_main_process_path_and_digest(models, tmp_path):
    data = factory.write_input(factory.input_frame(3), tmp_path / "in.parquet")
    on_node = validated(factory.workflow_config(data, "pkg:shardinfer_no_such_package/model"))
    with pytest.raises(UserError, match=r"model.path `pkg:shardinfer_no_such_package/model`: Python package "
                                        r"`shardinfer_no_such_package` is not installed"):
        settings_by_input(on_node)  # what a job would do without the handed facts
    # the main process resolved it (here: to the classifier's folder) and handed its facts on
    main_settings = settings_by_input(validated(factory.workflow_config(data, models.classifier)))[None]
    env = {}
    main = hand_on(main_settings, env=env)
    job_settings = settings_by_input(with_handed_paths(on_node, handed(env)))[None]
    assert job_settings.model == main_settings.model
    assert output_digest(job_settings, (main.model, main.adapter)) == output_digest(main_settings)


def test_a_job_without_the_handed_facts_stops_in_one_line(models):
    with pytest.raises(UserError, match=f"{HANDED_VAR} is not set: without a shared filesystem"):
        handed({})


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
    # the same files at another path are another key too: what decides a digest, decides the folder
    moved = dataclasses.replace(files, paths=[str(changed), None])
    assert moved.key() != files.key()


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
