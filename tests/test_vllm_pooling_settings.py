"""The encoder tasks on vLLM's pooling runner (`<task>.engine: vllm`), without starting it: which
class the registry gives, what reaches `LLM(...)` and `PoolingParams`, what is refused in one line
when the Snakefile loads (before any engine time), how a window's outputs become the task's results,
and what it adds to the shard digest. The engine itself runs in tests/test_vllm_pooling.py."""

from __future__ import annotations

import json
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from factory import settings_for
from shardinfer.core.errors import UserError
from shardinfer.engines import check_engine, engine_devices, engine_for, engine_of
from shardinfer.engines.transformers import Transformers
from shardinfer.engines.vllm.generate import VllmGenerate
from shardinfer.engines.vllm.pooling import VllmPooling, pooling_arguments, second_segment
from shardinfer.engines.vllm.pooling_checks import long_max_length
from shardinfer.settings.config import BatchSettings, ModelSettings
from shardinfer.snakefile.settings_digest import output_digest
from shardinfer.tasks import task_class
from shardinfer.tasks.base import LoadContext
from shardinfer.tasks.embed import pool

ENCODER_TASKS = ("classify", "embed", "score", "token-classify")
MODEL_OF = {"classify": "classifier", "embed": "encoder", "score": "cross_encoder", "token-classify": "tagger"}


def task_settings(task: str, path, adapter=None, max_length: int = 32, **section):
    model = ModelSettings(path=str(path), adapter=adapter and str(adapter), task=task, max_length=max_length,
                          dtype="auto", trust_remote_code=False, allow_pickle=False)
    if task == "score":
        section.setdefault("pair_column", "passage")
    return settings_for(model, batch=BatchSettings(1000, 4, 64), task_settings=section)


def refusal(settings) -> str:
    with pytest.raises(UserError) as refused:
        check_engine(settings)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_the_name_vllm_is_the_pooling_runner_for_the_encoder_tasks_and_generation_for_generate():
    for task in ENCODER_TASKS:
        assert engine_for(task, {"engine": "vllm"}) is VllmPooling and engine_for(task, {}) is Transformers
        assert task_class(task).engines[:2] == ("transformers", "vllm")  # embed: and a server's embeddings
    assert engine_for("generate", {"engine": "vllm"}) is VllmGenerate
    assert engine_devices({"model": {"task": "embed"}, "embed": {"engine": "vllm"}}) == (1, "")


@pytest.mark.parametrize("task", ENCODER_TASKS)
def test_each_encoder_task_on_vllm_passes_the_checks_with_a_model_of_its_kind(task, pooling_models):
    check_engine(task_settings(task, pooling_models[MODEL_OF[task]], engine="vllm"))


def test_the_engine_and_its_settings_are_in_the_shard_digest_only_when_chosen(pooling_models):
    path = pooling_models["encoder"]
    plain = task_settings("embed", path)
    assert plain.task_settings.to_dict() == {"pooling": "mean", "normalize": False}  # nothing added: digests kept
    vllm = task_settings("embed", path, engine="vllm")
    tuned = task_settings("embed", path, engine="vllm", vllm={"max_num_seqs": 8})
    assert len({output_digest(plain), output_digest(vllm), output_digest(tuned)}) == 3
    assert engine_of(vllm) is VllmPooling and VllmPooling.identity(vllm)["engine"] == "vllm"
    classify = task_settings("classify", pooling_models["classifier"])
    assert classify.task_settings.to_dict() == {}


@pytest.mark.parametrize("vllm,says", [
    ({"runner": "generate"}, "embed.vllm.runner is set by the workflow (from the task (vLLM's pooling runner))"),
    ({"pooler_config": {"pooling_type": "CLS"}}, "embed.vllm.pooler_config is set by the workflow"),
    ({"max_model_len": 64}, "embed.vllm.max_model_len is set by the workflow (from model.max_length)"),
    ({"tensor_parallel_size": 2}, "embed.vllm.tensor_parallel_size is 2; vLLM's pooling runner runs the model on one "
                                  "device per shard job here: run more shards instead"),
    ({"data_parallel_size": 2}, "embed.vllm.data_parallel_size is 2; each shard job runs one engine"),
    ({"nnodes": 2}, "embed.vllm.nnodes is 2; vLLM's pooling runner runs the model on one device per shard job"),
])
def test_arguments_the_workflow_sets_or_cannot_span_are_refused(pooling_models, vllm, says):
    assert says in refusal(task_settings("embed", pooling_models["encoder"], engine="vllm", vllm=vllm))


def test_heads_vllms_cpu_build_cannot_run_are_refused_naming_the_tasks_engine(models):
    """tiny_workflow's encoder has two heads of 16 (the CPU build's attention takes 32 and up)."""
    from shardinfer.engines.vllm.checks import cpu_build

    if not cpu_build():
        pytest.skip("vLLM's GPU build runs heads of 16")
    assert refusal(task_settings("embed", models.encoder, engine="vllm")) == (
        f"model.path `{models.encoder}` has attention heads of size 16, which vLLM's CPU build cannot run (its "
        "attention takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); use embed.engine "
        "transformers for this model, or vLLM on a GPU")


def test_an_adapter_is_a_lora_for_embed_and_refused_for_a_classifier(pooling_models, tmp_path):
    check_engine(task_settings("embed", pooling_models["encoder"], pooling_models["encoder_lora"], engine="vllm"))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    line = refusal(task_settings("classify", pooling_models["classifier"], adapter, engine="vllm"))
    assert line.startswith("model.adapter with classify.engine vllm: vLLM's pooling runner loads no adapter for a "
                           "classify model (nor the head it carries); use classify.engine transformers")
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4,
                                                             "modules_to_save": ["classifier"]}))
    assert "uses modules_to_save" in refusal(task_settings("embed", pooling_models["encoder"], adapter,
                                                           engine="vllm"))


@pytest.mark.parametrize("task,model,says", [
    ("classify", "encoder", "classify.engine vllm: model.path `{}` is a BertModel, not a *ForSequenceClassification "
                            "model, which vLLM's pooling runner needs for task classify"),
    ("score", "tagger", "is a BertForTokenClassification, not a *ForSequenceClassification model"),
    ("token-classify", "classifier", "is a BertForSequenceClassification, not a *ForTokenClassification model"),
    ("embed", "classifier", "embed.engine vllm: model.path `{}` is a BertForSequenceClassification; vLLM's pooling "
                            "runner embeds with a base model (*Model) or a decoder (*ForCausalLM)"),
])
def test_a_model_without_the_tasks_head_is_refused(pooling_models, task, model, says):
    path = pooling_models[model]
    assert says.format(path) in refusal(task_settings(task, path, engine="vllm"))


def sentence_folder(source, root, *modules: tuple[str, str, dict]):
    """A copy of a model folder with sentence-transformers modules: (type's last part, folder, config)."""
    folder = shutil.copytree(source, root / "sentence")
    listed = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    for k, (kind, path, config) in enumerate(modules, 1):
        listed.append({"idx": k, "name": str(k), "path": path, "type": f"sentence_transformers.models.{kind}"})
        if path:
            (folder / path).mkdir()
            (folder / path / "config.json").write_text(json.dumps(config))
    (folder / "modules.json").write_text(json.dumps(listed))
    return folder


def test_sentence_transformers_modules_vllm_would_read_otherwise_are_refused(pooling_models, tmp_path):
    """A Dense projection (vLLM applies it, the transformers engine does not) for embed; a Pooling
    module (vLLM would pool a classifier's inputs by it) for the others; Pooling and Normalize for
    embed are fine: embed.pooling and embed.normalize decide on both engines."""
    pooling = ("Pooling", "1_Pooling", {"pooling_mode_cls_token": True})
    dense = ("Dense", "2_Dense", {"in_features": 32, "out_features": 16})
    folder = sentence_folder(pooling_models["encoder"], tmp_path, pooling, ("Normalize", "", {}))
    check_engine(task_settings("embed", folder, engine="vllm"))
    shutil.rmtree(folder)
    folder = sentence_folder(pooling_models["encoder"], tmp_path, pooling, dense)
    assert refusal(task_settings("embed", folder, engine="vllm")) == (
        f"model.path `{folder}` has a sentence-transformers Dense module (`2_Dense`, modules.json), which vLLM's "
        "pooling runner applies to each embedding (to 16 dimensions) and the transformers engine does not; use "
        "embed.engine transformers")
    check_engine(task_settings("embed", folder))  # the transformers engine: as before
    shutil.rmtree(folder)
    folder = sentence_folder(pooling_models["classifier"], tmp_path, pooling)
    assert "has a sentence-transformers Pooling module (`1_Pooling`, modules.json), by which vLLM's pooling runner " \
           "would pool the classify head's inputs" in refusal(task_settings("classify", folder, engine="vllm"))
    (folder / "modules.json").write_text('{"not": "a list"}')
    assert "modules.json` holds a JSON dict, not the JSON list" in refusal(task_settings("classify", folder,
                                                                                        engine="vllm"))


def test_a_max_length_beyond_sentence_transformers_limit_runs_where_the_positions_hold_it(pooling_models, tmp_path):
    folder = shutil.copytree(pooling_models["encoder"], tmp_path / "encoder")
    assert not long_max_length(str(folder), 32)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16, "do_lower_case": False}))
    assert long_max_length(str(folder), 32) and not long_max_length(str(folder), 16)
    assert not long_max_length(str(folder), 100)  # beyond the 64 positions: check_max_length refuses it


def cpu_context(settings):
    return LoadContext(settings, torch.device("cpu"), torch.float32)


def test_what_reaches_the_pooling_runner(pooling_models):
    embed = task_settings("embed", pooling_models["encoder"], pooling_models["encoder_lora"], engine="vllm",
                          pooling="cls", vllm={"max_num_seqs": 8})
    arguments = pooling_arguments(cpu_context(embed))
    assert {key: arguments[key] for key in ("runner", "pooler_config", "max_model_len", "dtype", "enforce_eager",
                                            "max_num_seqs", "enable_lora", "max_lora_rank", "seed")} == {
        "runner": "pooling", "pooler_config": {"use_activation": False, "seq_pooling_type": "CLS"},
        "max_model_len": 32, "dtype": "float32", "enforce_eager": True, "max_num_seqs": 8, "enable_lora": True,
        "max_lora_rank": 8, "seed": 0}
    assert 0 < arguments["kv_cache_memory_bytes"] <= 4 << 30 and "generation_config" not in arguments
    score = pooling_arguments(cpu_context(task_settings("score", pooling_models["cross_encoder"], engine="vllm")))
    assert score["pooler_config"] == {"use_activation": False} and "enable_lora" not in score


def test_a_pairs_second_segment_is_where_its_token_types_turn_to_one():
    assert second_segment([0, 0, 0, 1, 1]) == 3 and second_segment([0, 0]) is None and second_segment([]) is None
    with pytest.raises(UserError, match="not zeros then ones"):
        second_segment([0, 1, 0])


def test_last_pooling_takes_the_last_real_token_wherever_the_tokenizer_pads():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert pool(hidden, right, "last").flatten().tolist() == [1.0, 7.0]
    assert pool(hidden, left, "last").flatten().tolist() == [3.0, 7.0]
    assert pool(hidden, left, "cls").flatten().tolist() == [2.0, 4.0]


def pooled(request_id: str, ids: list[int], data) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, prompt_token_ids=ids, outputs=SimpleNamespace(data=data), error=None)


def engine_over(task: str, settings) -> VllmPooling:
    """The engine around a task loaded without a model (no vLLM started): what turns outputs into results."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(settings.model.path)
    return VllmPooling(None, task_class(task)(None, tokenizer, 0, cpu_context(settings)), cpu_context(settings))


def test_outputs_become_the_tasks_results_as_on_the_transformers_engine(pooling_models):
    """Raw pooled states normalised by the task (embed.normalize), raw logits as probabilities and the
    likeliest label (classify); an output with other token ids than were sent fails naming the row."""
    embed = engine_over("embed", task_settings("embed", pooling_models["encoder"], engine="vllm", normalize=True))
    vectors = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    batch = {"ids": [[2, 5, 3], [2, 3]], "index": [10, 11]}
    got = embed.results([pooled("a", [2, 5, 3], vectors[0]), pooled("b", [2, 3], vectors[1])], batch, [0, 1])
    assert np.allclose(got["embedding"], [[0.6, 0.8], [1.0, 0.0]]) and got["embedding"].dtype == np.float32
    with pytest.raises(UserError, match="^row 11: vLLM ran other token ids than were sent$"):
        embed.results([pooled("a", [2, 5, 3], vectors[0]), pooled("b", [2, 4], vectors[1])], batch, [0, 1])
    classify = engine_over("classify", task_settings("classify", pooling_models["classifier"], engine="vllm"))
    logits = torch.tensor([0.0, 2.0, 1.0])
    got = classify.results([pooled("a", [2, 3], logits)], {"ids": [[2, 3]], "index": [0]}, [0])
    assert got["label_id"].tolist() == [1] and np.allclose(got["probs"][0], torch.softmax(logits, -1).numpy())
    assert classify.task.labels == ["negative", "neutral", "positive"]


def test_a_token_the_model_cannot_embed_is_refused_before_the_engine(pooling_models):
    from shardinfer.tasks.base import Window

    engine = engine_over("embed", task_settings("embed", pooling_models["encoder"], engine="vllm"))
    size = engine.vocab_size
    window = Window(40, np.array([3, 2, 1]), [[2, 5, 3], [2, size + 1], []])
    batch = engine.collate(window, np.arange(3))
    assert batch["ids"] == [[2, 5, 3], [2, size + 1], [0]] and batch["index"] == [40, 41, 42]
    assert batch["refused"] == {1: f"row 41: token id {size + 1} (position 1) is outside the model's vocabulary (its "
                                   f"config's vocab_size {size}: ids 0..{size - 1}); the tokenizer knows tokens the "
                                   "model cannot embed"}
    assert batch["segments"] == [None, None, None]
    assert re.fullmatch(r"PoolingParams\(task=embed, dimensions=None, use_activation=False.*",
                        repr(engine.pooling_params()))


@pytest.mark.parametrize("section,says", [
    ({"engine": "server", "server": {"url": "http://127.0.0.1:9/v1"}, "pooling": "last"},
     "embed.pooling is 'last', but with embed.engine server the server pools as it was started (vLLM: "
     "--pooler-config '{\"pooling_type\": \"LAST\"}'); start it so and leave embed.pooling at 'mean'"),
    ({"engine": "server", "server": {"url": "gpu-node-3:8000"}},
     "embed.server.url is 'gpu-node-3:8000'; embed.engine server needs the server's OpenAI base URL"),
    ({"engine": "vllm", "server": {"url": "http://127.0.0.1:9/v1"}},
     "embed.server is set, but embed.engine is vllm: set embed.engine: server to send the rows to "
     "http://127.0.0.1:9/v1, or leave embed.server out"),
])
def test_what_embed_on_a_server_cannot_take_is_refused_in_one_line_before_asking_it(pooling_models, section, says):
    """Before any request (the URL at 127.0.0.1:9 answers nothing): the server's own answers are
    tests/test_vllm_pooling.py's, against a real vLLM server."""
    assert refusal(task_settings("embed", pooling_models["encoder"], **section)).startswith(says)
