"""One loop between the shard's windows and the server (`ServerEngine.feed`): every row a request,
at most `concurrency` in flight (`requests`), kept full across windows, and windows handed back
whole and in order, to be written and committed one by one (resume as for the other engines).

- **Fed, not drained.** While fewer than two windows are in flight, or fewer rows than
  `concurrency` are unanswered, the next window's rows are sent; the requests keep their order
  (first sent, first given a slot), so the oldest window finishes first. The next window is waited
  for only while nothing is in flight.
- **A refused row costs its row.** A row the workflow refused before sending it (`refused`: a
  malformed conversation, a token the model cannot embed, ...), one the server refused (400, 413,
  422) or ended with finish_reason `error`: with `row_errors: record` an error row, otherwise the
  shard fails in one line naming it.
- **A server that stops answering** fails the shard once a request's retries are spent
  (`requests.Unanswered`): the windows committed so far stay, and the rerun resumes after them.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shardinfer.engines.base import NOT_YET, EngineProgress, failed_row, whole_window
from shardinfer.engines.server.requests import Refused, Unanswered

AHEAD = 1  # windows in flight behind the oldest one, however few rows they hold
POLL_S = 0.05  # how often the loop looks for the next window while it could take one


@dataclass
class SentWindow:
    """A window in flight: its rows (`collate`'s), each row's reply to come, and its failed rows."""

    key: Any  # the runner's, handed back with the results
    batch: dict  # ids, index, params, refused (window position -> why)
    replies: dict[int, concurrent.futures.Future] = field(default_factory=dict)  # position -> reply
    failed: dict[int, str] = field(default_factory=dict)  # position -> "Type: message"

    def unanswered(self) -> int:
        return sum(not reply.done() for reply in self.replies.values())

    def row(self, position: int) -> int:
        return int(self.batch["index"][position])


class ServerFeeder:
    """The loop; `run` yields (key, results of the rows that did not fail, in row order, failed)."""

    def __init__(self, engine, record: bool) -> None:
        self.engine, self.record = engine, record  # the ServerEngine whose requests it sends
        self.progress = EngineProgress()
        self.in_flight: deque[SentWindow] = deque()

    def run(self, take: Callable[[bool], Any]) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        try:
            yield from self.windows(take)
        finally:  # a failure (or a caller that stops) leaves no request of ours waiting
            for window in self.in_flight:
                for reply in window.replies.values():
                    reply.cancel()

    def windows(self, take: Callable[[bool], Any]) -> Iterator[tuple[Any, dict, dict[int, str]]]:
        exhausted = False
        while True:
            while not exhausted and self.wants_more():
                item = take(not self.in_flight)  # wait for the next window only while nothing is in flight
                if item is NOT_YET:
                    break
                if item is None:
                    exhausted = True
                    break
                self.in_flight.append(self.send(*item))
            if not self.in_flight:
                if exhausted:
                    return
                continue
            self.wait(polling=not exhausted and self.wants_more())
            while self.in_flight and self.in_flight[0].unanswered() == 0:
                yield self.finished(self.in_flight.popleft())

    def wait(self, polling: bool) -> None:
        """Until the oldest window's rows are answered, one of them fails, or (`polling`) a moment
        passed; a request the server left unanswered fails the shard at once."""
        pending = [reply for reply in self.in_flight[0].replies.values() if not reply.done()]
        if not pending:
            return
        done, _ = concurrent.futures.wait(pending, timeout=POLL_S if polling else None,
                                          return_when=concurrent.futures.FIRST_EXCEPTION)
        for reply in done:
            if not reply.cancelled() and isinstance(reply.exception(), Unanswered):
                raise reply.exception()

    def wants_more(self) -> bool:
        if len(self.in_flight) <= AHEAD:
            return True
        return sum(window.unanswered() for window in self.in_flight) < self.engine.options.concurrency

    def send(self, key: Any, window, batches: list) -> SentWindow:
        """A window's rows, each as its own request (`collate` gave the window whole)."""
        batch = whole_window(batches, window, "server")
        sent = SentWindow(key, batch)
        for position in range(window.rows):
            refused = batch["refused"].get(position)
            if refused is not None:
                self.fail(sent, position, f"RowError: {refused}")
                continue
            reply = self.engine.post(batch, position, sent.row(position))
            reply.add_done_callback(lambda _: self.progress.advance())
            sent.replies[position] = reply
        return sent

    def fail(self, sent: SentWindow, position: int, why: str) -> None:
        """A row that failed alone: recorded, or the shard fails naming it."""
        sent.failed[position] = failed_row(self.record, sent.row(position), why)

    def finished(self, sent: SentWindow) -> tuple[Any, dict, dict[int, str]]:
        """A window's results (the rows that did not fail, in row order) and its failed rows. A
        request without an answer (`Unanswered`) fails the shard here."""
        ok, answers = [], []
        for position, reply in sorted(sent.replies.items()):
            try:
                answer = reply.result()
            except Refused as refused:
                self.fail(sent, position, f"ServerError: {refused}")
                continue
            why = self.engine.refused(answer)
            if why:
                self.fail(sent, position, f"ServerError: {why}")
                continue
            answers.append(answer)
            ok.append(position)
        return sent.key, self.engine.results(answers, sent.batch, ok), dict(sorted(sent.failed.items()))
