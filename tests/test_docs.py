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
