"""`scripts/benchmark.py --task batch-file`: an OpenAI batch file through the workflow, a real
`snakemake` run (plan, the vLLM shard job, gather's proof and results/batch_output.jsonl), against
`vllm run-batch` (`python -m vllm.entrypoints.openai.run_batch -i in.jsonl -o out.jsonl --model
<dir>`), the peer a user of such files would pick, on the same file.

    PYTHONPATH=workflow .venv/bin/python scripts/benchmark.py --task batch-file --rows 200 --max-new-tokens 64

The file: `--rows` chat completion requests, each one user message of `common.prompt_texts`,
greedy (temperature 0), max_tokens `--max-new-tokens`, for `common.build_generator`'s random
Qwen2 (rows end at varied lengths), with a chat template added. Both run offline on this machine's
CPU on the same model folder, with the same engine arguments (the shard job's `engine_arguments`,
given to run-batch as its flags; run-batch keeps its default generation config, which applies the
model's repetition penalty as the shard job does) and the same threads. Each must answer every
line, and their message contents are compared line by line before any time is printed. Times: the
wall clock of each command end to end (imports, engine start, reading, generating, writing), each
run `--repeats` times in turn, the fastest counting; the shard job's generating time beside.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import REPO
from benchmarks.common import build_generator, prompt_texts

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
MODEL_NAME = "bench"  # each line's body.model: run-batch answers 404 unless it is a name it serves


def chat_model(args, work: Path) -> Path:
    """`build_generator`'s model, its tokenizer given a chat template."""
    from transformers import AutoTokenizer

    shape = args.shape or ("qwen-cpu-gen" if args.device == "cpu" else "qwen-0.5b")
    model_dir = build_generator(shape, work / "model", args.eos_rate, args.repetition_penalty)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(model_dir)
    return model_dir


def write_lines(path: Path, rows: int, max_tokens: int) -> list[str]:
    """The batch file; its custom_ids."""
    ids = [f"request-{k}" for k in range(rows)]
    with open(path, "w", encoding="utf-8") as sink:
        for custom_id, text in zip(ids, prompt_texts(rows)):
            body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                    "temperature": 0}
            sink.write(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                                   "body": body}) + "\n")
    return ids


def workflow_config(args, lines: Path, model_dir: Path) -> dict:
    return {"input": {"path": str(lines), "format": "openai_batch"},
            "model": {"path": str(model_dir), "task": "generate", "max_length": args.max_length,
                      "max_new_tokens": args.max_new_tokens},
            "generate": {"engine": "vllm", "vllm": args.vllm_args},
            "batch": {"max_tokens": args.max_tokens, "max_rows": args.max_rows}, "shards": 1}


def run_batch_flags(config: dict, device: str) -> list[str]:
    """The shard job's engine arguments as run-batch's flags (model and tokenizer aside, and
    generation_config: run-batch applies the model's, as the shard job does through its own mapping)."""
    import torch
    import yaml
    from snakemake.utils import validate

    from shardinfer.engines.vllm.engine import engine_arguments
    from shardinfer.hf.models import choose_dtype
    from shardinfer.settings.schema import SCHEMA_PATH
    from shardinfer.snakefile.configure import settings_by_input
    from shardinfer.tasks.base import LoadContext

    config = yaml.safe_load(yaml.safe_dump(config))
    validate(config, str(SCHEMA_PATH))
    settings = settings_by_input(config)[None]
    context = LoadContext(settings, torch.device(device), choose_dtype(settings.model.dtype, torch.device(device)))
    flags = []
    for key, value in engine_arguments(context).items():
        if key in ("model", "tokenizer", "generation_config"):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{key.replace('_', '-')}")
        else:
            flags += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return flags


def ours(config: dict, work: Path, threads: int) -> tuple[float, dict, dict]:
    """A fresh `snakemake` run of the workflow: wall seconds, content by custom_id, the shard's stats."""
    import pyarrow.parquet as pq

    from shardinfer.contract.shard_file import STATS_KEY
    from tiny_workflow import WITHOUT_REPORT, local_env, prepare_workdir

    shutil.rmtree(work, ignore_errors=True)
    prepare_workdir(work, config)
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", str(threads),
               "--set-threads", f"infer={threads}", *WITHOUT_REPORT]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=work, capture_output=True, text=True, env=local_env(work))
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"the workflow failed:\n{result.stderr[-4000:]}")
    stats = json.loads(pq.ParquetFile(work / "results" / "shards" / "0.parquet").metadata.metadata[STATS_KEY])
    return wall, contents(work / "results" / "batch_output.jsonl"), stats


def theirs(lines: Path, model_dir: Path, flags: list[str], out: Path, threads: int) -> tuple[float, dict]:
    """`vllm run-batch` on the same file: wall seconds, content by custom_id."""
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(lines), "-o", str(out),
               "--model", str(model_dir), "--served-model-name", MODEL_NAME, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"vllm run-batch failed:\n{result.stderr[-4000:]}")
    return wall, contents(out)


def contents(path: Path) -> dict[str, str | None]:
    """Each output line's first choice's message content, by custom_id; an error line ends the
    benchmark (both must answer every line)."""
    found = {}
    for line in map(json.loads, path.read_text().splitlines()):
        body = (line.get("response") or {}).get("body")
        if not body:
            raise SystemExit(f"{path}: line {line['custom_id']} is an error: {json.dumps(line['error'])[:300]}")
        found[line["custom_id"]] = body["choices"][0]["message"]["content"]
    return found


def bench_batch_file(args, work: Path) -> None:
    threads = int(os.environ.get("SHARDINFER_BENCH_THREADS", os.cpu_count() or 1))
    rows, model_dir = args.rows or 200, chat_model(args, work)
    lines = work / "batch.jsonl"
    ids = write_lines(lines, rows, args.max_new_tokens)
    config = workflow_config(args, lines, model_dir)
    flags = run_batch_flags(config, args.device)
    walls = {"workflow": [], "run-batch": []}
    for repeat in range(args.repeats):
        wall, ours_out, stats = ours(config, work / f"workflow-{repeat}", threads)
        walls["workflow"].append(wall)
        wall, theirs_out = theirs(lines, model_dir, flags, work / f"run-batch-{repeat}.jsonl", threads)
        walls["run-batch"].append(wall)
    report(ids, ours_out, theirs_out, walls, stats, flags, threads)


def report(ids: list[str], ours_out: dict, theirs_out: dict, walls: dict, stats: dict, flags: list[str],
           threads: int) -> None:
    assert list(ours_out) == ids, "the workflow's output lines are not the input's, in order"
    assert set(theirs_out) == set(ids), "run-batch did not answer every line"
    same = sum(ours_out[i] == theirs_out[i] for i in ids)
    # a row cut inside a character: the workflow decodes the last token's bytes as U+FFFD, vLLM's
    # detokenizer holds incomplete bytes back
    cut = [i for i in ids if ours_out[i] != theirs_out[i] and ours_out[i].removesuffix("\ufffd") == theirs_out[i]]
    differ = [i for i in ids if ours_out[i] != theirs_out[i] and i not in cut]
    best = {name: min(each) for name, each in walls.items()}
    print(f"\n{len(ids)} lines, greedy, {threads} threads; run-batch flags: {' '.join(flags)}")
    print(f"same message content on {same} of {len(ids)} lines; {len(cut)} more differ only by the workflow's "
          f"trailing U+FFFD (a last token cut inside a character){cut[:5]}; differ: {len(differ)} {differ[:5]}")
    for name, each in walls.items():
        print(f"  {name:10} {best[name]:7.1f} s wall (best of {'/'.join(f'{t:.1f}' for t in each)}), "
              f"{len(ids) / best[name]:.2f} lines/s")
    print(f"  workflow / run-batch: {best['workflow'] / best['run-batch']:.3f}x the time; the shard job's "
          f"generating stage {stats['stages']['device']:.1f} s of its run")
