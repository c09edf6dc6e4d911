"""Seeded, bounded fuzz of the HTTP service (tests/fuzz_client.py): every field of the chat and
completions schemas, raw bytes, malformed HTTP, and disconnects at every point of a stream.
Fails on any 5xx, any non-JSON error other than aiohttp's documented text/plain 400, an ERROR
logged, a request left in flight, or a server that stops answering (the client's timeout).

The HTTP layer is what is under test, so most requests run on a stand-in engine that streams a
few tokens per choice; a smaller part runs on the real engine (the tiny random model). Both run
over the Unix socket and over TCP on 127.0.0.1 with API keys (most requests with the key, some
with a wrong one or none: 401)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from fuzz_client import RequestFuzzer, check, exchange, http_request, with_header
from service_helpers import app_on_tcp, app_on_unix_socket, client, tiny_engine_state

FUZZ_LIMITS = {"max_tokens": 16, "body_timeout_s": 0.5}
KEY = "fuzz-key-0123456789abcdef0123456789abcdef"
TRANSPORTS = ["unix", "tcp-with-keys"]


@dataclass
class Target:
    address: object  # a Unix socket path, or (127.0.0.1, port)
    key: str | None  # the API key the listener requires, if any

    def keyed(self, request: bytes, rng=None) -> bytes:
        """`request` with the key (with `rng`: one in ten with a wrong key or none)."""
        if self.key is None:
            return request
        roll = rng.random() if rng is not None else 0.0
        if roll >= 0.95:
            return request
        key = self.key if roll < 0.9 else self.key[:-1] + "0"
        return with_header(request, f"Authorization: Bearer {key}")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


@contextlib.contextmanager
def _serving(state, transport: str, tmp_path):
    if transport == "unix":
        with app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock:
            yield Target(sock, None)
    else:
        from edge_runtime.service.api_keys import ApiKeys

        state.api_keys = ApiKeys([KEY])
        with app_on_tcp(state) as address:
            yield Target(address, KEY)


class StreamingStandIn:
    """Stand-in AsyncEngine: min(max_tokens, 3) tokens for each of the n choices ("x", then a
    two-byte character), yielding to the event loop between steps so a client can leave anywhere."""

    failure = None

    def __init__(self) -> None:
        self.live: set[str] = set()

    async def stream(self, prompt_ids, params, request_id):
        from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent

        steps = min(params.max_tokens, 3)
        self.live.add(request_id)
        try:
            for step in range(steps):
                for i in range(params.n):
                    yield TokenEvent(request_id, i, [7], "é" if step % 2 else "x")
                await asyncio.sleep(0)
            texts = ["xéx"[:steps]] * params.n
            result = GenerationResult(request_id, len(prompt_ids), 0,
                                      [Completion(t, [7] * steps, "length") for t in texts])
            yield TokenEvent(request_id, 0, [], "", result=result)
        finally:
            self.live.discard(request_id)

    async def cancel(self, request_id):
        return None

    async def call(self, fn):
        live = frozenset(self.live)
        return fn(SimpleNamespace(snapshot=lambda: SimpleNamespace(running_request_ids=live,
                                                                   held_request_ids=live)))


def _stand_in_state():
    from engine_helpers import tiny

    from edge_runtime.service.app import ServiceState
    from edge_runtime.service_limits import ServiceLimits

    loaded = tiny()  # its tokenizer (SmolLM2's) and sizes; the model itself is not run
    cfg = SimpleNamespace(page_tokens=16, enable_inline=False, num_inline_slots=0, inline_tokens=0)
    engine = SimpleNamespace(config=cfg, num_pages=4096, stats=lambda: {"steps": 0})
    state = ServiceState(ServiceLimits(**FUZZ_LIMITS), "m")
    state.set_ready(loaded, engine, StreamingStandIn(), None)
    return state


def _fuzz(target: Target, seed: int, count: int) -> int:
    """`count` fuzzed requests; every tenth asking for a stream is left after a random event or
    at a random byte of the request. Returns how many were sent."""
    fuzzer = RequestFuzzer(seed)
    rng = fuzzer.rng
    for i in range(count):
        kind, request, stream = fuzzer.request()
        request = target.keyed(request, rng)
        malformed = not request.startswith(b"POST /v1/") or b"Content-Length: -5" in request \
            or b"Transfer-Encoding" in request
        leave = None
        if stream and rng.random() < 0.3:
            leave = -rng.randint(1, 8)
        elif rng.random() < 0.05:
            leave = rng.randint(0, len(request))
        check(exchange(target.address, request, leave), malformed)
        if i % 50 == 49:
            _assert_answering(target)
    return count


def _every_disconnect_point(target: Target, body: bytes, path: str) -> int:
    """The same stream, left after each of its events in turn and at points of its request."""
    request = target.keyed(http_request(path, body, ""))
    sock = target.address
    full = exchange(sock, request)
    check(full, False)
    assert full.status == 200 and full.events[-1] == "[DONE]", full
    sent = 1
    for k in range(1, len(full.events) + 1):
        check(exchange(sock, request, -k), False)
        sent += 1
    head = request.index(b"\r\n\r\n")
    for cut in (0, 1, head // 2, head, head + 4, head + 4 + len(body) // 2, len(request) - 1):
        check(exchange(sock, request, cut), False)
        sent += 1
    return sent


def _assert_answering(target: Target) -> None:
    with client(target.address, timeout=30, headers=target.headers) as c:
        assert c.get("/health").status_code == 200


def _assert_clean(state, caplog) -> None:
    deadline = time.monotonic() + 30
    while state.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.in_flight == 0, state.book.snapshot()
    statuses = {status for (_, status) in state.metrics.requests}
    assert all(s < 500 for s in statuses), statuses
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors[:5]]


STREAMS = [(b'{"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 3, '
            b'"stream": true, "stream_options": {"include_usage": true}}', "/v1/chat/completions"),
           (b'{"prompt": [1, 2], "max_tokens": 2, "stream": true}', "/v1/completions")]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fuzz_http_layer_on_a_stand_in_engine(tmp_path, caplog, transport):
    caplog.set_level(logging.INFO)
    state = _stand_in_state()
    with _serving(state, transport, tmp_path) as target:
        sent = _fuzz(target, seed=1234, count=1000)
        for body, path in STREAMS:
            sent += _every_disconnect_point(target, body, path)
        with ThreadPoolExecutor(4) as pool:  # and four clients at once (seeded each)
            sent += sum(pool.map(lambda seed: _fuzz(target, seed, 60), range(4)))
        _assert_answering(target)
        _assert_clean(state, caplog)
    assert sent >= 1000
    served = sum(n for (_, status), n in state.metrics.requests.items() if status == 200)
    refused = sum(n for (_, status), n in state.metrics.requests.items() if 400 <= status < 500)
    assert served > 150 and refused > 300, state.metrics.requests  # both sides were reached
    unauthorized = sum(n for (_, status), n in state.metrics.requests.items() if status == 401)
    assert (unauthorized > 20) == (target.key is not None), state.metrics.requests


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fuzz_on_the_real_engine(tmp_path, caplog, transport):
    caplog.set_level(logging.INFO)
    with tiny_engine_state(limits=FUZZ_LIMITS) as state, \
            _serving(state, transport, tmp_path) as target:
        sent = _fuzz(target, seed=99, count=150)
        for body, path in STREAMS:
            sent += _every_disconnect_point(target, body, path)
        _assert_answering(target)
        _assert_clean(state, caplog)
        engine = state.engine
        deadline = time.monotonic() + 30
        while engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.01)
        kv = engine.stats()["kv"]
        assert kv["pages_live"] == 0 and kv.get("inline_slots_used", 0) == 0, kv
    assert sent >= 150
