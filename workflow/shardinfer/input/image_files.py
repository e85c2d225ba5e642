"""Image files named by path (`input.image_column` of strings): their identity, so that no stale row
is presented as current when a file is replaced under the same path (the table unchanged). The
image counterpart of `shardinfer.input.identity`, each layer as cheap as it can be:

1. The plan lists, per shard, the image files its rows name with a digest of their sizes and mtimes
   (stat only, `shard_images`). When the Snakefile loads, each infer job's param `images`
   (`image_trigger`) stats its shard's files again: "planned" while they are as planned, else a
   digest of their stats now. Snakemake reruns a job whose params changed, so a file replaced,
   edited or removed reruns exactly the shards whose rows name it (older mtimes too), and nothing
   else: not the plan, not the other shards. (A file changed in the same run as a replan is seen
   against the old plan: its shard reruns once more in the next run, against the new plan's stats.)
   Gather's param `image_identity` (`gather_image_trigger`) does the same with their ctimes and
   inodes: a file rewritten with its size and mtime put back reruns gather alone, which decides.
2. The shard job reads each file's bytes once (`read_image_file`): its size, mtime and ctime and a
   SHA-256 of those bytes (computed where they are read anyway) go into the shard's stats
   (`contract.shard_file.IMAGES_READ`).
3. Gather stats each file its shards read (`image_changed`): the same size, mtime and ctime prove
   it unchanged; otherwise its bytes are digested, and a file whose content is not what its shard
   read is refused in one line naming the path and the row.

None of this holds without a shared filesystem (the input in a bucket): a job sees only its declared
files, so a shard job would read the path on its own node, where it is absent (Kubernetes, cloud
batch) or a local file that is not the bucket's, and no stat here could prove it. The plan job, the
one job that reads the column there, refuses images by path (`refuse_in_bucket`).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
from pathlib import Path

from shardinfer.core.errors import UserError

PLANNED = "planned"
SIZE_MTIME = ("st_size", "st_mtime_ns")  # what reruns a shard (its infer param)
CTIME_INODE = ("st_ctime_ns", "st_ino")  # what reruns gather, whose digests decide (its param)


def stat_of(path: Path, keys: tuple[str, ...] = SIZE_MTIME) -> list[int] | None:
    """The `os.stat` fields `keys` of a file, None for a missing one."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [getattr(stat, key) for key in keys]


def stats_digest(folder: Path, names: list[str], keys: tuple[str, ...] = SIZE_MTIME) -> str:
    """A short digest of each named file's `keys` (or its absence), in order."""
    stats = [(name, stat_of(folder / name, keys)) for name in names]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]


def shard_images(named: list[tuple[int, str]], ranges: tuple[tuple[int, int], ...], folder: Path) -> tuple[dict, ...]:
    """Per shard, the image files its rows name (`named`: (row, name) in row order; each file once,
    sorted) and the digests of their stats as planned (`stats`: sizes and mtimes; `ctimes`: ctimes
    and inodes): what the plan records under each shard."""
    rows = [row for row, _ in named]
    found = []
    for start, end in ranges:
        lo, hi = bisect.bisect_left(rows, start), bisect.bisect_left(rows, end)
        names = sorted({name for _, name in named[lo:hi]})
        found.append({"paths": names, "stats": stats_digest(folder, names),
                      "ctimes": stats_digest(folder, names, CTIME_INODE)})
    return tuple(found)


@functools.lru_cache(maxsize=8)
def _planned_images(plan_path: str, stamp: tuple[int, int]) -> list[dict | None]:
    """Each shard's planned images of a plan file (cached per file version: read once, not per shard)."""
    shards = json.loads(Path(plan_path).read_text()).get("shards") or []
    return [shard.get("images") for shard in shards]


def planned_images(plan_path: str) -> list[dict | None]:
    """Each shard's `shard_images` entry in the plan file there, none where there is no plan yet."""
    stamp = stat_of(Path(plan_path))
    return _planned_images(plan_path, tuple(stamp)) if stamp else []


def image_trigger(plan_path: str, shard: int, folder: Path) -> str:
    """The infer job's param: "planned" while shard `shard`'s image files have the sizes and mtimes
    the plan recorded (or no plan is there yet: every shard runs anyway), else a digest of them now."""
    planned = planned_images(plan_path)
    images = planned[shard] if shard < len(planned) else None
    if not images:
        return PLANNED
    now = stats_digest(folder, images["paths"])
    return PLANNED if now == images["stats"] else f"changed {now}"


def gather_image_trigger(plan_path: str, folder: Path) -> str:
    """The gather job's param: "planned" while every shard's image files have the ctimes and inodes the
    plan recorded, else a digest of them now. A file rewritten with its size and mtime put back reruns
    no shard (`image_trigger`), but gather, whose check of the files' bytes (`image_changed`) refuses it."""
    planned = [images for images in planned_images(plan_path) if images and "ctimes" in images]
    now = [stats_digest(folder, images["paths"], CTIME_INODE) for images in planned]
    if now == [images["ctimes"] for images in planned]:
        return PLANNED
    return "changed " + hashlib.sha256(" ".join(now).encode()).hexdigest()[:16]


def stamp(stat: os.stat_result) -> tuple[int, int, int]:
    """What proves a file unchanged since it was read: its size, mtime and ctime (ns)."""
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def read_image_file(folder: Path, name: str) -> tuple[bytes, dict]:
    """A file's bytes and its identity as read: size, mtime_ns, ctime_ns and SHA-256; OSError for a
    file that cannot be read or that changed while it was read."""
    path = folder / name
    before = os.stat(path)
    data = path.read_bytes()
    after = os.stat(path)
    if stamp(before) != stamp(after) or len(data) != after.st_size:
        raise OSError(f"`{name}` changed while it was read")
    return data, {"size": after.st_size, "mtime_ns": after.st_mtime_ns, "ctime_ns": after.st_ctime_ns,
                  "sha256": hashlib.sha256(data).hexdigest()}


def image_changed(folder: Path, name: str, read: dict) -> str | None:
    """Why a file is no longer what a shard job read (`read`: `read_image_file`'s identity), or None:
    its stats as read prove it unchanged; else its bytes decide."""
    path = folder / name
    try:
        stat = os.stat(path)
    except OSError:
        return "is gone"
    if stamp(stat) == (read["size"], read["mtime_ns"], read["ctime_ns"]):
        return None
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if digest == read["sha256"]:
        return None
    return f"has other content (size {read['size']} -> {stat.st_size}, sha256 {read['sha256'][:12]} -> {digest[:12]})"


def refuse_in_bucket(column: str, named: list[tuple[int, str]]) -> None:
    """Without a shared filesystem, an image column naming files by path (`named`: (row, name)) is
    refused in one line: the shard jobs could neither read them from the bucket nor prove them.
    Raised by the plan job, before it looks at any file, not as the Snakefile loads: only a job reads
    the column's type and values there (bytes stay allowed), and it comes before any shard job."""
    if named:
        raise UserError(f"input.image_column `{column}` names image files by path (`{named[0][1]}`, ...), which jobs "
                        "without a shared filesystem can neither read from the bucket nor prove unchanged; with "
                        "the input in a bucket hold the images' bytes in the column (binary, or {bytes, path} "
                        "structs with their bytes), or run on a shared filesystem")
