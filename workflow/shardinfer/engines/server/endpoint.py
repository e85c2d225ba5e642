"""The server as the workflow sees it before any row: `<task>.server` read (`ServerOptions`), the
key's header, and what the server says of itself (`Served`: its model's `/v1/models` entry,
`/version`, the `system_fingerprint` of a one-token completion, or for embed a one-token
embedding, its dialect), asked once per process when the Snakefile loads (the checks and the
shard digest) and again when a shard job starts. A server that does not answer, refuses the key,
or does not serve the model is refused
in one line here, before any job. Torch-free; httpx is imported inside the functions.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from shardinfer.core.errors import UserError, first_line
from shardinfer.settings.schema import defaults

PROMPTS = ("tokens", "text")
# Answers worth another try: a timeout, a lock, a rate limit, a server error (its restart, a full queue).
RETRIED = frozenset({408, 409, 429, 500, 502, 503, 504})
# Answers that are the row's: the server refused what this request asked (its prompt, a parameter).
ROW_REFUSALS = frozenset({400, 413, 422})
FIRST_DELAY_S, MOST_DELAY_S, MOST_RETRY_AFTER_S = 0.5, 30.0, 60.0
# /v1/models entry fields that change with each start of the same server (not its identity).
VOLATILE = ("created", "permission")
# The endpoint each task's rows go to.
ENDPOINTS = {"generate": "/completions", "embed": "/embeddings"}


@dataclass(frozen=True)
class ServerOptions:
    """`<task>.server` (`generate.server`, `embed.server`), at the schema's defaults where not given.
    Holds the key's variable's name, never the key."""

    url: str
    task: str = "generate"
    model: str | None = None
    api_key_env: str | None = None
    concurrency: int = 256
    timeout_s: float = 600.0
    retries: int = 5
    prompt: str = "tokens"

    @classmethod
    def of(cls, section: Mapping, task: str = "generate") -> ServerOptions:
        """From the task's section; a missing or malformed URL refused in one line."""
        given = {**defaults(task)["server"], **dict(section.get("server") or {})}
        url, setting = given.get("url"), f"{task}.server"
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserError(f"{setting}.url is {url!r}; {task}.engine server needs the server's OpenAI base URL, "
                            "such as http://gpu-node-3:8000/v1")
        if given["prompt"] not in PROMPTS:
            raise UserError(f"{setting}.prompt is {given['prompt']!r}; allowed: {', '.join(PROMPTS)}")
        return cls(url.rstrip("/"), task, given.get("model"), given.get("api_key_env"), int(given["concurrency"]),
                   float(given["timeout_s"]), int(given["retries"]), given["prompt"])

    @property
    def setting(self) -> str:
        """The section's name in messages (`generate.server`)."""
        return f"{self.task}.server"

    @property
    def endpoint(self) -> str:
        """Where the rows go: /completions for generate, /embeddings for embed."""
        return ENDPOINTS[self.task]

    @property
    def root(self) -> str:
        """The server's root, where vLLM answers /version: the URL without its trailing /v1."""
        return self.url.removesuffix("/v1")

    def headers(self) -> dict[str, str]:
        """The key's header, read from its variable now (never stored, logged or digested)."""
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise UserError(f"{self.setting}.api_key_env names {self.api_key_env}, which is not set in this "
                            "environment; export the API key in it, or set api_key_env: null for a server without one")
        return {"Authorization": f"Bearer {key}"}


def delay_s(attempt: int, retry_after: str | None = None) -> float:
    """Seconds before retry `attempt` (0 first): the server's Retry-After where it gives one (up to
    a minute), else 0.5, 1, 2, ... s (at most 30), with a little jitter so that the rows in flight
    do not all come back at once."""
    try:
        asked = float(retry_after) if retry_after is not None else None
    except ValueError:
        asked = None
    if asked is not None and 0 <= asked <= MOST_RETRY_AFTER_S:
        return asked
    return min(FIRST_DELAY_S * 2 ** attempt, MOST_DELAY_S) * random.uniform(0.8, 1.0)  # noqa: S311 - jitter


def reply_error(response) -> str:
    """A refusal's status and the server's own line (OpenAI's `error.message`, else the body's start)."""
    try:
        body = response.json()
        message = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else None
        message = message or body.get("message") or body.get("detail") or body.get("error")
    except (ValueError, AttributeError):
        message = None
    text = first_line(ValueError(str(message or response.text or response.reason_phrase)))
    return f"{response.status_code}: {text[:300]}"


@dataclass(frozen=True)
class Served:
    """What the server says of itself: the model name requests carry, its `/v1/models` entry, the
    `/version` answer, the fingerprint of its build and settings, and its dialect (`vllm` where it
    says it is vLLM: the token ids and vLLM's request fields; else `openai`: the OpenAI API's fields
    only)."""

    model: str
    entry: dict
    version: dict | None
    fingerprint: str | None
    dialect: str

    def identity(self, options: ServerOptions) -> dict:
        """For the shard digest: all of it (not the URL or the key: the same model moved to another
        host gives the same rows)."""
        identity = {"engine": "server", "dialect": self.dialect, "model": self.entry, "version": self.version,
                    "fingerprint": self.fingerprint, "prompt": options.prompt}
        return identity if options.task == "generate" else {**identity, "endpoint": options.endpoint}

    @property
    def max_model_len(self) -> int | None:
        value = self.entry.get("max_model_len")
        return value if isinstance(value, int) else None


def client(options: ServerOptions, timeout_s: float | None = None):
    """A synchronous httpx client for the URL, with the key's header."""
    import httpx

    quiet_httpx()
    timeout = timeout_s or options.timeout_s
    return httpx.Client(headers=options.headers(), timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))


def quiet_httpx() -> None:
    """httpx logs a line per request at INFO: thousands in a shard's log."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


def get_json(http, options: ServerOptions, url: str) -> dict | None:
    """A GET's JSON answer; None for 404 (an endpoint this server does not have); a server that does
    not answer or refuses the key is refused in one line."""
    import httpx

    try:
        response = http.get(url)
    except httpx.HTTPError as error:
        raise UserError(f"{options.setting}.url {options.url}: no server answers ({type(error).__name__}: "
                        f"{first_line(error)}); start it, or fix the URL") from None
    if response.status_code == 404:
        return None
    if response.status_code in (401, 403):
        raise UserError(f"{options.setting}: the server at {options.url} refused the key ({reply_error(response)}); "
                        f"check the key in {options.api_key_env or '(none: api_key_env is null)'}")
    if response.status_code != 200:
        raise UserError(f"{options.setting}: GET {url} answered {reply_error(response)}")
    try:
        return response.json()
    except ValueError:
        raise UserError(f"{options.setting}: GET {url} answered something other than JSON; is {options.url} an "
                        "OpenAI-compatible server's base URL (ending in /v1)?") from None


def model_entry(listing: dict | None, options: ServerOptions) -> dict:
    """The served model's entry in /v1/models: the one named, or the only one listed."""
    listed = (listing.get("data") if isinstance(listing, dict) else None) or []
    entries = [entry for entry in listed if isinstance(entry, dict) and "id" in entry]
    names = [entry["id"] for entry in entries]
    if options.model is None:
        if len(entries) != 1:
            listed = ", ".join(names) or "none"
            raise UserError(f"{options.setting}.model is not set and the server at {options.url} lists {len(names)} "
                            "models "
                            f"({listed}); name one")
        return entries[0]
    if options.model not in names:
        raise UserError(f"{options.setting}.model {options.model!r} is not served at {options.url}; it serves: "
                        f"{', '.join(names) or 'none'}")
    return entries[names.index(options.model)]


def probe_body(model: str, dialect: str, options: ServerOptions, extra: dict | None = None) -> dict:
    """A one-token greedy completion of the prompt as rows send it (a token id, or text); for embed,
    the embedding of that one token, as rows ask it (`embedding_body`)."""
    prompt = [0] if options.prompt == "tokens" else "Hello"
    if options.task == "embed":
        return embedding_body(model, prompt, dialect)
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    return {**body, "return_token_ids": True, **(extra or {})} if dialect == "vllm" else body


def embedding_body(model: str, prompt, dialect: str) -> dict:
    """A row's /v1/embeddings body: its token ids (or text), the vector as float32 in base64 (exact,
    and a third of the JSON), and for a vLLM server the pooled state raw (`use_activation`: false;
    the task normalises, as on the other engines)."""
    body = {"model": model, "input": prompt, "encoding_format": "base64"}
    return {**body, "use_activation": False} if dialect == "vllm" else body


def probe(http, options: ServerOptions, model: str, dialect: str, extra: dict | None = None) -> dict:
    """One small completion as the rows will ask it (its prompt's form, the dialect's fields, and
    `extra` of them), retried as rows are: the server takes them, and says its fingerprint."""
    import httpx

    body, why = probe_body(model, dialect, options, extra), ""
    for attempt in range(options.retries + 1):
        try:
            response = http.post(f"{options.url}{options.endpoint}", json=body)
        except httpx.HTTPError as error:
            raise UserError(f"{options.setting}.url {options.url}: no server answers ({type(error).__name__}: "
                            f"{first_line(error)}); start it, or fix the URL") from None
        if response.status_code == 200:
            return response.json()
        why = reply_error(response)
        if response.status_code not in RETRIED:
            break
        time.sleep(delay_s(attempt, response.headers.get("retry-after")))
    if extra:
        raise UserError(f"{options.setting}: the server at {options.url} refuses {', '.join(extra)} "
                        f"{json.dumps(extra)[:200]} "
                        f"({why})")
    what = "embedding" if options.task == "embed" else "completion"
    raise UserError(f"{options.setting}: the server at {options.url} refused a one-token {what} of model {model!r} "
                    f"with the prompt as {options.prompt} ({why}); {options.task}.engine server needs its "
                    f"/v1{options.endpoint}"
                    + (f" to take token ids (set {options.setting}.prompt: text for a server that takes text only)"
                       if options.prompt == "tokens" else ""))


@functools.lru_cache(maxsize=8)
def served(options: ServerOptions) -> Served:
    """Asked once per process (the Snakefile's checks and digest, a shard job's start)."""
    with client(options, min(options.timeout_s, 60.0)) as http:
        entry = model_entry(get_json(http, options, f"{options.url}/models"), options)
        dialect = "vllm" if entry.get("owned_by") == "vllm" else "openai"
        version = get_json(http, options, f"{options.root}/version") if dialect == "vllm" else None
        answer = probe(http, options, entry["id"], dialect)
    if options.task == "embed":
        check_embedding_answer(answer, options)
    elif dialect == "vllm" and not (answer.get("choices") or [{}])[0].get("token_ids"):
        raise UserError(f"{options.setting}: the vLLM server at {options.url} returned no token_ids "
                        "(return_token_ids); "
                        "it is older than generate.engine server needs (vLLM 0.10.2 or later)")
    kept = {key: value for key, value in entry.items() if key not in VOLATILE}
    return Served(entry["id"], kept, version, answer.get("system_fingerprint"), dialect)


def check_embedding_answer(answer: dict, options: ServerOptions) -> None:
    """The probe's embedding came back as one vector in base64, as every row's must."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not (isinstance(data, list) and len(data) == 1 and isinstance(data[0].get("embedding"), str)):
        raise UserError(f"{options.setting}: the server at {options.url} answered a one-token embedding without one "
                        "base64 vector (encoding_format: base64); embed.engine server needs an OpenAI-compatible "
                        "/v1/embeddings")
