"""The voice loop against a running `edge-runtime serve` (Unix socket) instead of an in-process
engine: `RemoteEngine.stream()` has the AsyncEngine.stream contract the loop uses.

Prompts are sent as token ids to /v1/completions (streaming, with usage), so the service's prefix
cache sees exactly the ids the loop built. Difference from the in-process engine, by the API's
nature: the service streams text, not token ids, so an answer's ids are the tokenizer's encoding
of its text; when the model generated a non-canonical tokenization, the next turn's prompt shares
the prefix only up to that answer (the cache hit shrinks; nothing breaks). Timings are measured by
this client (engine queue time is not visible from outside and is reported as 0).

Every way the socket can fail (nothing listening, a socket that is not our service, a reply that
is not an event stream, malformed events, a server that stops mid-answer, an `error` event) is a
ServiceError naming the socket: the loop reports it as a fault of that turn and goes on. An
answer counts only once `data: [DONE]` arrives; a stream cut before it is never a short answer.

A service that is down or not ready (nothing listening, or 503/429 before the answer starts: a
restart, the model loading, a full queue) is retried, every `Retry-After` (or 0.5 s), until it has
been unavailable for `retry_window_s` counted from its first failure, so commands spoken while the
service restarts are answered once it is back. Once that window has passed, turns fail at once
until a request gets through again (a wrong socket costs the window once, not per turn). A request
is never retried after its answer started.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from edge_runtime.engine.api import (
    Completion, GenerationResult, RequestTimings, SamplingParams, TokenEvent,
)
from edge_runtime.errors import ConfigError, EdgeError

CONNECT_TIMEOUT_S = 10.0
RETRY_WINDOW_S = 60.0  # a restart of `serve`: the process, the model load, the socket back


class ServiceError(EdgeError):
    """The service on --server could not answer this request (the message says why)."""


class ServiceUnavailable(ServiceError):
    """Not answering yet (down, loading, busy) and the request has not started: worth a retry."""

    def __init__(self, message: str, wait_s: float = 0.5):
        super().__init__(message)
        self.wait_s = wait_s


class RemoteEngine:
    def __init__(self, socket_path: str, tokenizer, model: str | None = None,
                 read_timeout_s: float = 300.0, retry_window_s: float = RETRY_WINDOW_S):
        try:
            import aiohttp  # noqa: F401  (the `service` extra)
        except ImportError as exc:
            raise ConfigError("--server needs aiohttp: pip install 'edge-runtime[service]'") from exc
        self.socket_path = socket_path
        self.tokenizer = tokenizer
        self.model = model
        self.read_timeout_s = read_timeout_s
        self.retry_window_s = retry_window_s
        self.down_since: float | None = None  # first failure of the current outage, monotonic

    def _body(self, prompt_ids: list[int], params: SamplingParams) -> dict:
        body = {"prompt": list(prompt_ids), "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "stream": True,
                "stream_options": {"include_usage": True}}
        if params.seed is not None:
            body["seed"] = params.seed
        if params.grammar is not None:  # the voice loop's actions
            from edge_runtime.service.tools_api import as_response_format

            body["response_format"] = as_response_format(params.grammar)
        if self.model:
            body["model"] = self.model
        return body

    async def stream(self, prompt_ids: list[int], params: SamplingParams | None = None,
                     request_id: str | None = None,
                     stream_id: str | None = None) -> AsyncIterator[TokenEvent]:
        params = params or SamplingParams()
        added = time.perf_counter()
        while True:
            try:
                async for event in self._request(prompt_ids, params, request_id or "remote", added):
                    yield event
                return
            except ServiceUnavailable as exc:
                now = time.monotonic()
                self.down_since = self.down_since if self.down_since is not None else now
                waited = now - self.down_since
                if waited + exc.wait_s > self.retry_window_s:
                    raise ServiceError(f"{exc} (unavailable for {waited:.0f} s; retried for up to "
                                       f"{self.retry_window_s:.0f} s)") from exc
                await asyncio.sleep(exc.wait_s)

    async def _request(self, prompt_ids: list[int], params: SamplingParams, rid: str,
                       added: float) -> AsyncIterator[TokenEvent]:
        """One attempt; ServiceUnavailable only before the answer started."""
        import aiohttp

        first = None
        pieces: list[str] = []
        finish, usage = "stop", {}
        # a session per request: it belongs to the running event loop, and a Unix-socket
        # connection costs microseconds
        connector = aiohttp.UnixConnector(path=self.socket_path)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S,
                                        sock_read=self.read_timeout_s)
        where = f"the service at {self.socket_path}"
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                try:
                    resp = await session.post("http://localhost/v1/completions",
                                              json=self._body(prompt_ids, params))
                except aiohttp.ClientConnectorError as exc:  # nothing listening (yet)
                    raise ServiceUnavailable(f"cannot reach {where}: {exc} (is `edge-runtime "
                                             "serve` running on that socket?)") from exc
                async with resp:
                    await _check_response(resp, where)
                    self.down_since = None  # it answers: a later outage gets a fresh window
                    async for data in _sse(resp, where):
                        usage = data.get("usage") or usage
                        for choice in data.get("choices") or []:
                            text = choice.get("text") or ""
                            finish = choice.get("finish_reason") or finish
                            if text:
                                first = first or time.perf_counter()
                                pieces.append(text)
                                yield TokenEvent(rid, 0, [], text)  # ids: only at the end
        except aiohttp.ClientConnectionError as exc:
            raise ServiceError(f"cannot reach {where}: {exc} (is `edge-runtime serve` "
                               "running on that socket?)") from exc
        except aiohttp.ClientResponseError as exc:  # e.g. not HTTP at all
            raise ServiceError(f"{where} did not answer in HTTP ({exc.message.splitlines()[0]}): "
                               "is it an `edge-runtime serve` socket?") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServiceError(f"{where} broke off the answer ({type(exc).__name__}: {exc}): "
                               "was it stopped or restarted?") from exc
        done = time.perf_counter()
        text = "".join(pieces)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        timings = RequestTimings(0.0, (first or done) - added, done - added)
        result = GenerationResult(rid, usage.get("prompt_tokens", len(prompt_ids)), cached,
                                  [Completion(text, ids, finish)], timings)
        yield TokenEvent(rid, 0, [], "", result=result)

    def shutdown(self) -> None:
        """Nothing to release: sessions live for one request."""


async def _check_response(resp, where: str) -> None:
    if resp.status != 200:
        body = (await resp.read())[:200].decode("utf-8", "replace")
        if resp.status in (429, 503):  # loading, restarting, busy: it says when to come back
            raise ServiceUnavailable(f"{where} is not ready ({resp.status}): {body}",
                                     _retry_after(resp.headers.get("Retry-After")))
        raise ServiceError(f"{where} refused the request ({resp.status}): {body}")
    if resp.content_type != "text/event-stream":
        raise ServiceError(f"{where} answered with {resp.content_type or 'no content type'}, not an "
                           "event stream: is it an `edge-runtime serve` socket?")


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value), 0.1), 10.0)
    except (TypeError, ValueError):
        return 0.5


async def _sse(resp, where: str) -> AsyncIterator[dict]:
    """The JSON objects of an SSE body, up to `data: [DONE]`; anything else is a ServiceError."""
    async for raw in resp.content:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ServiceError(f"{where} sent an event that is not a JSON object: {payload[:80]!r}")
        if "error" in data:
            err = data["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise ServiceError(f"{where} ended the answer with an error: {msg}")
        yield data
    raise ServiceError(f"{where} closed the stream before the answer finished "
                       "(was it stopped or restarted?)")
