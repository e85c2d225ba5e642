"""The shard job's requests to the server: an asyncio loop in a thread of its own, with one httpx
client, that keeps at most `generate.server.concurrency` requests in flight and hands each answer
back as a `concurrent.futures.Future` (the engine loop, on the job's main thread, waits on them).

- **Retried**: a request that finds no server (connection refused or cut, a timeout) or gets 408,
  409, 429 or 5xx is sent again after a back-off (`endpoint.delay_s`), `retries` times; then it
  fails with `Unanswered`, and so does the shard (its committed windows stay for the rerun).
- **Refused**: 400, 413 or 422 is the row's (`Refused`): the server would not take what it asked.
- **Anything else** (401, 403, 404, ...) is `Unanswered` at once: every row would get it.

The key's header goes on the client only; no message here carries it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading

from shardinfer.core.errors import UserError, first_line
from shardinfer.engines.server.endpoint import (
    RETRIED,
    ROW_REFUSALS,
    ServerOptions,
    delay_s,
    quiet_httpx,
    reply_error,
)

log = logging.getLogger(__name__)


class Refused(Exception):
    """The server refused this request (400, 413, 422): the row's error."""


class Unanswered(UserError):
    """No answer after the retries, or one that every row would get: the shard's failure."""


class Requests:
    """POSTs of JSON bodies to the server, at most `concurrency` at once, from any thread."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.sent = self.retried = 0
        quiet_httpx()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="server-requests", daemon=True)
        self.thread.start()
        self.client, self.slots = asyncio.run_coroutine_threadsafe(self.open(), self.loop).result()

    async def open(self):
        import httpx

        options = self.options
        limits = httpx.Limits(max_connections=options.concurrency, max_keepalive_connections=options.concurrency)
        timeout = httpx.Timeout(options.timeout_s, connect=min(options.timeout_s, 10.0))
        return (httpx.AsyncClient(headers=options.headers(), timeout=timeout, limits=limits),
                asyncio.Semaphore(options.concurrency))

    def post(self, path: str, body: dict, row: int) -> concurrent.futures.Future:
        """The answer's JSON, once it comes (`Refused` or `Unanswered` else); `row` names it in messages."""
        return asyncio.run_coroutine_threadsafe(self.send(path, body, row), self.loop)

    async def send(self, path: str, body: dict, row: int) -> dict:
        import httpx

        url, why, setting = f"{self.options.url}{path}", "", self.options.setting
        async with self.slots:
            for attempt in range(self.options.retries + 1):
                if attempt:
                    self.retried += 1
                self.sent += 1
                try:
                    response = await self.client.post(url, json=body)
                except httpx.HTTPError as error:  # connection refused or cut, timeouts
                    why, retry_after = f"{type(error).__name__}: {first_line(error)}", None
                else:
                    if response.status_code == 200:
                        return response.json()
                    why, retry_after = reply_error(response), response.headers.get("retry-after")
                    if response.status_code in ROW_REFUSALS:
                        raise Refused(f"the server refused it ({why})")
                    if response.status_code not in RETRIED:
                        raise Unanswered(f"{setting}: the server at {self.options.url} answered row {row} with {why}; "
                                         "the shard's table was not written, its committed windows are kept")
                if attempt < self.options.retries:
                    if not self.retried:
                        log.warning("the server at %s did not answer row %d (%s); retrying with back-off, up to %d "
                                    "times per request", self.options.url, row, why, self.options.retries)
                    await asyncio.sleep(delay_s(attempt, retry_after))
        raise Unanswered(f"{setting}: no answer from {self.options.url} for row {row} after {self.options.retries} "
                         f"retries ({why}); the shard's table was not written, its committed windows are kept: "
                         "rerun once the server answers, and it resumes there")

    def close(self) -> None:
        """Every request still in flight cancelled, the client closed and the loop stopped."""
        async def shut() -> None:
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(timeout=30)
        except (concurrent.futures.TimeoutError, RuntimeError) as error:
            log.warning("closing the server's requests took too long (%s)", first_line(error))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
