"""The architecture page's list of the package's modules, written from the package itself: room by
room in `shardinfer.ROOMS` order (bottom to top), each room's `__init__` docstring as its paragraph,
then each of its modules (and folders of modules) with the first sentence of its docstring. Read
with `ast`, importing nothing of the rooms (no torch). scripts/config_docs.py writes it into
docs/development/architecture.md between its markers; a module without a docstring is refused.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import shardinfer

PACKAGE = Path(shardinfer.__file__).resolve().parent
WIDTH = 100  # a written line, at most


def docstring(path: Path) -> str:
    """A module's docstring, refused when it has none: every module says what it holds."""
    text = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    if not text:
        raise SystemExit(f"{path} has no docstring: say what the module holds")
    return text


def first_sentence(text: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line (one that leads into a list or
    an example, ending in a colon, ends in a full stop here)."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    end = paragraph.find(". ")
    sentence = paragraph if end < 0 else paragraph[: end + 1]
    return sentence[:-1] + "." if sentence.endswith(":") else sentence


def modules_in(folder: Path) -> list[Path]:
    """A folder's modules and folders of modules, by name (its `__init__` is the folder's own)."""
    found = [path for path in folder.glob("*.py") if path.name != "__init__.py"]
    found += [path for path in folder.iterdir() if (path / "__init__.py").is_file()]
    return sorted(found, key=lambda path: path.stem)


def module_lines(folder: Path, depth: int = 0) -> list[str]:
    """A bullet per module of `folder`: `name`: its first sentence; a folder of modules nested."""
    lines = []
    for path in modules_in(folder):
        is_folder = path.is_dir()
        name = f"{path.name}/" if is_folder else path.stem
        text = docstring(path / "__init__.py" if is_folder else path)
        lead = "  " * depth + "- "
        lines += textwrap.wrap(f"`{name}`: {first_sentence(text)}", WIDTH, initial_indent=lead,
                               subsequent_indent=" " * len(lead), break_on_hyphens=False)
        if is_folder:
            lines += module_lines(path, depth + 1)
    return lines


def room_list(package: Path = PACKAGE, rooms: tuple[str, ...] = shardinfer.ROOMS) -> list[str]:
    """Each room, bottom to top: its name and `__init__` docstring as a paragraph, then its modules."""
    lines = []
    for room in rooms:
        paragraphs = docstring(package / room / "__init__.py").split("\n\n")
        lines += ["", *textwrap.wrap(f"**`{room}/`**: {' '.join(paragraphs[0].split())}", WIDTH)]
        for paragraph in paragraphs[1:]:
            lines += ["", *textwrap.wrap(" ".join(paragraph.split()), WIDTH)]
        lines += ["", *module_lines(package / room)]
    return [*lines, ""]
