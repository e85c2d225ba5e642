"""One loop between the shard's windows and vLLM's engine: the engine kept full across windows, and
a bad prompt costing its own row (`VllmGenerate.feed`, `VllmPooling.feed`). The engine it feeds
says what a row's request is, which outputs failed, and what a window's outputs are
(`request`, `refused`, `results`, `health_request`): the loop is the same for generation and
pooling requests.

- **Fed, not drained.** Each row is its own request (`LLMEngine.add_request`), and the loop steps
  the engine (`step()`, what `LLM.generate` runs inside) while it takes the next windows: whenever
  fewer than `max_num_seqs` requests are unfinished, or fewer than two windows are in the engine,
  the next window's rows are added, so the engine never runs out of rows at a window's end. vLLM
  schedules first come, first served: the oldest window's rows keep their turn and finish first.
  A window leaves the loop whole and in order, once its last row is done; the runner writes and
  commits it as before (resume unchanged). The next window is waited for only while the engine
  is idle.
- **A bad prompt costs its row.** A row the workflow refused before the engine (`refused`: a
  malformed conversation, a token the model cannot embed, a prompt that does not fit max_model_len
  with its new tokens), a request the engine refuses as it is added (`VLLMValidationError`, ...) and
  one it ends with finish_reason `error` fail that row alone: with `row_errors: record` it is
  written as an error row, otherwise the shard fails in one line naming the row.
- **A failure inside the engine.** An exception from `step()` fails every request in flight, and
  vLLM leaves them unfinished forever: the loop aborts them all first. Then one row is run alone
  to see that the engine still works (`healthy`): if not, the engine is started again, once per
  shard, and the aborted rows are added again (a second death fails the shard in one line). If it
  works, the failure came from the rows: with `record`, they are run again in halves, alone,
  until each failing row stands alone and is recorded; the others keep their results. Without
  `record` the shard fails in one line naming the rows in flight.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shardinfer.core.errors import UserError, first_line
from shardinfer.engines.base import NOT_YET, EngineProgress, failed_row, whole_window

log = logging.getLogger(__name__)

AHEAD = 1  # windows kept in the engine behind the oldest one, however few rows they hold


@dataclass
class FedWindow:
    """A window in the engine: its rows' inputs (`collate`'s), and each row's output or failure."""

    key: Any  # the runner's, handed back with the results
    batch: dict  # ids, index, params, refused (window position -> why)
    outputs: dict[int, Any] = field(default_factory=dict)  # position -> RequestOutput
    failed: dict[int, str] = field(default_factory=dict)  # position -> "Type: message"
    waiting: set[int] = field(default_factory=set)  # positions in the engine

    @property
    def done(self) -> bool:
        return not self.waiting

    def row(self, position: int) -> int:
        return int(self.batch["index"][position])


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {first_line(error)}"


class Feeder:
    """The loop; `run` yields (key, results of the rows that did not fail, in row order, failed)."""

    def __init__(self, runner, record: bool) -> None:
        self.runner, self.record = runner, record  # the engine (VllmGenerate, VllmPooling) whose vLLM it feeds
        self.requests: dict[str, tuple[FedWindow, int]] = {}  # request id -> its row
        self.added = 0  # requests added so far: each gets an id of its own, also when a row is added again
        self.restarted = False
        self.narrowed = 0  # rows run again to find the rows that fail alone
        self.progress = EngineProgress()

    @property
    def engine(self):
        return self.runner.llm.llm_engine

    def run(self, take: Callable[[bool], Any]) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        try:
            yield from self.windows(take)
        finally:  # a failure (or a caller that stops) leaves no request of ours in the engine
            if self.requests:
                self.abort_all()

    def windows(self, take: Callable[[bool], Any]) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        in_flight: deque[FedWindow] = deque()
        exhausted = False
        while True:
            while not exhausted and self.wants_more(in_flight):
                item = take(not self.requests)  # wait for the next window only while the engine is idle
                if item is NOT_YET:
                    break
                if item is None:
                    exhausted = True
                    break
                in_flight.append(self.add_window(*item))
            if self.requests:
                error, aborted = self.step()
                if error is not None:
                    self.recover(error, aborted)
            while in_flight and in_flight[0].done:
                yield self.finished(in_flight.popleft())
            if exhausted and not in_flight:
                return

    def wants_more(self, in_flight: deque) -> bool:
        target = self.engine.vllm_config.scheduler_config.max_num_seqs
        return len(in_flight) <= AHEAD or self.engine.get_num_unfinished_requests() < target

    def add_window(self, key: Any, window, batches: list) -> FedWindow:
        """A window's rows into the engine, each as its own request (`collate` gave the window whole)."""
        fed = FedWindow(key, whole_window(batches, window, "vLLM"))
        batch = fed.batch
        for position in range(window.rows):
            refused = batch["refused"].get(position)
            if refused is not None:
                self.fail(fed, position, f"RowError: {refused}")
            else:
                self.add(fed, position)
        return fed

    def add(self, fed: FedWindow, position: int) -> None:
        """One row's request; a prompt the engine refuses as it is added fails that row alone."""
        from vllm.exceptions import VLLMError

        request_id = f"{fed.row(position)}/{self.added}"
        self.added += 1
        prompt, params = self.runner.request(fed.batch, position, fed.row(position))
        try:
            self.engine.add_request(request_id, prompt, params, lora_request=self.runner.lora)
        except (VLLMError, ValueError, TypeError, AssertionError, KeyError, IndexError) as error:
            self.fail(fed, position, f"{type(error).__name__}: vLLM refused the prompt ({first_line(error)})")
            return
        self.requests[request_id] = (fed, position)
        fed.waiting.add(position)

    def fail(self, fed: FedWindow, position: int, why: str) -> None:
        """A row that failed alone: recorded, or the shard fails naming it."""
        fed.failed[position] = failed_row(self.record, fed.row(position), why)

    def step(self) -> tuple[Exception | None, list[tuple[FedWindow, int]]]:
        """One engine step, its finished rows taken; an exception aborts every request in flight
        (else they would never finish) and is returned with their rows."""
        try:
            outputs = self.engine.step()
        except Exception as error:  # noqa: BLE001 - any failure inside the engine; interrupts pass
            return error, self.abort_all()
        for output in outputs:
            if output.finished:
                fed, position = self.owner(output.request_id)
                fed.waiting.discard(position)
                self.progress.advance()
                refused = self.runner.refused(output)
                if refused:
                    self.fail(fed, position, f"EngineError: {refused}")
                else:
                    fed.outputs[position] = output
        if not outputs and not self.engine.has_unfinished_requests():
            rows = sorted(fed.row(p) for fed, p in self.requests.values())
            raise UserError(f"vLLM finished its requests without an output for {len(rows)} row(s), first {rows[:5]}")
        return None, []

    def owner(self, request_id: str) -> tuple[FedWindow, int]:
        """The row a finished request was for (each request finishes once)."""
        if request_id not in self.requests:
            raise UserError(f"vLLM returned an output for request {request_id!r}, which this shard did not send or "
                            "had an output for already")
        return self.requests.pop(request_id)

    def abort_all(self) -> list[tuple[FedWindow, int]]:
        rows = list(self.requests.values())
        try:
            self.engine.abort_request(list(self.requests))
        except Exception as error:  # noqa: BLE001 - a dead engine: it is replaced next
            log.warning("aborting the requests in flight failed (%s)", describe(error))
        self.requests.clear()
        for fed, position in rows:
            fed.waiting.discard(position)
        return rows

    def recover(self, error: Exception, rows: list[tuple[FedWindow, int]]) -> None:
        """After a failed step: a dead engine is started again and its rows rerun; a working one
        had rows it cannot run, found by halves (record) or named in one line."""
        first, last = min(fed.row(p) for fed, p in rows), max(fed.row(p) for fed, p in rows)
        if not self.healthy():
            self.restart(error)
            for fed, position in rows:
                self.add(fed, position)
            return
        if not self.record:
            raise UserError(f"vLLM failed on rows {first}..{last} ({describe(error)}); the shard's table was not "
                            "written (set row_errors.mode: record to keep the other rows and record the failing ones)")
        log.warning("vLLM failed on the %d rows in flight, rows %d..%d (%s); running them again in halves to find "
                    "the rows that fail alone", len(rows), first, last, describe(error))
        self.isolate(sorted(rows, key=lambda row: row[0].row(row[1])), error)

    def isolate(self, rows: list[tuple[FedWindow, int]], error: Exception) -> None:
        """Rows that failed together, run again in halves until each failing row stands alone."""
        if len(rows) == 1:
            fed, position = rows[0]
            self.fail(fed, position, describe(error))
            return
        half = len(rows) // 2
        for part in (rows[:half], rows[half:]):
            failure, unfinished = self.run_alone(part)
            if failure is not None:
                self.isolate(unfinished, failure)

    def run_alone(self, rows: list[tuple[FedWindow, int]]) -> tuple[Exception | None, list]:
        """The rows in the engine by themselves until they finish: (None, []) or the failure and the
        rows it left unfinished. A dead engine is started again (once per shard) and they rerun."""
        self.narrowed += len(rows)
        for fed, position in rows:
            self.add(fed, position)
        while self.requests:
            error, aborted = self.step()
            if error is None:
                continue
            if self.healthy():
                return error, aborted
            self.restart(error)
            for fed, position in aborted:
                self.add(fed, position)
        return None, []

    def healthy(self) -> bool:
        """Whether the engine still runs a row: the engine's request of one token (`health_request`)."""
        request_id = f"health/{self.added}"
        self.added += 1
        try:
            self.engine.add_request(request_id, *self.runner.health_request())
            while self.engine.has_unfinished_requests():
                if any(output.finished for output in self.engine.step() if output.request_id == request_id):
                    return True
        except Exception as error:  # noqa: BLE001 - what the check is for
            log.warning("the vLLM engine does not run a row any more (%s)", describe(error))
            try:
                self.engine.abort_request([request_id])
            except Exception:  # noqa: BLE001, S110 - it is replaced next
                pass
            return False
        return False

    def restart(self, error: Exception) -> None:
        if self.restarted:
            raise UserError(f"the vLLM engine died a second time in this shard ({describe(error)}); the shard's table "
                            "was not written, its committed windows are kept for a rerun")
        log.warning("the vLLM engine died (%s); starting it again and running its rows in flight again",
                    describe(error))
        self.restarted = True
        self.runner.restart()

    def finished(self, fed: FedWindow) -> tuple[Any, dict, dict[int, str]]:
        """A window's results (the rows that did not fail, in row order) and its failed rows."""
        ok = sorted(fed.outputs)
        results = self.runner.results([fed.outputs[p] for p in ok], fed.batch, ok)
        return fed.key, results, dict(sorted(fed.failed.items()))
