"""Which files make up the input: one file, a directory of parts, or a glob of them.

Most exported datasets are folders of parts (Spark, Dask, Hugging Face, BigQuery exports), so
`input.path` may name a folder or a glob pattern. Its parts are resolved when the Snakefile loads,
resolved again before each shard job and at gather (a part added, removed or renamed since
planning is caught), and always the same way:

- a directory: its files with a table extension, at any depth (as pandas and Arrow read a
  folder), other files (README.md, schema.json) passed over;
- a glob (`data/part-*.parquet`, `**` for any depth): its matches, a matched folder read as above;
- anything else: the path itself, one part.

Names starting with `.` or `_` are skipped at every level, as Arrow's dataset discovery does:
Spark's `_SUCCESS`, `_committed_*` and `_temporary/`, Hadoop's `.part-0.crc`. The parts are
sorted by path (code point order, as `sorted` and `LC_ALL=C ls` give it) and rows are numbered
across them in that order, so zero-padded part numbers (`part-00007`) keep the writer's order.
All parts must share one format. A folder laid out in a format's own way (a Hugging Face
`save_to_disk` folder) gives the parts that format lists, in its order (`Format.folder_parts`).

The workflow's own folders (OWN_FOLDERS: results/, logs/ and .snakemake/ in the working directory)
never hold input parts: a folder or glob that reaches them (`.`, `**/*.parquet`) passes over them,
or its parts would grow with every shard written (a shard refused as "not a part of the plan", then
a cycle in the graph); `own_outputs_passed_over` says which files that left out, and a path inside
one of them is refused.

Without a shared filesystem the input lies in a bucket, which this process cannot walk: the
Snakefile lists the object names under the path's literal folder (`listing_root`) and the same
rules pick the parts among them (`listed_input_parts`); a path with objects below it is a folder.
The workflow's own folders are then those under the storage prefix, where the listed names start.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
from pathlib import Path, PurePosixPath

from shardinfer.core.errors import UserError
from shardinfer.input.formats import all_formats, compressible_names, extensions, folder_format, format_named, format_of

GLOB_CHARACTERS = "*?["
# The workflow's own folders, in the working directory (without a shared filesystem: under the
# storage prefix): its results and logs (shardinfer.snakefile.layout), and Snakemake's own. Never input.
OWN_FOLDERS = ("results", "logs", ".snakemake")


def allowed_extensions() -> str:
    """The table extensions, and the formats whose files may be compressed too (`x.csv.gz`)."""
    packed = compressible_names()
    return ", ".join(sorted(extensions())) + (f"; {'/'.join(packed)} also .gz" if packed else "")


def missing_input(path: str) -> UserError:
    return UserError(f"input.path `{path}` does not exist (or is not a file)")


def detect_format(path: str) -> str:
    """The input format a file's name says (looking through .gz and the like for text formats)."""
    fmt = format_of(path)
    if fmt is None and not os.path.exists(path):
        raise missing_input(path)  # a mistyped folder (`data/tarin/`), not a file of unknown type
    if fmt is None:
        raise UserError(f"input `{path}`: unknown file type; allowed extensions: {allowed_extensions()} "
                        "(or set input.format)")
    return fmt.name


def _skipped(name: str) -> bool:
    return name.startswith((".", "_"))


def _own_roots() -> tuple[str, ...]:
    """The real paths of the workflow's own folders in the working directory (present or not)."""
    return tuple(os.path.realpath(folder) for folder in OWN_FOLDERS)


def _inside(real: str, roots: tuple[str, ...]) -> bool:
    return any(real == root or real.startswith(root + os.sep) for root in roots)


def _own_in_reach(top: str) -> tuple[str, ...]:
    """The workflow's own folders at or below `top` (a folder, or a glob's literal folder), which
    its walk must pass over; usually none, and then no path found under `top` is looked at twice."""
    return tuple(root for root in _own_roots() if _inside(root, (os.path.realpath(top),)))


def _literal_folder(path: str) -> str:
    """A glob's folders before its first wildcard (`.` for none), or the path itself."""
    if not is_glob(path):
        return path
    parts = PurePosixPath(path).parts[:_literal_depth(path)]
    return os.path.join(*parts) if parts else "."


def _tables_under(folder: str, own: tuple[str, ...] = ()) -> list[str]:
    """Files with a table extension anywhere under `folder`, skipped names and the workflow's own
    folders (`own`: their real paths) aside. Linked folders are followed (a dataset assembled from
    links is common), each real folder once."""
    found, seen = [], set()
    for root, folders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen or _inside(real, own):
            folders[:] = []
            continue
        seen.add(real)
        folders[:] = [name for name in folders if not _skipped(name)]
        found += [os.path.join(root, name) for name in files if not _skipped(name) and format_of(name)]
    return found


def _matches(pattern: str, own: tuple[str, ...] = ()) -> list[str]:
    """A glob's files; a match named like a skipped file below the pattern's literal folders, or in
    the workflow's own folders (`own`), is passed over, and a matched folder gives its table files."""
    depth = _literal_depth(pattern)
    found = []
    for match in glob.glob(pattern, recursive=True):
        if any(_skipped(part) for part in Path(match).parts[depth:]) or (own and _inside(os.path.realpath(match), own)):
            continue
        found += _tables_under(match, own) if os.path.isdir(match) else [match]
    return found


def no_table_files(path: str, what: str, folder: str) -> UserError:
    return UserError(f"input.path `{path}` is {what} with no table files ({allowed_extensions()}); for parts "
                     f"without such an extension give a glob such as "
                     f"`{os.path.join(folder, 'part-*')}` and set input.format")


def _folder_parts(path: str, own: tuple[str, ...]) -> tuple[str, ...]:
    parts = _tables_under(path, own)
    if not parts:
        raise no_table_files(path, "a directory", path)
    return tuple(sorted(set(parts)))


def refuse_own_folder(path: str, listed: bool = False) -> None:
    """A path inside one of the workflow's own folders (a glob's literal folders inside one) is
    refused: what lies there is the workflow's, rewritten by its runs. `listed`: the path names
    objects in a bucket, where the own folders are those under the storage prefix."""
    if listed:
        first = PurePosixPath(listing_root(path)).parts[:1]
        inside = next((folder for folder in OWN_FOLDERS if first == (folder,)), None)
    else:
        top = os.path.realpath(_literal_folder(path))
        inside = next((folder for folder, root in zip(OWN_FOLDERS, _own_roots()) if _inside(top, (root,))), None)
    if inside:
        raise UserError(f"input.path `{path}` lies in `{inside}/`, where the workflow writes its own files "
                        f"({', '.join(f'{name}/' for name in OWN_FOLDERS)}); move the input out of it")


def input_parts(path: str, pass_over_own: bool = True) -> tuple[str, ...]:
    """The input's files in row order, the workflow's own folders passed over (`pass_over_own`
    false: not, to see what that left out); a folder or glob that yields none is refused."""
    own = _own_in_reach(_literal_folder(path)) if pass_over_own else ()
    if os.path.isdir(path):
        laid_out = folder_format(path)
        return laid_out[1] if laid_out else _folder_parts(path, own)
    if is_glob(path) and not os.path.exists(path):
        parts = _matches(path, own)
        if not parts:
            raise UserError(f"input.path `{path}` matches no files (names starting with `.` or `_` are skipped)")
        return tuple(sorted(set(parts)))
    return (path,)


def is_glob(path: str) -> bool:
    return any(c in path for c in GLOB_CHARACTERS)


def _literal_depth(pattern: str) -> int:
    """How many of a glob's folders come before its first wildcard."""
    parts = PurePosixPath(pattern).parts
    return next((i for i, part in enumerate(parts) if is_glob(part)), len(parts))


def listing_root(path: str) -> str:
    """The literal folder a bucket is listed under for `path`, normalized as Snakemake normalizes
    object names: the path itself for a folder or a file (objects below it make it a folder), the
    folders before the first wildcard for a glob (`data` for `data/*/part-*.csv`; "" for the top)."""
    if not is_glob(path):
        return posixpath.normpath(path)
    return "/".join(PurePosixPath(path).parts[:_literal_depth(path)])


def _glob_matches(pattern: list[str], name: list[str]) -> bool:
    """A path's parts against a glob's, as `glob.glob(recursive=True)` matches: `**` any number of folders."""
    if not pattern:
        return not name
    if pattern[0] == "**":
        return any(_glob_matches(pattern[1:], name[i:]) for i in range(len(name) + 1))
    return bool(name) and fnmatch.fnmatchcase(name[0], pattern[0]) and _glob_matches(pattern[1:], name[1:])


def _own_object(name: str) -> bool:
    """An object under one of the workflow's own folders of the storage prefix (`results/...`)."""
    return PurePosixPath(name).parts[:1] in {(folder,) for folder in OWN_FOLDERS}


def _listed_matches(pattern: str, names: list[str]) -> list[str]:
    """A glob's matches among object names: a name it matches, or a table file below a folder it
    matches; skipped names below the pattern's literal folders passed over, as on disk."""
    glob_parts, depth = list(PurePosixPath(pattern).parts), _literal_depth(pattern)
    folders_only = pattern.endswith("/")  # as glob.glob, whose `data/*/` matches folders alone
    found = []
    for name in names:
        parts = list(PurePosixPath(name).parts)
        if any(_skipped(part) for part in parts[depth:]):
            continue
        if (not folders_only and _glob_matches(glob_parts, parts)) or (format_of(name) and any(
                _glob_matches(glob_parts, parts[:k]) for k in range(depth + 1, len(parts)))):
            found.append(name)
    return found


def _refuse_laid_out(path: str, names: list[str]) -> None:
    folder = listing_root(path)
    for fmt in all_formats().values():
        marker = next((m for m in fmt.folder_markers if f"{folder}/{m}" in names), None)
        if marker:
            raise UserError(f"input.path `{path}` in the bucket holds `{marker}`: a {fmt.name} folder, which is "
                            f"read only from a filesystem; without a shared filesystem give its table files "
                            f"(a glob of them, with input.format) or convert it to Parquet")


def listed_input_parts(path: str, names: list[str], pass_over_own: bool = True) -> tuple[str, ...]:
    """The input's parts in row order among `names`, the objects listed under `listing_root(path)`
    in a bucket (no shared filesystem), by the rules a filesystem gets (module docstring), the
    workflow's own folders under the storage prefix passed over (`pass_over_own` false: not)."""
    if pass_over_own:
        names = [name for name in names if not _own_object(name)]
    if is_glob(path):
        parts = _listed_matches(path, names)
        if not parts:
            raise UserError(f"input.path `{path}` matches no objects in the bucket (names starting with `.` or `_` "
                            "are skipped)")
        return tuple(sorted(set(parts)))
    folder = listing_root(path)
    if not names or names == [folder]:
        return (folder,)  # one object (or none: Snakemake says it is missing)
    _refuse_laid_out(path, names)
    parts = [name for name in names if format_of(name) and not any(
        _skipped(part) for part in PurePosixPath(name).relative_to(folder).parts)]
    if not parts:
        raise no_table_files(path, "a folder in the bucket", folder)
    return tuple(sorted(set(parts)))


def one_format(path: str, parts: tuple[str, ...], fmt: str) -> str:
    """The parts' one format: `fmt` when given, else their extensions'. Parts whose extensions
    name two formats are refused, whatever `fmt` says."""
    if fmt != "auto":
        format_named(fmt)  # refused unless it is one
    if len(parts) == 1:
        return detect_format(parts[0]) if fmt == "auto" else fmt
    named = {part: found.name for part in parts if (found := format_of(part))}
    if fmt == "auto" and len(named) < len(parts):
        detect_format(next(part for part in parts if part not in named))  # refused, naming it
    first = next(iter(named.items()), None)
    other = next(((part, found) for part, found in named.items() if found != first[1]), None) if first else None
    if other:
        raise UserError(f"input.path `{path}` mixes formats: `{first[0]}` is {first[1]}, `{other[0]}` is "
                        f"{other[1]}; give a directory or glob of one format")
    return first[1] if fmt == "auto" else fmt


def resolve_input(path: str, fmt: str = "auto", section: dict | None = None,
                  listed: list[str] | None = None) -> tuple[str, tuple[str, ...]]:
    """The input's format and its files in row order (see the module's docstring). A folder laid
    out in a format's own way (a Hugging Face dataset, the input `section`'s options naming one of
    a DatasetDict's splits) is that format's, whatever its files' names say. `listed`: the object
    names under the path in a bucket (no shared filesystem), from which the parts are picked
    instead of from the filesystem."""
    refuse_own_folder(path, listed is not None)
    if listed is not None:
        parts = listed_input_parts(path, listed)
        return one_format(path, parts, fmt), parts
    laid_out = folder_format(path, section) if os.path.isdir(path) else None
    if laid_out:
        return laid_out[0].name, laid_out[1]
    parts = input_parts(path)
    return one_format(path, parts, fmt), parts


def own_outputs_passed_over(path: str, listed: list[str] | None = None) -> tuple[str, ...]:
    """The files in the workflow's own folders that a folder or glob `path` would have given as
    parts (`listed`: the object names in a bucket, as for `resolve_input`), for the one line that
    says so. Only a path whose literal folder holds one of them is walked again."""
    if listed is not None:
        if not any(_own_object(name) for name in listed):
            return ()
        return tuple(sorted(set(listed_input_parts(path, listed, False)) - set(listed_input_parts(path, listed))))
    if not _own_in_reach(_literal_folder(path)) or (os.path.isdir(path) and folder_format(path)):
        return ()
    return tuple(sorted(set(input_parts(path, False)) - set(input_parts(path))))
