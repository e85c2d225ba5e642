"""The Snakemake plugins only some tests use, installed beside the venv (tests/install-plugins):
Snakemake imports every plugin it finds at each start, so the suite's other runs go without them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PLUGINS = Path(sys.executable).parent.parent / "test-plugins"


def with_plugins(env: dict) -> dict:
    """`env` for a Snakemake process (and the jobs it starts) that finds the plugins: PLUGINS on PYTHONPATH."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")]))}


def importable() -> None:
    """The plugins importable in this process too."""
    if PLUGINS.is_dir() and str(PLUGINS) not in sys.path:
        sys.path.insert(0, str(PLUGINS))
