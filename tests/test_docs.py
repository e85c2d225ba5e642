"""The docs site (docs/, mkdocs.yml) builds with `mkdocs build --strict`: a link to a page or a
heading that does not exist, or a page left out of the nav, fails here. The README and
config/README.md, which GitHub and the Snakemake workflow catalog render outside the site, link
into it with relative links: those are checked here too, anchors included. The README stays short
(the rest is the site's)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

from factory import REPO

README_LINES = 200
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(REPO / "mkdocs.yml"), "--site-dir", str(site)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    pages = sorted(path.relative_to(REPO / "docs").with_suffix("") for path in (REPO / "docs").rglob("*.md"))
    built = [site / (page.parent if page.name == "index" else page) / "index.html" for page in pages]
    assert pages and all(path.is_file() for path in built), [str(p) for p in built if not p.is_file()]


def nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_once():
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.SafeLoader)
    listed = nav_pages(config["nav"])
    assert sorted(listed) == sorted(p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md"))


def anchors(path: Path) -> set[str]:
    """The ids mkdocs gives a page's headings (Python-Markdown's toc, code spans as their text)."""
    text = FENCE.sub("", path.read_text())
    return {slugify(heading.replace("`", ""), "-") for heading in HEADING.findall(text)}


@pytest.mark.parametrize("name", ["README.md", "config/README.md"])
def test_links_from_outside_the_site_reach_a_file_and_heading(name):
    source = REPO / name
    links = [link for link in LINK.findall(FENCE.sub("", source.read_text())) if "://" not in link]
    assert links or name != "README.md"
    for link in links:
        target, _, anchor = link.partition("#")
        path = (source.parent / target).resolve() if target else source
        assert path.exists(), f"{name}: {link} names no file"
        if anchor:
            assert anchor in anchors(path), f"{name}: {link}: no heading with the id {anchor}"


def test_the_readme_is_short_and_keeps_the_two_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES
    install = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/snakemake --cores all"
    assert install in readme
    assert "tests/install .venv && .venv/bin/python -m pytest -n auto tests" in readme


# Every ```yaml block of the README and the docs is a config, or a part of one (a section to add to
# yours): a block that is no config takes another fence. The part is completed as a user's config
# would be (an input, a model of the task whose section it sets) and checked as the Snakefile checks
# a config when it loads, short of the file system (the files it names are not here).
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
DOCUMENTS = ["README.md", "config/README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))]


def yaml_examples() -> list[tuple[str, str]]:
    """(where, text) of each ```yaml block: `docs/x.md:12`, the block's first line."""
    examples = []
    for name in DOCUMENTS:
        text = (REPO / name).read_text()
        for block in YAML_BLOCK.finditer(text):
            examples.append((f"{name}:{text[:block.start()].count(chr(10)) + 2}", block.group(1)))
    return examples


def completed(example: dict) -> dict:
    """A config part as a whole config: an input and a model added where it has none (the model's
    task the one whose section it sets, else classify)."""
    from shardinfer.tasks import TASKS

    config = dict(example)
    if "input" not in config and "inputs" not in config:
        config["input"] = {"path": "data/in.parquet"}
    task = next((key for key in config if key in TASKS), "classify")
    config.setdefault("model", {"path": "models/m", "task": task})
    return config


def check_as_the_snakefile_loads(config: dict) -> None:
    """check_input_keys, the schema (its one-line refusals, then Snakemake's `validate` filling the
    defaults) and the settings of every input, each input's files as a bucket would list them."""
    from snakemake.utils import validate

    from shardinfer.input.discovery import listing_root
    from shardinfer.settings.schema import SCHEMA_PATH
    from shardinfer.snakefile.checks import check_input_keys, schema_errors
    from shardinfer.snakefile.configure import input_paths, settings_by_input

    check_input_keys(config)
    schema_errors(config, str(SCHEMA_PATH))
    validate(config, str(SCHEMA_PATH))
    listed = {path: [f"{listing_root(path)}/part-0.parquet"] if path.endswith("/") else []
              for path in input_paths(config)}
    settings_by_input(config, auto_shards=2, listed=listed)


def test_the_docs_have_yaml_examples_and_the_readme_its_config():
    where = [place for place, _ in yaml_examples()]
    assert any(place.startswith("README.md:") for place in where)
    assert any(place.startswith("docs/tasks/generate.md:") for place in where)


@pytest.mark.parametrize("where,text", yaml_examples(), ids=[place for place, _ in yaml_examples()])
def test_every_yaml_example_passes_the_config_checks(where, text):
    """Each block is YAML and, completed, a config the Snakefile would take: a key out of place (a
    section's keys indented one level too few) or a word YAML turns into a boolean fails here."""
    from shardinfer.core.errors import UserError

    example = yaml.load(text, Loader=yaml.SafeLoader)
    assert isinstance(example, dict), f"{where}: not a mapping"
    try:
        check_as_the_snakefile_loads(completed(example))
    except UserError as error:
        pytest.fail(f"{where}: {error}")


def test_the_json_schema_example_gives_the_labels_it_shows():
    """The structured-output example of docs/tasks/generate.md: its labels are the strings it shows
    (bare, YAML made them booleans, and a row `{"label": true}` was valid)."""
    from shardinfer.settings.sections import structured_spec
    from shardinfer.tasks.generate.structured import Judge

    (example,) = [yaml.load(text, Loader=yaml.SafeLoader) for where, text in yaml_examples()
                  if where.startswith("docs/tasks/generate.md:") and "structured" in text]
    spec = structured_spec(example["generate"]["structured"])
    assert spec["json"]["properties"]["label"] == {"enum": ["yes", "no"]}
    judge = Judge(spec)
    assert judge('{"label":"yes","age":41}', "eos") == (True, None, {"label": "yes", "age": 41})
    assert not judge('{"label":true,"age":41}', "eos")[0]


@pytest.mark.parametrize("section, message", [
    ({"structured": {"json": {"type": "object", "properties": {"label": {"enum": [True, False]}}}}},
     r"^generate.structured.json: `properties.label.enum` holds \[True, False\] without `type: boolean` beside it: "
     r"YAML reads bare yes, no, on, off, true and false as booleans; quote the words \(enum: \['yes', 'no'\]\)"),
    ({"structured": {"json": {"const": True}}}, r"^generate.structured.json: `const` holds True .*\(const: 'yes'\)"),
    ({"structured": {"choice": [True, False]}},
     r"^config `generate.structured.choice.0`: True is not of type 'string' \(YAML reads bare yes, no, on, off, "
     r"true and false as booleans: quote the word, e.g. 'yes'\)$"),
])
def test_a_bare_yes_or_no_where_words_are_meant_is_refused_saying_to_quote_it(section, message):
    """`enum: [yes, no]` in YAML is [True, False]: every row came out `{"label": true}`, valid."""
    from shardinfer.core.errors import UserError

    with pytest.raises(UserError, match=message) as caught:
        check_as_the_snakefile_loads(completed({"generate": section}))
    assert "\n" not in str(caught.value)


def test_booleans_stay_allowed_where_the_schema_says_boolean():
    from shardinfer.settings.sections import structured_spec

    schema = {"type": "object", "properties": {"ok": {"type": "boolean", "enum": [True]}}}
    assert structured_spec({"json": schema})["json"] == schema
