"""After an interrupted run: the outputs Snakemake marked incomplete, settled before it reads the marks.

Snakemake marks a job's outputs incomplete when the job starts and unmarks them once it has seen
the job succeed (`.snakemake/incomplete/`, a file per output named by the base64 of its path:
snakemake/persistence/file.py). SIGINT to Snakemake alone makes it wait for its running jobs, then
exit without that last step (snakemake/scheduling/job_scheduler.py: KeyboardInterrupt, then the
executor's cancel, which waits); a killed Snakemake leaves its running jobs' marks too. The next
run then refused (`IncompleteFilesException`), and `--rerun-incomplete` recomputed every shard
from scratch, though a shard file is written whole or not at all (`shardinfer.core.atomic`).

So the main process settles each marked output that exists, when the Snakefile loads:
- a shard file that proves complete, as gather proves it (this plan, this settings digest, its
  range in order, the values its job recorded, its files per row), is kept and unmarked (and once
  the graph of jobs is built, its job recorded as finished, as Snakemake records one it saw finish:
  its params, code and input, so that a later change of settings reruns it as any other);
- any other marked output (a shard file that fails the proof, a plan, token file or table whose
  job was cut short) is removed and unmarked, as `--rerun-incomplete` would: its job runs again,
  a shard job resuming from the windows it committed (`shardinfer.shard.resume`).
Only outputs under results/; only Snakemake's file persistence in the working directory's
.snakemake/, on a shared filesystem, and never while another run holds the folder's lock. The
Snakefile cannot tell a dry run while it loads: a dry run settles them as the run would.
"""

from __future__ import annotations

import base64
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from shardinfer.core.errors import UserError
from shardinfer.plan.plan_file import read_plan
from shardinfer.proof.shards import prove_shard
from shardinfer.proof.values import verified_row_groups
from shardinfer.snakefile.layout import Layout, fill

log = logging.getLogger(__name__)

SETTLED_UNDER = "results/"  # the workflow's outputs (shardinfer.snakefile.layout); a user's own rules' are left alone


def marks(persistence: Path = Path(".snakemake")) -> dict[str, Path]:
    """Each output marked incomplete, by its path as Snakemake keys it, with its mark's file: the
    base64 of the path, cut into folders of `@`-prefixed pieces where it is longer than a name may be."""
    folder = persistence / "incomplete"
    found = {}
    for mark in folder.rglob("*") if folder.is_dir() else ():
        if not mark.is_file() or mark.name == "migration_underway":
            continue
        encoded = "".join(part.removeprefix("@") for part in mark.relative_to(folder).parts)
        try:
            found[base64.urlsafe_b64decode(encoded).decode()] = mark
        except ValueError:  # not one of Snakemake's marks
            continue
    return found


def unmark(mark: Path, persistence: Path = Path(".snakemake")) -> None:
    """Remove a mark and the folders of its pieces, emptied (as Snakemake does)."""
    mark.unlink(missing_ok=True)
    folder, top = mark.parent, persistence / "incomplete"
    while folder != top and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def locked(persistence: Path = Path(".snakemake")) -> bool:
    """Whether a Snakemake run holds the folder (its lock files), whose marks are its own."""
    locks = persistence / "locks"
    return locks.is_dir() and any(locks.iterdir())


@dataclass(frozen=True)
class Settled:
    """What `settle` did: a line for each output, and the kept outputs (shard files, files folders)."""

    lines: list[str]
    kept: list[str]


@dataclass(frozen=True)
class ShardOutput:
    """A planned shard's file and, when the task writes files per row, its files folder."""

    name: str | None
    shard: int
    path: str
    files: str | None


def shard_outputs(layout: Layout) -> dict[str, ShardOutput]:
    """Every planned shard's file and files folder, by path (both point to the shard)."""
    found = {}
    for name, jobs in layout.inputs.items():
        for shard in range(jobs.shards):
            files = fill(layout.files_dir, shard=shard, name=name) if layout.files_per_row else None
            output = ShardOutput(name, shard, fill(layout.shard_file, shard=shard, name=name), files)
            found.update({output.path: output, **({files: output} if files else {})})
    return found


def why_not_complete(layout: Layout, output: ShardOutput, marked: dict[str, Path]) -> str | None:
    """None when the shard file proves complete under this run's plan and settings; else why not."""
    plan_path = fill(layout.path("results/plan.json"), name=output.name)
    if plan_path in marked:
        return "its plan was cut short too"
    try:
        plan = read_plan(plan_path)
        if output.shard >= plan.shards:
            return "its plan has fewer shards"
        shard = prove_shard(plan, output.shard, output.path, layout.inputs[output.name].digest, output.files)
        for _ in verified_row_groups(shard):
            pass
    except (UserError, OSError, ValueError, KeyError) as error:
        return str(error)
    return None


def settle(layout: Layout, persistence: Path = Path(".snakemake")) -> Settled:
    """Settle the outputs an interrupted run left marked (module docstring)."""
    marked = {path: mark for path, mark in marks(persistence).items() if path.startswith(SETTLED_UNDER)}
    settled = Settled([], [])
    if not marked or locked(persistence):
        return settled
    shards, proven = shard_outputs(layout), {}
    for path, mark in sorted(marked.items()):
        if not Path(path).exists():
            continue  # Snakemake takes a mark of a missing output for nothing
        shard = shards.get(path)
        if shard is not None and shard not in proven:
            proven[shard] = why_not_complete(layout, shard, marked)
        if shard is not None and proven[shard] is None:
            settled.kept.append(path)
            if path != shard.files or shard.path not in marked:  # a files folder is said with its shard file
                settled.lines.append(f"shardinfer: kept {path}: its job finished in a run that was interrupted, and "
                                     "it proves complete")
        else:
            shutil.rmtree(path) if Path(path).is_dir() else Path(path).unlink()
            why = f": {proven[shard]}" if shard is not None else ""
            settled.lines.append(f"shardinfer: removed {path}, left by a job an interrupted run did not see finish"
                                 f"{why}; it runs again")
        unmark(mark, persistence)
    return settled
