"""`scripts/benchmark.py --task server`: the shard job on `generate.engine: server` against a vLLM
server this benchmark starts, beside the shard job on the in-process vLLM engine, same prompts.

    PYTHONPATH=workflow .venv/bin/python scripts/benchmark.py --task server --shape qwen-cpu-small \
        --rows 1000 --max-new-tokens 256 --max-length 128 --repeats 2

On a GPU both engines share it (the server stays up while the in-process jobs run): give both
half of it, `--device cuda --vllm-args '{"gpu_memory_utilization": 0.4}'`.

The prompts are `common.prompt_texts` (long-tailed), greedy, for `common.build_generator`'s random
Qwen2 (rows end at varied lengths on eos). The server is vLLM's OpenAI server (`vllm serve`'s entry
point) on the same model folder with the in-process engine's own arguments as its flags
(`batch_file.run_batch_flags`), its engine on the same CPU cores (VLLM_CPU_OMP_THREADS_BIND) and
threads; it starts once, before the rounds, and is stopped at the end. Each shard job runs in a
process of its own (`child`), end to end as a Snakemake job runs, `--repeats` rounds in turn; the
generating time (the shard job's device stage: for the server, the requests from the first sent to
the last answered) of the fastest round counts, with each round's ratio and their median
(`paired`). Every row's generated text, token count and finish reason must be equal, else no time
is printed. `--concurrency`: the server engine's requests in flight (generate.server.concurrency);
`--server-bind`: where the server's CPU engine runs (`auto`, vLLM's default: a core kept for its
front end; `all`: every benchmark thread's core, as the in-process engine, shared with the front
end and the shard job; or a VLLM_CPU_OMP_THREADS_BIND value).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.batch_file import run_batch_flags
from benchmarks.child import child, generating
from benchmarks.common import bench_settings, build_generator, prompt_texts
from benchmarks.paired import median_ratio
from shardinfer.plan.plan_file import run_plan

MODEL_NAME = "bench"
SERVE = ("import sys; from vllm.entrypoints.launchers.api_server.entry import main; "
         "sys.argv = ['vllm-serve', *sys.argv[1:]]; main()")
COMPARED = ["generated", "n_prompt_tokens", "n_generated_tokens", "finish_reason"]


def free_port() -> int:
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def start_server(model_dir: Path, flags: list[str], threads: int, bind: str, log: Path
                 ) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server on `model_dir`, its CPU engine bound as `bind` says (`auto`: vLLM's
    default, which keeps a core for the server's front end; `all`: this machine's first `threads`
    cores, as the in-process engine); its URL once /v1/models answers."""
    import httpx

    port = free_port()
    command = [sys.executable, "-c", SERVE, "--model", str(model_dir), "--served-model-name", MODEL_NAME,
               "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", *flags]
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))[:threads])) if bind == "all" else bind
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": cores,
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log, "w") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url, started = f"http://127.0.0.1:{port}/v1", time.perf_counter()
    while server.poll() is None:
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                print(f"vLLM server up in {time.perf_counter() - started:.0f} s at {url} (engine on cores {cores})")
                return server, url
        except httpx.HTTPError:
            time.sleep(1)
    raise SystemExit(f"the vLLM server did not start:\n{log.read_text()[-4000:]}")


def stop_server(server: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def bench_server(args, work: Path) -> None:
    threads = int(os.environ.get("SHARDINFER_BENCH_THREADS", os.cpu_count() or 1))
    shape = args.shape or ("qwen-cpu-gen" if args.device == "cpu" else "qwen-0.5b")
    rows = args.rows or 1000
    model_dir = build_generator(shape, work / "model", args.eos_rate, args.repetition_penalty)
    data = work / "input.parquet"
    pd.DataFrame({"id": np.arange(rows), "text": prompt_texts(rows)}).to_parquet(data)
    settings = bench_settings(model_dir, data, args.max_length, args.max_tokens, "generate", args.max_new_tokens,
                              max_rows=args.max_rows)
    in_process = dataclasses.replace(settings, task_settings={"engine": "vllm", "vllm": args.vllm_args})
    run_plan(settings.input, 1, args.max_length, str(work / "plan.json"))
    config = {"input": {"path": str(data)}, "model": {"path": str(model_dir), "task": "generate",
                                                      "max_length": args.max_length,
                                                      "max_new_tokens": args.max_new_tokens},
              "generate": {"engine": "vllm", "vllm": args.vllm_args}, "shards": 1}
    flags = run_batch_flags(config, args.device)
    server, url = start_server(model_dir, flags, threads, args.server_bind, work / "server.log")
    try:
        served = dataclasses.replace(settings, task_settings={"engine": "server", "server": {
            "url": url, "model": MODEL_NAME, "concurrency": args.concurrency}})
        runs = {"in-process vLLM": [], "server": []}
        for _ in range(args.repeats):
            runs["in-process vLLM"].append(child("shard", in_process, work, args.device))
            runs["server"].append(child("shard", served, work, args.device))
    finally:
        stop_server(server)
    report(runs, rows, flags, threads, args.concurrency, args.server_bind)


def report(runs: dict, rows: int, flags: list[str], threads: int, concurrency: int, bind: str) -> None:
    local, served = runs["in-process vLLM"][-1]["frame"], runs["server"][-1]["frame"]
    same = (local[COMPARED] == served[COMPARED]).all(axis=1)
    if not same.all():
        raise SystemExit(f"{int((~same).sum())} of {rows} rows differ, first rows {np.flatnonzero(~same)[:5].tolist()}")
    generated = local["n_generated_tokens"].to_numpy()
    print(f"\n{rows} prompts, greedy, {threads} threads, server flags: {' '.join(flags)}; concurrency {concurrency}; "
          f"the server's engine bound: {bind}")
    print(f"every row equal (text, token counts, finish reason); generated per row {generated.min()}.."
          f"{generated.max()} (median {int(np.median(generated))}), {int(generated.sum())} tokens")
    seconds = {name: [generating(run) for run in each] for name, each in runs.items()}
    best = {name: min(each) for name, each in seconds.items()}
    for name, each in seconds.items():
        wall = min(run["wall"] for run in runs[name])
        print(f"  {name:16} generating {best[name]:7.2f} s ({rows / best[name]:7.1f} rows/s), wall {wall:6.1f} s, "
              f"rounds {'/'.join(f'{t:.1f}' for t in each)}")
    print(f"  server / in-process rows/s: {best['in-process vLLM'] / best['server']:.3f}x fastest, paired "
          f"{median_ratio(seconds['in-process vLLM'], seconds['server'])} (goal >= 0.85x)")
