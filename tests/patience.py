"""How long a test waits for what it started: as long as that makes progress, never for a hang.

The tests share their machine (other sessions' suites, `-n auto` workers of their own), and on a
busy one a run that takes a minute alone took seven: with a fixed limit of 300 s, five tests failed
on one shared S3 run that then finished, correctly (issue 42). So a wait here fails only when
nothing has progressed for HANG_S: the process wrote no output, and no file changed under the
folders it works in (`watch`: its working directory, its job folders). A run that keeps changing
files but never ends is caught by CEILING_S, an hour, far beyond any test's slowest honest run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

HANG_S = 600.0  # ten minutes in which the process printed nothing and no file under `watch` changed
CEILING_S = 3600.0
LOOK_EVERY_S = 5.0  # how often the files under `watch` are looked at (a walk of the folders)


class Progress:
    """When anything under `watch` (folders or files) last changed: a file added, removed, grown
    or rewritten (its size or mtime), as seen every LOOK_EVERY_S."""

    def __init__(self, watch: Iterable[Path | str]) -> None:
        self.watch = [Path(path) for path in watch]
        self.started = self.changed = self.looked = time.monotonic()
        self.state = self.look()

    def look(self) -> frozenset:
        found = set()
        for root in self.watch:
            for folder, _, names in os.walk(root) if root.is_dir() else [(root.parent, (), [root.name])]:
                for name in names:
                    try:
                        stat = os.stat(os.path.join(folder, name))
                    except OSError:  # removed meanwhile
                        continue
                    found.add((folder, name, stat.st_size, stat.st_mtime_ns))
        return frozenset(found)

    def stalled(self) -> str | None:
        """Why to stop waiting (nothing changed for HANG_S, or CEILING_S over), or None."""
        now = time.monotonic()
        if now - self.looked >= LOOK_EVERY_S:
            state, self.looked = self.look(), now
            if state != self.state:
                self.state, self.changed = state, now
        if now - self.changed >= HANG_S:
            return f"nothing progressed for {HANG_S:.0f} s (no output, no file changed under {self.watch})"
        if now - self.started >= CEILING_S:
            return f"still running after {CEILING_S:.0f} s"
        return None


def until(condition: Callable[[], object], watch: Iterable[Path | str] = (), process: subprocess.Popen | None = None,
          what: str = "the condition", every_s: float = 0.05) -> object:
    """Wait until `condition()` is true (returned); fail when `process` (if given) ended first, or
    when the work stalled (`Progress`)."""
    progress = Progress(watch)
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process ended first (exit status {process.returncode})")
        stalled = progress.stalled()
        if stalled:
            raise AssertionError(f"waiting for {what}: {stalled}")
        time.sleep(every_s)


def wait(process: subprocess.Popen, watch: Iterable[Path | str] = (), what: str = "the process") -> int:
    """The process's exit status once it ends; killed (its process group too, if it leads one)
    and failed when it stalled. Its output, if it goes to files, belongs in `watch`."""
    try:
        until(lambda: process.poll() is not None, watch, what=f"{what} to end", every_s=0.2)
    except AssertionError:
        kill(process)
        raise
    return process.returncode


def kill(process: subprocess.Popen) -> None:
    try:
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, 9)
        else:
            process.kill()
    except ProcessLookupError:
        pass
    process.wait()


class Started:
    """A process started with its stdout and stderr in files (their growth is progress), read back
    when it ended: `subprocess.Popen` for a test that must not block on a pipe."""

    def __init__(self, command: list[str], watch: Iterable[Path | str] = (), merged: bool = False, **popen) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="patience-"))
        self.command, self.merged = command, merged
        with open(self.folder / "stdout", "w") as out, open(self.folder / "stderr", "w") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if merged else err,
                                            text=True, **popen)
        self.watch = [*watch, self.folder]

    def output(self) -> str:
        """What it printed so far (stdout, with stderr when merged)."""
        return (self.folder / "stdout").read_text(errors="replace")

    def finish(self, what: str = "the process") -> subprocess.CompletedProcess:
        """Wait for it (`wait`); its exit status and output, its files removed."""
        try:
            wait(self.process, self.watch, what)
        except AssertionError as error:
            raise AssertionError(f"{error}; it printed:\n{self.output()[-6000:]}") from None
        stderr = "" if self.merged else (self.folder / "stderr").read_text(errors="replace")
        done = subprocess.CompletedProcess(self.command, self.process.returncode, self.output(), stderr)
        shutil.rmtree(self.folder, ignore_errors=True)
        return done


def run(command: list[str], watch: Iterable[Path | str] = (), **popen) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, **popen)`, waiting while it progresses."""
    return Started(command, watch, **popen).finish(f"`{' '.join(map(str, command[:4]))} ...`")
