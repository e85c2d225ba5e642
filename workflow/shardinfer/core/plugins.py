"""Plug-ins found by their package: every module of a package that defines a list (`FORMATS`,
`WRITERS`) adds its items, by name, in module-name order. The input formats and the output writers
are found so: adding one is adding its module."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable


def discover(package: str, path: Iterable[str], attribute: str) -> dict:
    """Each item of `attribute` in every module of `package` (its `__path__`: `path`), by its `name`."""
    found: dict = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(path)):
        for item in getattr(importlib.import_module(f"{package}.{module}"), attribute, ()):
            found[item.name] = item
    return found
