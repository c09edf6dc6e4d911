"""An OpenAI-compatible chat-completions client for replaying a trace against a running server.

Targets: `http://HOST:PORT` (llama.cpp's llama-server, vLLM, our service over TCP) or `unix:PATH`
(our service's Unix socket). Requests are streamed (`"stream": true`) so the first content delta
gives TTFT; greedy (`temperature: 0`). Token counts come from the final `usage` chunk when the
server sends one (`stream_options.include_usage`); otherwise each non-empty content delta counts as
one token (exact for servers that stream one token per chunk, as llama-server and vLLM do) and
`prompt_tokens` is unknown (None). Without a model name the first id of `GET /v1/models` is used.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from edge_runtime.bench.replay import Outcome
from edge_runtime.errors import EdgeError, InputError


class TargetError(EdgeError):
    """The benchmark target server is unreachable or answered with an error."""


def parse_target(target: str) -> tuple[str | None, str]:
    """`unix:/run/x.sock` -> ("/run/x.sock", "http://localhost"); `http://h:p` -> (None, url)."""
    if target.startswith("unix:"):
        path = target[len("unix:"):]
        if not path:
            raise InputError("--target unix: needs a socket path, e.g. unix:/run/edge-runtime.sock")
        return path, "http://localhost"
    if target.startswith(("http://", "https://")):
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(target)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        except ValueError as exc:
            raise InputError(f"--target {target!r} is not a valid URL ({exc}); give "
                             "http://HOST:PORT") from None
        if not parts.hostname:
            raise InputError(f"--target {target!r} names no host; give http://HOST:PORT")
        return None, target.rstrip("/")
    raise InputError(
        f"--target must be unix:PATH or http://HOST:PORT, got {target!r}"
    )


@dataclass
class _StreamState:
    pieces: list[str] = field(default_factory=list)
    chunks_with_text: int = 0
    first_token_t: float | None = None
    usage: dict | None = None
    finish_reason: str = "stop"

    def feed(self, chunk: dict) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                if self.first_token_t is None:
                    self.first_token_t = time.perf_counter()
                self.pieces.append(text)
                self.chunks_with_text += 1
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def outcome(self) -> Outcome:
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        return Outcome(
            text="".join(self.pieces),
            output_tokens=usage.get("completion_tokens", self.chunks_with_text),
            first_token_t=self.first_token_t,
            end_t=time.perf_counter(),
            prompt_tokens=usage.get("prompt_tokens"),
            cached_prompt_tokens=details.get("cached_tokens"),
            finish_reason=self.finish_reason,
        )


def parse_sse_line(line: str) -> dict | None:
    """One `data: {...}` line -> the chunk; None for comments, blank lines and `[DONE]`."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    data = line[len("data:"):].strip()
    if data == "[DONE]" or not data:
        return None
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise TargetError(f"the target sent a malformed stream chunk: {data[:80]!r}") from exc


class OpenAIChatBackend:
    """`Backend` for bench.replay that talks to an OpenAI-compatible server."""

    def __init__(self, target: str, model: str | None = None, timeout_s: float = 600.0,
                 connect_timeout_s: float = 30.0) -> None:
        self.socket_path, self.base_url = parse_target(target)
        self.name = target
        self.model = model
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._session = None

    async def _get_session(self):
        import aiohttp

        if self._session is None:
            # one connection per request: llama-server (cpp-httplib) closes an idle keep-alive
            # connection after 5 s, and a POST sent on such a pooled connection fails ("Can not
            # write request body") where a closed-loop replay's think time exceeds that
            connector = (aiohttp.UnixConnector(path=self.socket_path, force_close=True)
                         if self.socket_path else aiohttp.TCPConnector(force_close=True))
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(
                    total=self.timeout_s, sock_connect=self.connect_timeout_s)
            )
        return self._session

    def _body(self, messages: list[dict], max_tokens: int) -> dict:
        return {
            "model": self.model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
        }

    async def _resolve_model(self, session) -> str:
        """The model to request: the one given, else the first of the server's GET /v1/models."""
        if self.model is None:
            async with session.get(f"{self.base_url}/v1/models") as resp:
                data = await resp.json(content_type=None) if resp.status == 200 else {}
            models = [m.get("id") for m in data.get("data") or [] if m.get("id")]
            self.model = models[0] if models else "default"
        return self.model

    async def complete(self, stream: str, messages: list[dict], max_tokens: int) -> Outcome:
        import aiohttp

        session = await self._get_session()
        url = f"{self.base_url}/v1/chat/completions"
        state = _StreamState()
        try:
            await self._resolve_model(session)
            async with session.post(url, json=self._body(messages, max_tokens)) as resp:
                if resp.status != 200:
                    body = (await resp.text())[:200]
                    raise TargetError(f"{self.name} answered HTTP {resp.status}: {body}")
                async for raw in resp.content:
                    chunk = parse_sse_line(raw.decode("utf-8", errors="replace"))
                    if chunk is not None:
                        state.feed(chunk)
        except aiohttp.ClientConnectionError as exc:
            raise TargetError(
                f"cannot reach {self.name} ({exc or type(exc).__name__}); is the server running?"
            ) from exc
        except asyncio.TimeoutError as exc:  # a host that never answers, or a stalled stream
            raise TargetError(f"{self.name} did not answer within {self.timeout_s:.0f} s "
                              f"(connect: {self.connect_timeout_s:.0f} s); is the server "
                              "running and reachable?") from exc
        return state.outcome()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
