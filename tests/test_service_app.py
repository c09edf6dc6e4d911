"""ServiceState.health(): loading -> ready -> degraded (guard) -> ready -> stopping."""

from __future__ import annotations

from types import SimpleNamespace

from edge_runtime.guard_config import GuardConfig
from edge_runtime.guard.guard import MemoryGuard
from edge_runtime.guard.telemetry import ScriptedSource
from edge_runtime.service.app import ServiceState
from edge_runtime.service_limits import ServiceLimits


def test_health_follows_load_guard_and_shutdown():
    source = ScriptedSource([0.2])
    guard = MemoryGuard(GuardConfig(), source, None)
    state = ServiceState(ServiceLimits(), "m", guard)
    assert state.health() == (503, {"status": "loading", "reason": "loading model"})
    model = SimpleNamespace(tokenizer=None, config=SimpleNamespace(max_position_embeddings=64,
                                                                    vocab_size=10))
    state.set_ready(model, None, None, None)
    guard.poll()
    assert state.health() == (200, {"status": "ready", "reason": ""})
    source.push(0.95)
    guard.poll()
    code, body = state.health()
    assert code == 200 and body["status"] == "degraded" and body["guard"] == "critical"
    assert "critical from 93%" in body["reason"]
    source.push(0.1)
    guard.poll()
    assert state.health()[1]["status"] == "ready"
    state.stopping = True
    assert state.health() == (503, {"status": "stopping", "reason": "shutting down"})


def test_health_and_ready_gauge_report_a_dead_engine_loop():
    """A dead engine loop (AsyncEngine.failure set) makes /health 503 "failed", not "ready"."""
    from edge_runtime.service.metrics import render_prometheus

    state = ServiceState(ServiceLimits(), "m")
    model = SimpleNamespace(tokenizer=None, config=SimpleNamespace(max_position_embeddings=64,
                                                                    vocab_size=10))
    aengine = SimpleNamespace(failure=None)
    engine = SimpleNamespace(stats=lambda: {"steps": 3, "running": 0, "waiting": 0})
    state.set_ready(model, engine, aengine, None)
    assert state.health() == (200, {"status": "ready", "reason": ""})
    aengine.failure = ValueError("Overflow when unpacking long long")
    code, body = state.health()
    assert code == 503 and body["status"] == "failed"
    assert "ValueError: Overflow when unpacking long long" in body["reason"]
    assert "edge_service_ready 0" in render_prometheus(state.stats())


def test_404_and_405_say_what_to_do_and_405_keeps_allow():
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from edge_runtime.service.app import build_app

    async def main():
        async with TestClient(TestServer(build_app(ServiceState(ServiceLimits(), "m")))) as c:
            r405 = await c.get("/v1/chat/completions")
            r405_post = await c.post("/health")
            r404 = await c.get("/v2/nothing")
            return ((r405.status, r405.headers.get("Allow"), await r405.json()),
                    (r405_post.status, r405_post.headers.get("Allow")),
                    (r404.status, await r404.json()))

    (s405, allow, b405), (s405_post, allow_post), (s404, b404) = asyncio.run(main())
    assert (s405, allow, b405["error"]["code"]) == (405, "POST", "method_not_allowed")
    assert b405["error"]["message"] == "GET is not allowed on /v1/chat/completions; use POST"
    assert s405_post == 405 and set(allow_post.replace(" ", "").split(",")) == {"GET", "HEAD"}
    assert s404 == 404 and b404["error"]["code"] == "not_found"
    message = b404["error"]["message"]
    assert message.startswith("no endpoint at /v2/nothing; the endpoints are ")
    for endpoint in ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
                     "GET /health", "GET /metrics", "GET /v1/stats"):
        assert endpoint in message


def test_health_and_metrics_report_a_guard_that_cannot_read_memory():
    """While telemetry reads fail the guard's state is stale: /health says degraded and why, and
    edge_guard_telemetry_ok is 0 until a read succeeds again."""
    from edge_runtime.guard.telemetry import TelemetryError
    from edge_runtime.service.metrics import render_prometheus

    class FlakySource(ScriptedSource):
        failing = False

        def read(self):
            if self.failing:
                raise TelemetryError("/proc/meminfo has no MemTotal")
            return super().read()

    source = FlakySource([0.2])
    guard = MemoryGuard(GuardConfig(), source, None)
    state = ServiceState(ServiceLimits(), "m", guard)
    model = SimpleNamespace(tokenizer=None, config=SimpleNamespace(max_position_embeddings=64,
                                                                    vocab_size=10))
    state.set_ready(model, None, None, None)
    guard.poll()
    assert "edge_guard_telemetry_ok 1" in render_prometheus(state.stats())
    source.failing = True
    try:
        guard.poll()
    except TelemetryError:
        pass
    code, body = state.health()
    assert code == 200 and body["status"] == "degraded"
    assert "cannot read memory" in body["reason"] and "no MemTotal" in body["reason"]
    assert "edge_guard_telemetry_ok 0" in render_prometheus(state.stats())
    source.failing = False
    guard.poll()
    assert state.health() == (200, {"status": "ready", "reason": ""})


def test_requests_the_http_parser_refuses_log_one_info_line_not_an_error(tmp_path, caplog):
    """aiohttp answers these itself, before any handler (text/plain 400; docs/service.md says so);
    each logged an ERROR with a traceback. Now one INFO line each, and the server goes on."""
    import logging

    from service_helpers import app_on_unix_socket, client, raw_connect, read_response, stub_state

    bad = [b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # URL over 8190 bytes
           b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
           b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
           b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Length: 5\r\n\r\n0\r\n\r\n",
           "GET /h\u00e9alth HTTP/1.1\r\nHost: x\r\n\r\n".encode()]
    caplog.set_level(logging.INFO, logger="aiohttp.server")
    with app_on_unix_socket(stub_state(), str(tmp_path / "api.sock")) as sock:
        for request in bad:
            conn = raw_connect(sock)
            conn.sendall(request)
            status, _, _ = read_response(conn)
            conn.close()
            assert status == 400, request[:40]
        with client(sock) as c:
            assert c.get("/health").json()["status"] == "ready"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], \
        [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.WARNING]
    refused = [r for r in caplog.records if r.getMessage().startswith("refused a malformed HTTP")]
    assert len(refused) == len(bad) and not any(r.exc_info for r in refused)
    assert all("\n" not in r.getMessage() for r in refused)
