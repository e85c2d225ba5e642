"""config/README.md's table documents every key of the schema, with the schema's default and allowed
values, and no key the schema lacks: the keys come from the schema, so a new section only needs
its rows."""

import json
import re

import pytest

from factory import REPO
from shardinfer.schema import schema

TABLE_HEADER = "| key | default | allowed | meaning |"


def schema_keys(node: dict, prefix: str = "") -> dict[str, tuple[dict, bool]]:
    """Each documented key (`model.task`; a section with properties gives its keys, not itself;
    a mapping such as `inputs` or `generate.vllm` is one key) with its schema and whether required."""
    keys = {}
    for name, child in node.get("properties", {}).items():
        if child.get("properties"):
            keys.update(schema_keys(child, f"{prefix}{name}."))
        else:
            keys[f"{prefix}{name}"] = (child, name in node.get("required", ()))
    return keys


def table_rows() -> dict[str, tuple[str, str]]:
    """The table's rows: `key` -> (default cell, allowed cell)."""
    lines = (REPO / "config" / "README.md").read_text().splitlines()
    start = lines.index(TABLE_HEADER) + 2  # after the header and its |---| line
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        key, default, allowed, _ = (cell.strip() for cell in line.strip("|").split(" | ", 3))
        assert key not in rows, f"config/README.md documents {key} twice"
        rows[key.strip("`")] = (default, allowed)
    return rows


def shown(value) -> str:
    """A value as the table writes it: in backticks, as YAML would (`auto`, `null`, `[]`, `1.0`)."""
    return f"`{value}`" if isinstance(value, str) else f"`{json.dumps(value)}`"


KEYS = schema_keys(schema())
ROWS = table_rows()


def row(key: str) -> tuple[str, str]:
    """The key's default and allowed cells; a key without a row fails its test, naming it."""
    if key not in ROWS:
        pytest.fail(f"config/README.md has no row for {key}")
    return ROWS[key]


def test_the_table_documents_the_schemas_keys_and_no_other():
    assert sorted(set(KEYS) - set(ROWS)) == [], "keys of the schema without a row in config/README.md"
    assert sorted(set(ROWS) - set(KEYS)) == [], "rows in config/README.md for keys the schema lacks"


@pytest.mark.parametrize("key", sorted(KEYS))
def test_a_keys_default_is_the_schemas(key):
    """The default cell starts with the schema's default (more may follow: "`null` (required for
    ..."); a key without one is `(required...)` if the schema requires it, else `(none)`."""
    node, required = KEYS[key]
    cell = row(key)[0]
    if "default" in node:
        assert cell.split(" ")[0] == shown(node["default"]), f"{key}: {cell!r}, schema default {node['default']!r}"
    else:
        assert cell.startswith("(required") if required else cell == "(none)", f"{key}: {cell!r}"


@pytest.mark.parametrize("key", sorted(key for key, (node, _) in KEYS.items() if "enum" in node))
def test_a_keys_allowed_values_are_the_schemas(key):
    """An enumerated key's allowed cell lists its values, each in backticks, and no other."""
    listed = re.findall(r"`([^`]*)`", row(key)[1])
    assert listed == [str(value) for value in KEYS[key][0]["enum"]], f"{key}: {row(key)[1]!r}"
