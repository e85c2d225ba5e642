"""SIGTERM and SIGINT are a clean stop. SIGTERM: what Slurm sends at a time limit or a preemption
(then SIGKILL after a grace period), and what `kill` sends by default; SIGINT: Ctrl-C in the terminal,
which signals Snakemake's whole process group, its shard jobs too.

The handler raises `Terminated` in the main thread wherever it is, inside a model call included, so
a shard job stops within seconds, not at the end of a window that may take minutes. The job then
lets its writer commit the windows already predicted (`shardinfer.shard.resume`), drops the one in
flight, and exits non-zero with one line saying where a rerun resumes. A second signal while it
stops is ignored, so the commits finish.

The same stop, for an engine over several machines that lost a node rank (`shardinfer.nodes.launch`
signals LOST_SIGNAL): the line names the rank and its node instead of a signal.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from shardinfer.nodes.launch import LOST_SIGNAL, lost_rank

STOPPING = (signal.SIGTERM, signal.SIGINT, LOST_SIGNAL)


class Terminated(BaseException):
    """SIGTERM or SIGINT arrived, or a node rank was lost (`name`: which). A BaseException, as
    KeyboardInterrupt is: no `except Exception` (a task's own, row_errors' narrowing) may take it
    for a failed row."""

    def __init__(self, name: str = "SIGTERM") -> None:
        super().__init__(name)
        self.name = name


def _raise_terminated(signum, frame) -> None:
    for stopping in STOPPING:
        signal.signal(stopping, signal.SIG_IGN)
    raise Terminated(lost_rank() if signum == LOST_SIGNAL else signal.Signals(signum).name)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM or SIGINT raises `Terminated` in the main thread (once)."""
    previous = {stopping: signal.signal(stopping, _raise_terminated) for stopping in STOPPING}
    try:
        yield
    finally:
        for stopping, handler in previous.items():
            signal.signal(stopping, handler)
