"""Running a rule's function inside a Snakemake job: its output goes to the rule's log.

Each job writes only to its own log, so concurrent jobs never interleave. A UserError becomes one
`ERROR:` line and exit status 1; the default profile's show-failed-logs puts it on the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from shardinfer.errors import UserError

T = TypeVar("T")


def log_to(path: str) -> None:
    """Send this process's stderr (Python and C level) and its logging to `path`."""
    handle = open(path, "w", buffering=1)
    os.dup2(handle.fileno(), 2)
    sys.stderr = handle
    logging.basicConfig(stream=handle, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)


def run_job(log_path: str, function: Callable[..., T], *args, outdated: Sequence[str] = (), **kwargs) -> T:
    """`function(*args, **kwargs)` with its output in the rule's log; `outdated`: the previous run's
    final outputs that this job's work replaces, removed first, so that a run failing from here on
    leaves no old table that a downstream step could take for this run's."""
    log_to(log_path)
    withdraw(outdated)
    try:
        return function(*args, **kwargs)
    except UserError as error:
        logging.getLogger("shardinfer").error("%s", error)
        sys.exit(1)


def withdraw(paths: Sequence[str]) -> None:
    """Remove the final outputs that the job being run makes outdated (the plan or a shard remade:
    gather runs again after it), saying so in the job's log."""
    for path in map(Path, paths):
        if path.exists():
            path.unlink()
            logging.getLogger("shardinfer").info("removed %s of the previous run: this run remakes it", path)
