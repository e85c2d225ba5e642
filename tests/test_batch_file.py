"""The OpenAI batch file in and out (`input.format: openai_batch`), through real `snakemake` runs on
both engines over the tiny byte-level Llama with a chat template that loops over content parts
(tiny_models.PARTS_CHAT_TEMPLATE), its output checked with the `openai` package's own types.

- transformers, 1 shard and 3 shards, `row_errors: record`, a line the chat template refuses: as
  OpenAI's files, every output line a success answering its input line's custom_id, in order, each
  body a `ChatCompletion`, and the bad line in the error file alone (status 400, its body's error an
  `ErrorObject`); the 3-shard files are the 1-shard files, byte for byte.
- vLLM, 1 shard, the same lines without the bad one: each line's own parameters are honoured on
  both engines (max_tokens, n, stop, logprobs with top_logprobs, a JSON schema), and its greedy
  lines are the transformers engine's. Three more lines on vLLM alone: a strong logit_bias forces
  its token; penalties and biases pick each token as OpenAI defines them (checked on the raw
  log-probabilities of the top 20); neutral values give the clean line.
- A line of text parts (and a system message of one) is rendered, on both engines, with its parts
  as they are: what `LLM.chat` gives a template over parts (tests/test_generation.py asks it).
- The proof covers the files: gather again from the proven shards gives the same files; a shard with
  one edited text gives none of them.
- Refusals (a custom_id twice, another url, a key that would change the output, a value out of
  range, max_tokens above model.max_new_tokens, penalties with the transformers engine, a bad
  logit_bias, settings the lines give) are one line each, at the plan's scan, naming the file's line.
Without vLLM installed the module is skipped, unless CI=true: then it fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import made_once
from factory import WORDS, gather_job, read_predictions, run_workflows
from generation_data import SCHEMA, settings_of
from shardinfer.contract.shard_file import IDENTITY_KEY
from shardinfer.core.errors import ProofError, UserError
from shardinfer.input.scan import scan_input
from shardinfer.tasks import task_class
from test_vllm import vllm_missing
from tiny_models import build_tiny_bytes_lm

if vllm_missing():
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"vLLM tests cannot run: {vllm_missing()}. CI=true, so this fails instead of skipping.")
    pytest.skip(vllm_missing(), allow_module_level=True)

pytestmark = pytest.mark.e2e
URL = "/v1/chat/completions"
BAD = "request-6"  # a role the chat template refuses
PARTS_LINE = 10  # its messages' contents given as text parts
# Each line's own parameters (the rest: greedy, at most 4 tokens)
OWN = {0: {"max_tokens": 2, "temperature": 0},
       1: {"n": 3, "temperature": 1.2, "seed": 3, "max_tokens": 8},
       2: {"temperature": 0, "response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "p", "schema": SCHEMA}}},
       3: {"temperature": 0, "logprobs": True, "top_logprobs": 2, "max_tokens": 5},
       4: {"temperature": 0.7, "top_p": 0.9, "stop": ["e"]},
       5: {"max_completion_tokens": 6, "temperature": 0}}
LINES = 12
FORCED = "z"  # request-12's logit_bias +100 makes every token this one
# request-13's (with logit_bias -5 on 'e'): a token generated k times gains 1.0 + 1.5 k, so it repeats
PENALTIES = {"presence_penalty": -1.0, "frequency_penalty": -1.5}


def request(i: int, **body) -> dict:
    messages = [{"role": "user", "content": " ".join(WORDS[i:i + 4])}]
    return {"custom_id": f"request-{i}", "method": "POST", "url": URL,
            "body": {"model": "gpt-4o-mini", "messages": messages, **body}}


def batch_lines(bad: bool = True) -> list[dict]:
    lines = [request(i, **OWN.get(i, {"temperature": 0, "max_tokens": 4})) for i in range(LINES)]
    lines[6]["body"]["messages"] = [{"role": "tool", "content": "a tool's answer"}]
    lines[PARTS_LINE]["body"]["messages"] = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": WORDS[10]},
                                     {"type": "text", "text": " " + " ".join(WORDS[11:14])}]}]
    return lines if bad else [line for line in lines if line["custom_id"] != BAD]


def vllm_lines(tokenizer) -> list[dict]:
    """Lines that only the vLLM engine takes: a forced token, penalties and a bias checked against
    the raw log-probabilities, neutral values (request-9's twin)."""
    ids = {char: str(tokenizer.convert_tokens_to_ids(char)) for char in (FORCED, "e")}
    greedy = {"temperature": 0, "max_tokens": 4}
    return [request(7, **greedy, logit_bias={ids[FORCED]: 100}) | {"custom_id": "request-12"},
            request(8, temperature=0, max_tokens=10, logit_bias={ids["e"]: -5}, logprobs=True, top_logprobs=20,
                    **PENALTIES) | {"custom_id": "request-13"},
            request(9, **greedy, presence_penalty=0, frequency_penalty=0.0, logit_bias={})
            | {"custom_id": "request-14"}]


def write_lines(path: Path, lines: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def batch_config(data: Path, lm: Path, shards: int, engine: str) -> dict:
    config = {"input": {"path": str(data), "format": "openai_batch"},
              "model": {"path": str(lm), "task": "generate", "max_length": 48, "max_new_tokens": 32,
                        "dtype": "float32"},
              "generate": {"engine": engine}, "batch": {"max_tokens": 4096, "max_rows": 4, "sort_window": 8},
              "shards": shards}
    if engine == "vllm":
        config["generate"]["vllm"] = {"max_num_seqs": 16}
    else:
        config["row_errors"] = {"mode": "record", "max": 1}
    return config


@pytest.fixture(scope="session")
def bytes_lm(tmp_path_factory) -> Path:
    return made_once(tmp_path_factory, "bytes-lm", build_tiny_bytes_lm) / "tiny-bytes-lm"


@pytest.fixture(scope="module")
def batch_settings(bytes_lm, tmp_path_factory):
    """The settings of a transformers run over the batch file, built as the Snakefile builds them."""
    root = tmp_path_factory.mktemp("batch-settings")
    config = batch_config(write_lines(root / "batch.jsonl", batch_lines()), bytes_lm, 1, "transformers")
    (root / "config").mkdir()
    (root / "config" / "config.yaml").write_text(json.dumps(config))
    return settings_of(root)


@pytest.fixture(scope="module")
def runs(parts_lm, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batch-runs")
    with_bad = write_lines(root / "data" / "batch.jsonl", batch_lines())
    from transformers import AutoTokenizer

    good = write_lines(root / "data" / "good.jsonl",
                       batch_lines(bad=False) + vllm_lines(AutoTokenizer.from_pretrained(parts_lm)))
    planned = {"hf-1": batch_config(with_bad, parts_lm, 1, "transformers"),
               "hf-3": batch_config(with_bad, parts_lm, 3, "transformers"),
               "vllm-1": batch_config(good, parts_lm, 1, "vllm")}
    results = run_workflows([(root / name, config) for name, config in planned.items()])
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return {name: root / name for name in planned}


def output_of(workdir: Path, name: str = "batch_output") -> list[dict]:
    return [json.loads(line) for line in (workdir / "results" / f"{name}.jsonl").read_text().splitlines()]


def choices(line: dict) -> list[dict]:
    return line["response"]["body"]["choices"]


def test_every_line_answers_its_request_in_order_as_openai_types_read_it(runs):
    """As OpenAI's files: every output line a success whose body is a `ChatCompletion` (a consumer
    reads `response.body` of each), the failed request in the error file alone, as OpenAI writes a
    request that failed (status 400, `body.error` an `ErrorObject`); each custom_id in one of them."""
    from openai.types.chat import ChatCompletion
    from openai.types.shared import ErrorObject

    out, errors = output_of(runs["hf-1"]), output_of(runs["hf-1"], "batch_errors")
    requests = [line["custom_id"] for line in batch_lines()]
    assert [line["custom_id"] for line in out] == [cid for cid in requests if cid != BAD]
    assert [line["custom_id"] for line in errors] == [BAD]
    for line in out:
        assert set(line) == {"id", "custom_id", "response", "error"} and line["id"].startswith("batch_req_")
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert body.object == "chat.completion" and body.model == "gpt-4o-mini"
        assert body.usage.total_tokens == body.usage.prompt_tokens + body.usage.completion_tokens
    (failed,) = errors
    assert set(failed) == {"id", "custom_id", "response", "error"} and failed["error"] is None
    assert failed["response"]["status_code"] == 400 and failed["response"]["request_id"].startswith("req_")
    error = ErrorObject.model_validate(failed["response"]["body"]["error"])
    assert error.code == "row_error" and error.type == "invalid_request_error"
    assert "unknown role tool" in error.message and "row 6" in error.message
    table = read_predictions(runs["hf-1"])
    assert table["custom_id"].tolist() == requests
    assert table["error"].notna().tolist() == [cid == BAD for cid in requests]


def test_three_shards_write_the_one_shard_files_byte_for_byte(runs):
    for name in ("batch_output.jsonl", "batch_errors.jsonl"):
        one, three = (runs[run] / "results" / name for run in ("hf-1", "hf-3"))
        assert one.read_bytes() == three.read_bytes()


@pytest.mark.parametrize("run", ["hf-1", "vllm-1"])
def test_each_line_s_own_parameters_are_honoured(runs, run):
    from jsonschema import Draft202012Validator

    out = {line["custom_id"]: line for line in output_of(runs[run])}
    usage = {cid: line["response"]["body"]["usage"] for cid, line in out.items() if line["response"]}
    assert usage["request-0"]["completion_tokens"] <= 2
    assert len(choices(out["request-1"])) == 3 and usage["request-1"]["completion_tokens"] <= 3 * 8
    assert [c["index"] for c in choices(out["request-1"])] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices(out["request-1"])}) > 1  # sampled, seeded per choice
    json_row = choices(out["request-2"])[0]
    assert json_row["message"]["content"].startswith("{")
    if json_row["finish_reason"] == "stop":  # ended on eos: valid JSON for the schema
        Draft202012Validator(SCHEMA).validate(json.loads(json_row["message"]["content"]))
    logprobs = choices(out["request-3"])[0]["logprobs"]["content"]
    assert len(logprobs) == usage["request-3"]["completion_tokens"] <= 5
    assert all(len(token["top_logprobs"]) == 2 and token["logprob"] <= 0 for token in logprobs)
    asked = (BAD, "request-3", "request-13")
    assert all(c["logprobs"] is None for cid in out if cid not in asked for c in choices(out[cid]))
    stopped = choices(out["request-4"])[0]
    assert "e" not in stopped["message"]["content"]
    assert usage["request-5"]["completion_tokens"] <= 6
    assert all(usage[f"request-{i}"]["completion_tokens"] <= 4 for i in range(7, LINES))


def test_a_line_of_text_parts_gets_its_parts_on_both_engines(runs, parts_lm):
    """The template loops over parts: each engine's prompt is the template's own rendering of the
    line's parts (LLM.chat's for such a template), every text in it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(parts_lm)
    messages = batch_lines()[PARTS_LINE]["body"]["messages"]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    words = " ".join(WORDS[10:14])
    assert tokenizer.decode(ids) == f"<s><|system|>be brief<|end|><|user|>{words}<|end|><|assistant|>"
    for run in ("hf-1", "vllm-1"):
        line = next(line for line in output_of(runs[run]) if line["custom_id"] == f"request-{PARTS_LINE}")
        assert line["response"]["body"]["usage"]["prompt_tokens"] == len(ids), run


def test_greedy_lines_are_the_same_on_both_engines(runs):
    hf, vllm = ({line["custom_id"]: line for line in output_of(runs[name])} for name in ("hf-1", "vllm-1"))
    greedy = [cid for cid in hf if cid not in ("request-1", "request-4", BAD)]
    assert len(greedy) == LINES - 3
    for cid in greedy:
        assert [c["message"] for c in choices(hf[cid])] == [c["message"] for c in choices(vllm[cid])], cid
        assert [c["finish_reason"] for c in choices(hf[cid])] == [c["finish_reason"] for c in choices(vllm[cid])]


def test_vllm_lines_with_penalties_and_logit_bias(runs):
    """A +100 bias forces its token; neutral values are the clean line; with penalties and a bias,
    each greedy token is the best of the top 20 by raw log-probability + bias - presence_penalty if
    it was generated before - frequency_penalty x its count so far (OpenAI's definition). Tokens are
    told apart by their text: one that is part of a character (text "\ufffd", several ids) is
    left out of the comparison, and a step that chose one is not checked."""
    out = {line["custom_id"]: line for line in output_of(runs["vllm-1"])}
    forced = choices(out["request-12"])[0]
    assert forced["message"]["content"] == FORCED * 4 and forced["finish_reason"] == "length"
    assert choices(out["request-14"]) == choices(out["request-9"])
    bias = {"e": -5.0}
    steps, counts, moved = choices(out["request-13"])[0]["logprobs"]["content"], {}, 0

    def score(token: dict) -> float:
        seen = counts.get(token["token"], 0)
        return (token["logprob"] + bias.get(token["token"], 0.0) - PENALTIES["presence_penalty"] * (seen > 0)
                - PENALTIES["frequency_penalty"] * seen)

    for step in steps:
        known = [token for token in step["top_logprobs"] if "\ufffd" not in token["token"]]
        best = max(known, key=score)
        assert "\ufffd" in step["token"] or score(step) >= score(best) - 1e-4, (step["token"], best["token"])
        moved += step["token"] != step["top_logprobs"][0]["token"]  # not the raw argmax
        counts[step["token"]] = counts.get(step["token"], 0) + 1
    assert moved, "the penalties and the bias changed no token: the check above proved nothing"


def gather_again(workdir: Path, out: Path, shard_paths: list[str]) -> None:
    from shardinfer.proof.gather import run_gather

    settings = settings_of(workdir)
    digest = json.loads(pq.ParquetFile(shard_paths[0]).metadata.metadata[IDENTITY_KEY])["digest"]
    run_gather(gather_job(workdir / "results" / "plan.json", shard_paths, settings.input,
                          {"path": settings.model.path}, digest, out / "predictions.parquet", out / "summary.json"))


def test_the_proof_covers_the_batch_output_file(runs, tmp_path):
    """Gathered again from the run's shards: the same files. With one text of shard 1 edited (its
    metadata kept): refused, and none of the table and the batch files is written."""
    workdir = runs["hf-3"]
    shard_paths = [str(workdir / "results" / "shards" / f"{shard}.parquet") for shard in range(3)]
    gather_again(workdir, tmp_path / "again", shard_paths)
    for name in ("batch_output.jsonl", "batch_errors.jsonl"):
        assert (tmp_path / "again" / name).read_bytes() == (workdir / "results" / name).read_bytes()
    copies = [tmp_path / "shards" / Path(path).name for path in shard_paths]  # one folder, as gather reads it
    copies[0].parent.mkdir()
    for path, copy in zip(shard_paths, copies):
        shutil.copyfile(path, copy)
    edited = copies[1]
    file = pq.ParquetFile(shard_paths[1])
    table = file.read()
    texts = table.column("generated").to_pylist()
    texts[0] = ["not what the model wrote"] + texts[0][1:]
    table = table.set_column(table.schema.get_field_index("generated"), "generated",
                             pa.array(texts, table.schema.field("generated").type))
    with pq.ParquetWriter(str(edited), table.schema.remove_metadata()) as writer:
        writer.write_table(table.replace_schema_metadata(None))
        writer.add_key_value_metadata({k: v for k, v in file.metadata.metadata.items() if k != b"ARROW:schema"})
    with pytest.raises(ProofError, match="shard 1 .*its values are not those its job wrote"):
        gather_again(workdir, tmp_path / "edited", list(map(str, copies)))
    assert not any((tmp_path / "edited").glob("*")) and not any((tmp_path / "edited").glob(".*"))  # no partial


def refusal(tmp_path: Path, lines: list, settings) -> str:
    path = tmp_path / "refused.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    inp = dataclasses.replace(settings.input, path=str(path), parts=(str(path),))
    with pytest.raises(UserError) as caught:
        scan_input(inp)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize(("change", "message"), [
    (lambda lines: lines.append(request(1)), r"line 13: custom_id 'request-1' is also line 2's"),
    (lambda lines: lines[2].update(url="/v1/embeddings"), r"line 3: url '/v1/embeddings' .* allowed: POST "
                                                          "/v1/chat/completions"),
    (lambda lines: lines[0]["body"].update(tools=[{"type": "function"}]),
     r"line 1: custom_id 'request-0': body.tools .* is not supported"),
    (lambda lines: lines[0]["body"].update(presence_penalty=0.5), r"line 1: custom_id 'request-0': "
     r"body.presence_penalty 0.5 is varied per row by generate.engine vllm only; set generate.engine: vllm"),
    (lambda lines: lines[7]["body"].update(max_tokens=33), r"line 8: custom_id 'request-7': body.max_tokens 33 is "
                                                           "above model.max_new_tokens 32, .* set model.max_new_tokens "
                                                           "to 33 or more"),
    (lambda lines: lines[4]["body"].update(temperature=3),
     r"line 5: custom_id 'request-4': body.temperature must be a number from 0.0 to 2.0; got 3"),
    (lambda lines: lines[1]["body"].update(temperature=0), r"line 2: custom_id 'request-1': body.n 3 with temperature"),
    (lambda lines: lines[3]["body"].update(logprobs=False),
     r"line 4: custom_id 'request-3': body.top_logprobs needs body.logprobs: true"),
    (lambda lines: lines[0]["body"].update(response_format={"type": "xml"}),
     r"line 1: custom_id 'request-0': body.response_format must"),
    (lambda lines: lines[0]["body"]["messages"][0].update(content=[{"type": "image_url"}]),
     r"line 1: a message's content holds image_url parts"),
    (lambda lines: lines.insert(1, "not json"), r"line 2: not JSON"),
])
def test_a_bad_line_is_refused_in_one_line_naming_it(batch_settings, tmp_path, change, message):
    lines = batch_lines()
    change(lines)
    assert re.search(message, refusal(tmp_path, lines, batch_settings))


@pytest.mark.parametrize(("body", "message"), [
    ({"logit_bias": {"7": 101}}, r"body.logit_bias\['7'\] must be a number from -100.0 to 100.0; got 101"),
    ({"logit_bias": {"x": 1}}, r"body.logit_bias key 'x' is not a token id; allowed: an integer below the model's "
                               "vocab_size"),
    ({"logit_bias": {"100000": 1}}, r"body.logit_bias key '100000' is not a token id; allowed: an integer below "),
    ({"logit_bias": {"-3": 1}}, r"body.logit_bias key '-3' is not a token id"),
    ({"logit_bias": [1]}, r"body.logit_bias must be an object of token ids to biases; got \[1\]"),
    ({"frequency_penalty": -2.5}, r"body.frequency_penalty must be a number from -2.0 to 2.0; got -2.5"),
])
def test_a_bad_penalty_or_bias_is_refused_with_the_vllm_engine(batch_settings, tmp_path, body, message):
    lines = batch_lines()
    lines[2]["body"].update(body)
    settings = dataclasses.replace(batch_settings, input=dataclasses.replace(
        batch_settings.input, request_limits={**batch_settings.input.request_limits, "engine": "vllm"}))
    assert re.search(rf"line 3: custom_id 'request-2': {message}", refusal(tmp_path, lines, settings))


def test_settings_that_the_lines_give_are_refused_in_one_line(batch_settings):
    settings = batch_settings
    options = dataclasses.replace(settings.task_settings, n=2, do_sample=True)
    changed = dataclasses.replace(settings, task_settings=options)
    with pytest.raises(UserError, match=r"^generate.n: with input.format openai_batch each line sets its own n"):
        task_class("generate").check_settings(changed)
    vocab_size = json.loads((Path(settings.model.path) / "config.json").read_text())["vocab_size"]
    assert settings.input.request_limits == {"max_tokens": 32, "vocab_size": vocab_size, "engine": "transformers"}


def test_a_batch_file_is_refused_for_a_task_other_than_generate(batch_settings):
    from shardinfer.snakefile.configure import task_inputs

    with pytest.raises(UserError, match=r"^input.format openai_batch is read by task generate; model.task is embed$"):
        task_inputs("embed", {"format": "openai_batch", "path": batch_settings.input.path}, {})
