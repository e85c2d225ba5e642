"""SIGTERM is a clean stop: what Slurm sends at a time limit or a preemption (then SIGKILL after a
grace period), and what `kill` sends by default.

The handler raises `Terminated` in the main thread wherever it is, inside a model call included, so
a shard job stops within seconds, not at the end of a window that may take minutes. The job then
lets its writer commit the windows already predicted (`shardinfer.shard.resume`), drops the one in
flight, and exits non-zero with one line saying where a rerun resumes. A second SIGTERM while it
stops is ignored, so the commits finish.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, as KeyboardInterrupt is: no `except Exception` (a task's
    own, row_errors' narrowing) may take it for a failed row."""


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` in the main thread (once)."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
