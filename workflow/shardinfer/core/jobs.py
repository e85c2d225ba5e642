"""Running a rule's function inside a Snakemake job: its output goes to the rule's log.

Each job writes only to its own log, so concurrent jobs never interleave. A UserError becomes one
`ERROR:` line and exit status 1; the default profile's show-failed-logs puts it on the terminal.

Ctrl-C in a terminal sends SIGINT to Snakemake's whole process group, every job included: a job
then stops with one line too, not a KeyboardInterrupt traceback of wherever it was (two shard
jobs: two tracebacks of ~90 lines). From its script's first line (`quiet_interrupt`, before the
imports that take seconds) to its end. Every output is written atomically, so a stopped job leaves
none; a shard job first commits the windows it predicted (`shardinfer.shard.stop`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from shardinfer.core.errors import UserError

T = TypeVar("T")


class Untracked:
    """A rule param's values that Snakemake's params rerun trigger does not compare: it compares values
    of builtin types only and leaves out one it cannot represent (snakemake.persistence). For what a
    job is told that must not rerun a finished job when it changes: the files of `output.writers`,
    which a plan or shard job withdraws (`Layout.also_outdated`), when a writer is switched on."""

    def __init__(self, values: Sequence[str]) -> None:
        self.values = tuple(values)

    def __iter__(self):
        return iter(self.values)

    def __repr__(self) -> str:
        return f"Untracked({list(self.values)!r})"


def log_to(path: str) -> None:
    """Send this process's stderr (Python and C level) and its logging to `path`."""
    handle = open(path, "w", buffering=1)
    os.dup2(handle.fileno(), 2)
    sys.stderr = handle
    logging.basicConfig(stream=handle, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)


def quiet_interrupt(rule: str) -> None:
    """The first call of a job's script: SIGINT while it starts (its imports, before `run_job`)
    ends it with one line on the terminal, where its stderr still goes, and exit status 1."""

    def starting(signum, frame) -> None:
        raise SystemExit(f"shardinfer: the {rule} job was interrupted (SIGINT) while it started; it wrote nothing")

    signal.signal(signal.SIGINT, starting)


def run_job(log_path: str, function: Callable[..., T], *args, outdated: Sequence[str] = (), **kwargs) -> T:
    """`function(*args, **kwargs)` with its output in the rule's log; `outdated`: the previous run's
    final outputs that this job's work replaces, removed first, so that a run failing from here on
    leaves no old table that a downstream step could take for this run's. SIGINT (Ctrl-C) is one
    line in the log, as an error is."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = logging.getLogger("shardinfer")
    try:
        log_to(log_path)
        withdraw(outdated)
        done = function(*args, **kwargs)
    except UserError as error:
        log.error("%s", error)
    except KeyboardInterrupt:
        log.error("interrupted (SIGINT) before it finished: it wrote none of its outputs; rerun the same command")
    else:
        # Done: a Ctrl-C now (while Python exits) must not fail the job, or Snakemake removes its outputs.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return done
    sys.exit(1)


def withdraw(paths: Sequence[str], why: str = "of the previous run: this run remakes it") -> None:
    """Remove the final outputs that the job being run makes outdated (the plan or a shard remade:
    gather runs again after it; gather: what no writer of this run writes), saying so in the job's log."""
    for path in map(Path, paths):
        if path.is_dir() and not path.is_symlink():  # the parts layout's folder
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        logging.getLogger("shardinfer").info("removed %s %s", path, why)
