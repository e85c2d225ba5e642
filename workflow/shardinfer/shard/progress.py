"""Progress lines for a long shard job: rows done of total, rows/s and the time still to go.

The first write is always logged (a user sees at once that rows flow), then at most one line per
interval, and the last one, so a shard log stays short whether a shard runs seconds or hours.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)
INTERVAL_S = 30.0


def eta(seconds: float) -> str:
    """A duration as a person reads it: 45 s, 12 min 5 s, 3 h 20 min."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class Progress:
    """Counts rows written and logs `rows done/total (pct), rows/s, ETA` at a sensible interval."""

    def __init__(self, total: int, interval_s: float = INTERVAL_S, clock=time.perf_counter) -> None:
        self.total, self.interval_s, self.clock = total, interval_s, clock
        self.done = 0
        self.started = clock()
        self.logged_at: float | None = None

    def advance(self, rows: int) -> None:
        self.done += rows
        now = self.clock()
        due = self.logged_at is None or now - self.logged_at >= self.interval_s or self.done >= self.total
        if due:
            self.logged_at = now
            log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        rate = self.done / max(now - self.started, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        percent = 100 * self.done / max(self.total, 1)
        return f"rows {self.done}/{self.total} ({percent:.0f}%), {rate:.0f} rows/s, ETA {eta(left)}"
