"""The config schema (workflow/schemas/config.schema.yaml) as data: the one home of every key's
default. The Snakefile fills them into the config (`fill_defaults`); code that builds settings without
a validated config (unit tests, scripts/benchmark.py, a task driven by hand) reads them here, so
no default is written down twice.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"
# Why a config holds a boolean where a word was written: YAML 1.1 (PyYAML, which Snakemake reads the
# config with) turns these bare words into booleans. Said beside each refusal of such a boolean.
BARE_WORDS = "YAML reads bare yes, no, on, off, true and false as booleans"


def parse_yaml(text: str) -> dict:
    """YAML as `yaml.safe_load` reads it, by libyaml's loader where installed: the schema parses in a
    fraction of the pure-Python loader's time, and every `snakemake` start reads it."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def _schema(path: Path) -> dict:
    return parse_yaml(path.read_text())


def schema_at(path: str | Path | None = None) -> dict:
    """The schema at `path` (the Snakefile's copy; None: this package's), parsed once per process and
    shared: read it, never change it. The Snakefile's checks and its defaults take it from here."""
    return _schema(Path(path or SCHEMA_PATH).resolve())


def schema() -> dict:
    """The schema, parsed (a copy: callers may change it)."""
    return copy.deepcopy(schema_at())


def defaults(section: str | None = None) -> dict:
    """What Snakemake's `validate` fills into a config that sets nothing (`section` None), or into
    a section given with none of its keys (`defaults("generate")`, `defaults("input")`)."""
    node = schema_at() if section is None else schema_at()["properties"][section]
    return filled(node)


def filled(node: dict) -> dict:
    """The defaults of `node`'s properties, a section's own below it, as `validate` fills them: it
    sets each missing key to its default, then validates (and so fills) the value it set."""
    values = {}
    for key, child in node.get("properties", {}).items():
        if "default" in child:
            value = copy.deepcopy(child["default"])
            values[key] = {**filled(child), **value} if isinstance(value, dict) and "properties" in child else value
    return values


def fill_defaults(config: dict, schema_path: str | Path | None = None) -> dict:
    """Fill the schema's defaults into `config` in place, as Snakemake's `validate(config, schema)`
    does (its jsonschema recipe: each missing property set to its default, which is then validated and
    so filled in turn), without what `validate` costs at each parse of the Snakefile (every run and
    every cluster job): the schema read a second time, and pandas imported to ask whether the config is a
    DataFrame. The config has passed `shardinfer.snakefile.checks.schema_errors` before."""
    from jsonschema import Draft202012Validator, validators

    check_properties = Draft202012Validator.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        for key, child in properties.items():
            if "default" in child and isinstance(instance, dict):
                instance.setdefault(key, copy.deepcopy(child["default"]))
        yield from check_properties(validator, properties, instance, schema)

    filling = validators.extend(Draft202012Validator, {"properties": set_defaults})
    for _ in filling(schema_at(schema_path)).iter_errors(config):
        pass  # refused before, in one line (schema_errors)
    return config
