"""The voice loop against a running `edge-runtime serve` (Unix socket) instead of an in-process
engine: `RemoteEngine.stream()` has the AsyncEngine.stream contract the loop uses.

Prompts are sent as token ids to /v1/completions (streaming, with usage), so the service's prefix
cache sees exactly the ids the loop built. Difference from the in-process engine, by the API's
nature: the service streams text, not token ids, so an answer's ids are the tokenizer's encoding
of its text; when the model generated a non-canonical tokenization, the next turn's prompt shares
the prefix only up to that answer (the cache hit shrinks; nothing breaks). Timings are measured by
this client (engine queue time is not visible from outside and is reported as 0).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from edge_runtime.engine.api import (
    Completion, GenerationResult, RequestTimings, SamplingParams, TokenEvent,
)
from edge_runtime.errors import ConfigError, RequestError


class RemoteEngine:
    def __init__(self, socket_path: str, tokenizer, model: str | None = None):
        try:
            import aiohttp  # noqa: F401  (the `service` extra)
        except ImportError as exc:
            raise ConfigError("--server needs aiohttp: pip install 'edge-runtime[service]'") from exc
        self.socket_path = socket_path
        self.tokenizer = tokenizer
        self.model = model

    def _body(self, prompt_ids: list[int], params: SamplingParams) -> dict:
        body = {"prompt": list(prompt_ids), "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "stream": True,
                "stream_options": {"include_usage": True}}
        if params.seed is not None:
            body["seed"] = params.seed
        if self.model:
            body["model"] = self.model
        return body

    async def stream(self, prompt_ids: list[int], params: SamplingParams | None = None,
                     request_id: str | None = None,
                     stream_id: str | None = None) -> AsyncIterator[TokenEvent]:
        import aiohttp

        params = params or SamplingParams()
        rid = request_id or "remote"
        added = time.perf_counter()
        first = None
        pieces: list[str] = []
        finish, usage = "stop", {}
        # a session per request: it belongs to the running event loop, and a Unix-socket
        # connection costs microseconds
        connector = aiohttp.UnixConnector(path=self.socket_path)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
                    session.post("http://localhost/v1/completions",
                                 json=self._body(prompt_ids, params)) as resp:
                if resp.status != 200:
                    raise RequestError(f"the service at {self.socket_path} refused the request "
                                       f"({resp.status}): {(await resp.text())[:200]}")
                async for data in _sse(resp):
                    usage = data.get("usage") or usage
                    for choice in data.get("choices", []):
                        text = choice.get("text") or ""
                        finish = choice.get("finish_reason") or finish
                        if text:
                            first = first or time.perf_counter()
                            pieces.append(text)
                            yield TokenEvent(rid, 0, [], text)  # ids: only at the end
        except aiohttp.ClientConnectionError as exc:
            raise ConfigError(f"cannot reach the service at {self.socket_path}: {exc}") from exc
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


async def _sse(resp) -> AsyncIterator[dict]:
    """The JSON objects of an SSE body, up to `data: [DONE]`."""
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)
