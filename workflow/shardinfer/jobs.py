"""Running a rule's function inside a Snakemake job: its output goes to the rule's log.

Each job writes only to its own log, so concurrent jobs never interleave. A UserError becomes one
`ERROR:` line and exit status 1; the default profile's show-failed-logs puts it on the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable, TypeVar

from shardinfer.errors import UserError

T = TypeVar("T")


def log_to(path: str) -> None:
    """Send this process's stderr (Python and C level) and its logging to `path`."""
    handle = open(path, "w", buffering=1)
    os.dup2(handle.fileno(), 2)
    sys.stderr = handle
    logging.basicConfig(stream=handle, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)


def run_job(log_path: str, function: Callable[..., T], *args, **kwargs) -> T:
    log_to(log_path)
    try:
        return function(*args, **kwargs)
    except UserError as error:
        logging.getLogger("shardinfer").error("%s", error)
        sys.exit(1)
