"""What vLLM's scheduler did in a run: its steps, the tokens it scheduled and the request-steps
(each step's requests, summed). Two runs with equal counts did the same engine work, step for
step: an engine drained at each window's end would show more steps for the same tokens, with
fewer requests in each, and a different schedule other counts. The benchmarks print them beside
the times, which a busy or virtual machine makes swing by more than the gaps they look for.
"""

from __future__ import annotations

COUNTS = {"steps": 0, "tokens": 0, "request_steps": 0}


def count_schedules() -> None:
    """Count every `Scheduler.schedule` from now on in this process (the engine in-process, as the
    shard job and `bare_vllm` run it: one schedule per engine step)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.schedule

    def schedule(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        COUNTS["steps"] += 1
        COUNTS["tokens"] += out.total_num_scheduled_tokens
        COUNTS["request_steps"] += len(out.num_scheduled_tokens)
        return out

    Scheduler.schedule = schedule


def reset() -> None:
    for key in COUNTS:
        COUNTS[key] = 0


def taken() -> dict[str, int]:
    return dict(COUNTS)


def line(counts: dict | None) -> str:
    """'342 steps, 78,162 tokens, 39,107 request-steps' ('-' without counts)."""
    if not counts:
        return "-"
    return f"{counts['steps']} steps, {counts['tokens']:,} tokens, {counts['request_steps']:,} request-steps"
