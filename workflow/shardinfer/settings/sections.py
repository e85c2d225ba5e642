"""A task's config section (`generate:`, `embed:`, `score:`) as a typed, frozen object, parsed and
checked once when the settings are built (`shardinfer.snakefile.configure`), and travelling to jobs as the
section's mapping (`to_dict`).

**Added keys leave digests alone.** A finished shard reruns when its settings digest or its job's
params change (`shardinfer.snakefile.settings_digest`, `shardinfer.snakefile.rule_params`). Both are made of the
section's mapping, and Snakemake's `validate` fills every key of a section with its default. So a
key added to a section is declared with `added(...)`: it enters the mapping only when it differs
from its default, and a config that does not set it keeps the digests and params it had
(tests/test_digests_pinned.py). The keys a section had before the rule stay in the mapping as
they always were, in the order the config gave them (Snakemake compares params by their repr).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from shardinfer.core.errors import UserError
from shardinfer.settings.schema import BARE_WORDS, defaults

ADDED = "added"  # field metadata: a key added after the digest rule, in the mapping only when set


def added(section: str, key: str) -> Any:
    """A field for a key added to `section` after the digests were pinned, defaulting to the schema's
    default: omitted from the section's mapping (digest, params) while it holds that default."""
    return field(default_factory=lambda: defaults(section)[key], metadata={ADDED: True})


def from_schema(section: str, key: str) -> Any:
    """A field defaulting to the schema's default (the one home of defaults: `shardinfer.settings.schema`)."""
    return field(default_factory=lambda: defaults(section)[key])


def default_of(spec: dataclasses.Field) -> Any:
    return spec.default_factory() if spec.default_factory is not MISSING else spec.default


def as_config(value: Any) -> Any:
    """A value as YAML gives it: tuples as lists, inside mappings too."""
    if isinstance(value, (tuple, list)):
        return [as_config(item) for item in value]
    if isinstance(value, Mapping):
        return {key: as_config(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class TaskSettings:
    """A task's section. Subclasses declare its keys as fields (`from_schema`, or `added` for keys
    added later) and may normalize values in `parse`."""

    section: ClassVar[str | None] = None
    # the keys in the order the config gave them: the mapping keeps it (not compared)
    given: tuple[str, ...] = field(default=(), compare=False, repr=False, kw_only=True)

    @classmethod
    def keys(cls) -> list[str]:
        return [spec.name for spec in dataclasses.fields(cls) if spec.name != "given"]

    @classmethod
    def from_section(cls, section: Mapping | None) -> TaskSettings:
        """The typed section from the validated config's mapping (or a job's params)."""
        section = dict(section or {})
        unknown = sorted(set(section) - set(cls.keys()))
        if unknown:
            allowed = ", ".join(cls.keys()) or "none"
            raise UserError(f"{cls.section or 'this task'}: unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
        values = {key: cls.parse(key, value) for key, value in section.items()}
        return cls(**values, given=tuple(section))

    @classmethod
    def parse(cls, key: str, value: Any) -> Any:
        """A value as the object holds it (lists as tuples: the object is frozen)."""
        return tuple(value) if isinstance(value, list) else value

    def to_dict(self) -> dict:
        """The section's mapping: the keys in the config's order, then the others in field order; a key
        added later (`added`) only when it differs from its default."""
        specs = {spec.name: spec for spec in dataclasses.fields(self) if spec.name != "given"}
        order = [*(key for key in self.given if key in specs), *(key for key in specs if key not in self.given)]
        return {key: as_config(getattr(self, key)) for key in order
                if not (specs[key].metadata.get(ADDED) and getattr(self, key) == default_of(specs[key]))}

    def get(self, key: str, default: Any = None) -> Any:
        """A key's value, read as from the section's mapping."""
        return getattr(self, key, default)


@dataclass(frozen=True)
class NoSettings(TaskSettings):
    """A task without a section of its own (classify, custom)."""


STRUCTURED_KINDS = ("json", "regex", "choice")


def structured_spec(value: Mapping | None) -> dict | None:
    """`generate.structured` checked and normalized: exactly one of json (a JSON schema, inline or the
    path of a .json file, read here once), regex, choice; `whitespace` (json only). The schema's
    own words are checked here (jsonschema's meta-schema, Python's regex syntax); the grammar
    library compiles it when the task loads, before any row runs."""
    if value is None:
        return None
    kinds = [kind for kind in STRUCTURED_KINDS if value.get(kind) is not None]
    if len(kinds) != 1:
        raise UserError(f"generate.structured needs exactly one of json, regex, choice; got {kinds or 'none'}")
    kind, spec = kinds[0], value[kinds[0]]
    if value.get("whitespace") is not None and kind != "json":
        raise UserError(f"generate.structured.whitespace is for json; leave it out with {kind}")
    if kind == "json":
        return {"json": json_schema(spec), "whitespace": value.get("whitespace") or "any"}
    if kind == "regex":
        try:
            re.compile(spec)
        except re.error as error:
            raise UserError(f"generate.structured.regex {spec!r} is not a regular expression ({error})") from None
        return {"regex": spec}
    if not spec or any(not isinstance(choice, str) or not choice for choice in spec):
        raise UserError(f"generate.structured.choice must be a list of non-empty strings; got {spec!r}")
    return {"choice": list(spec)}


def json_schema(spec: Mapping | str) -> dict:
    """A JSON schema given inline (a mapping, or its JSON text) or as a .json file's path, checked
    against jsonschema's meta-schema."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    where = "generate.structured.json"
    if isinstance(spec, str) and not spec.lstrip().startswith("{"):
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"{where}: `{spec}` is neither a JSON schema nor a file (give a schema or a .json "
                            "file's path)")
        where, spec = f"{where} `{spec}`", path.read_text()
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as error:
            raise UserError(f"{where} is not JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(spec, Mapping):
        raise UserError(f"{where} must be a JSON schema object; got {type(spec).__name__}")
    try:
        Draft202012Validator.check_schema(spec)
    except SchemaError as error:
        raise UserError(f"{where} is not a valid JSON schema ({error.message})") from None
    found = booleans_for_words(spec)
    if found:
        key, values = found
        quoted = "enum: ['yes', 'no']" if key.endswith("enum") else "const: 'yes'"
        raise UserError(f"{where}: `{key}` holds {values!r} without `type: boolean` beside it: {BARE_WORDS}; quote "
                        f"the words ({quoted}), or add type: boolean where booleans are meant")
    return dict(spec)


def booleans_for_words(schema: Any, key: str = "") -> tuple[str, Any] | None:
    """The first `enum` or `const` of a JSON schema that holds a boolean in a node whose `type` does
    not allow booleans (`enum: [yes, no]` in YAML: [True, False]), as (its key path, its values); None
    when there is none. Such a constraint asks for JSON's true and false, which the words were not."""
    if isinstance(schema, list):
        return next(filter(None, (booleans_for_words(item, f"{key}.{k}".lstrip(".")) for k, item in
                                  enumerate(schema))), None)
    if not isinstance(schema, Mapping):
        return None
    types = schema.get("type")
    boolean = "boolean" in (types if isinstance(types, list) else [types])
    for name in ("enum", "const"):
        values = schema.get(name, []) if name == "enum" else [schema.get(name)]
        if name in schema and not boolean and any(isinstance(value, bool) for value in values):
            return f"{key}.{name}".lstrip("."), schema[name]
    return next(filter(None, (booleans_for_words(value, f"{key}.{name}".lstrip(".")) for name, value in
                              schema.items() if name not in ("enum", "const"))), None)


@dataclass(frozen=True)
class GenerateSettings(TaskSettings):
    """`generate:` (workflow/schemas/config.schema.yaml describes each key)."""

    section: ClassVar[str] = "generate"
    engine: str = from_schema("generate", "engine")
    vllm: dict = from_schema("generate", "vllm")
    chat_template: bool = from_schema("generate", "chat_template")
    system_prompt: str | None = from_schema("generate", "system_prompt")
    do_sample: bool = from_schema("generate", "do_sample")
    temperature: float = from_schema("generate", "temperature")
    top_p: float = from_schema("generate", "top_p")
    seed: int = from_schema("generate", "seed")
    stop: tuple[str, ...] = from_schema("generate", "stop")
    n: int = added("generate", "n")
    logprobs: int | None = added("generate", "logprobs")
    structured: dict | None = added("generate", "structured")
    server: dict = added("generate", "server")

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "vllm", dict(self.vllm or {}))
        object.__setattr__(self, "server", dict(self.server or {}))

    @classmethod
    def parse(cls, key: str, value: Any) -> Any:
        return structured_spec(value) if key == "structured" else super().parse(key, value)


@dataclass(frozen=True)
class EncoderSettings(TaskSettings):
    """What the encoder tasks' sections share: the engine that runs them and vLLM's arguments (added
    keys: a section that sets neither keeps its digests)."""

    # one schema for these keys in every encoder section (a YAML anchor): classify's defaults are theirs
    engine: str = added("classify", "engine")
    vllm: dict = added("classify", "vllm")

    def __post_init__(self) -> None:
        object.__setattr__(self, "vllm", dict(self.vllm or {}))


@dataclass(frozen=True)
class ClassifySettings(EncoderSettings):
    section: ClassVar[str] = "classify"


@dataclass(frozen=True)
class TokenClassifySettings(EncoderSettings):
    section: ClassVar[str] = "token-classify"


@dataclass(frozen=True)
class EmbedSettings(EncoderSettings):
    section: ClassVar[str] = "embed"
    pooling: str = from_schema("embed", "pooling")
    normalize: bool = from_schema("embed", "normalize")
    server: dict = added("embed", "server")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "server", dict(self.server or {}))


@dataclass(frozen=True)
class ScoreSettings(EncoderSettings):
    section: ClassVar[str] = "score"
    pair_column: str | None = from_schema("score", "pair_column")
    sigmoid: bool = from_schema("score", "sigmoid")


@dataclass(frozen=True)
class Seq2SeqSettings(TaskSettings):
    """`seq2seq:`, a section born after the digests were pinned: its keys are `from_schema`, as no
    earlier digest holds it (a key added to it later is `added`)."""

    section: ClassVar[str] = "seq2seq"
    num_beams: int = from_schema("seq2seq", "num_beams")


# The sections by task: a task with a section of its own adds its class here (and the section to the schema).
SECTIONS: dict[str, type[TaskSettings]] = {"generate": GenerateSettings, "classify": ClassifySettings,
                                           "embed": EmbedSettings, "score": ScoreSettings,
                                           "token-classify": TokenClassifySettings, "seq2seq": Seq2SeqSettings}


def section_settings(task: str, section: Mapping | TaskSettings | None) -> TaskSettings:
    """The task's typed section from its mapping (an object already typed is kept)."""
    if isinstance(section, TaskSettings):
        return section
    return SECTIONS.get(task, NoSettings).from_section(section)
