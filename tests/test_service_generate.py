"""service/generate.py checks that need the model's sizes, on stand-in state (no model loaded)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from edge_runtime.service.generate import _check_length
from edge_runtime.service_limits import ServiceLimits
from edge_runtime.service.schema import ApiError, parse_completion


def _state(context_len: int = 64):
    return SimpleNamespace(limits=ServiceLimits(), context_len=context_len)


def test_context_error_names_the_key_the_client_sent():
    state = _state(64)
    for key in ("max_tokens", "max_completion_tokens"):
        req = parse_completion({"prompt": "x", key: 40}, 512)
        with pytest.raises(ApiError) as e:
            _check_length(state, list(range(30)), req)
        assert e.value.code == "context_length_exceeded" and e.value.param == key
        assert f"lower {key}" in e.value.message


def _pool_state(num_pages=4, page_tokens=512, slots=8, inline_tokens=128):
    cfg = SimpleNamespace(page_tokens=page_tokens, enable_inline=slots > 0,
                          num_inline_slots=slots, inline_tokens=inline_tokens)
    return SimpleNamespace(limits=ServiceLimits(), context_len=8192,
                           engine=SimpleNamespace(config=cfg, num_pages=num_pages))


def test_a_request_the_whole_pool_cannot_hold_is_400_before_it_runs():
    """small.yaml's pool (4 pages of 512): 1000 prompt tokens + 200 for n=4 choices needs 9 pages
    (each choice its own 688-token tail); it used to run and end 200 with every choice "error"."""
    from edge_runtime.service.generate import _check_pool

    state = _pool_state()
    req = parse_completion({"prompt": [1] * 1000, "max_tokens": 200, "n": 4}, 512)
    with pytest.raises(ApiError) as e:
        _check_pool(state, 1000, req)
    assert (e.value.status, e.value.code, e.value.param) == (400, "context_length_exceeded", "n")
    assert "needs up to 9 KV pages of 512 tokens" in e.value.message
    assert "pool of 4; lower max_tokens or n" in e.value.message
    _check_pool(state, 1000, parse_completion({"prompt": [1], "max_tokens": 200}, 512))
    _check_pool(state, 1000, parse_completion({"prompt": [1], "max_tokens": 100, "n": 2}, 512))
    too_long = parse_completion({"prompt": [1], "max_completion_tokens": 1200}, 512 * 4)
    with pytest.raises(ApiError) as e:
        _check_pool(state, 1000, too_long)
    assert e.value.param == "max_completion_tokens"
    # tails short enough for the inline slots do not need a page each
    _check_pool(_pool_state(num_pages=2), 512, parse_completion(
        {"prompt": [1], "max_tokens": 100, "n": 8}, 512))


def test_a_request_that_ran_out_of_pool_gets_an_error_message():
    """Out of pool mid-generation: 503 memory_pressure when not streaming; when streaming, the
    finish chunks ("error") are followed by an SSE error event, then [DONE]."""
    import asyncio
    import json

    from aiohttp.test_utils import TestClient, TestServer

    from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent
    from edge_runtime.service.app import ServiceState, build_app

    why = "the KV pool cannot hold this request (no page left)"

    class FailingEngine:
        failure = None

        async def stream(self, prompt_ids, params, request_id):
            result = GenerationResult(request_id, len(prompt_ids), 0,
                                      [Completion("ab", [5, 6], "error")], error=why)
            yield TokenEvent(request_id, 0, [5, 6], "ab")
            yield TokenEvent(request_id, 0, [], "", result=result)

    state = ServiceState(ServiceLimits(), "m")
    model = SimpleNamespace(tokenizer=None, config=SimpleNamespace(max_position_embeddings=64,
                                                                    vocab_size=10))
    state.set_ready(model, _pool_state().engine, FailingEngine(), None)
    body = {"prompt": [1, 2, 3], "max_tokens": 4}

    async def main():
        async with TestClient(TestServer(build_app(state))) as c:
            plain = await c.post("/v1/completions", json=body)
            streamed = await c.post("/v1/completions", json=dict(body, stream=True))
            return plain.status, await plain.json(), await streamed.text()

    status, plain, streamed = asyncio.run(main())
    assert status == 503 and plain["error"]["code"] == "memory_pressure"
    assert plain["error"]["message"].startswith(why) and "lower max_tokens" in plain["error"]["message"]
    events = [e[len("data: "):] for e in streamed.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    finish, error = json.loads(events[-3]), json.loads(events[-2])
    assert finish["choices"][0]["finish_reason"] == "error"
    assert error["error"]["code"] == "memory_pressure" and error["error"]["message"].startswith(why)


BODY = b'{"prompt": [1, 2, 3], "max_tokens": 4}'


def _send_headers_and_part_of_the_body(sock: str):
    """A client that sends its headers and half its body, then stalls. `Expect: 100-continue`
    tells when the handler has started: aiohttp answers it just before calling the handler."""
    from service_helpers import post_bytes, raw_connect

    conn = raw_connect(sock)
    request = post_bytes("/v1/completions", BODY, "Expect: 100-continue\r\n")
    head = request[:request.index(b"\r\n\r\n") + 4]
    conn.sendall(head)
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):
        byte = conn.recv(1)
        assert byte, f"closed before the interim response: {interim!r}"
        interim += byte
    assert interim.startswith(b"HTTP/1.1 100"), interim
    conn.sendall(BODY[:len(BODY) // 2])
    return conn


def test_a_stalled_body_holds_no_request_slot_and_gets_408(tmp_path, caplog):
    """Requests were counted in flight before their body was read, with no timeout: clients that
    stalled mid-body held every slot and all others got 429 for as long as they stayed."""
    from service_helpers import app_on_unix_socket, client, read_response, stub_state

    state = stub_state(max_concurrent_sequences=1, max_queue=1, body_timeout_s=2.0)
    with app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock:
        stalled = [_send_headers_and_part_of_the_body(sock) for _ in range(3)]
        assert state.in_flight == 0
        with client(sock) as c:
            ok = c.post("/v1/completions", content=BODY)
            assert ok.status_code == 200, ok.text
            assert ok.json()["choices"][0]["text"] == "ab"
        for conn in stalled:  # each gets its 408 once body_timeout_s has passed
            status, headers, body = read_response(conn)
            assert status == 408 and headers["connection"] == "close", (status, headers)
            error = json.loads(body)["error"]
            assert error["code"] == "body_timeout" and "service.body_timeout_s" in error["message"]
            conn.close()
        with client(sock) as c:  # still serving
            assert c.post("/v1/completions", content=BODY).status_code == 200
    assert state.in_flight == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class _LeavesAfterLastToken:
    """Stand-in AsyncEngine: one token event, then (once the test's client has read it and
    closed its connection) the final event; the handler's closing writes meet a closed peer."""

    failure = None

    def __init__(self, client_closed):
        self.client_closed = client_closed  # threading.Event set by the test

    async def stream(self, prompt_ids, params, request_id):
        from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent

        yield TokenEvent(request_id, 0, [5, 6], "ab")
        assert self.client_closed.wait(30)  # blocks the server loop: it sees the close later
        result = GenerationResult(request_id, len(prompt_ids), 0,
                                  [Completion("ab", [5, 6], "stop")])
        yield TokenEvent(request_id, 0, [], "", result=result)

    async def cancel(self, request_id):
        raise AssertionError(f"a served request was cancelled: {request_id}")


@pytest.mark.parametrize("usage", [False, True])
def test_a_client_gone_after_the_last_token_is_a_served_request(tmp_path, caplog, usage):
    """The closing writes raised once the client had left: an ERROR with a traceback, counted 500."""
    import threading

    from service_helpers import app_on_unix_socket, client, post_bytes, raw_connect, stub_state

    closed = threading.Event()
    state = stub_state()
    state.aengine = _LeavesAfterLastToken(closed)
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 4, "stream": True,
                       "stream_options": {"include_usage": usage}}).encode()
    caplog.set_level(logging.INFO)
    with app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock:
        conn = raw_connect(sock, timeout=30)
        conn.sendall(post_bytes("/v1/completions", body))
        seen = b""
        while b'"text":"ab"' not in seen:
            part = conn.recv(65536)
            assert part, seen
            seen += part
        conn.close()
        closed.set()
        with client(sock) as c:
            assert c.get("/health").status_code == 200
            stats = c.get("/v1/stats").json()["service"]
    requests = {(r["endpoint"], r["status"]): r["count"] for r in stats["requests"]}
    assert requests[("/v1/completions", 200)] == 1, requests
    assert stats["cancelled"] == 0 and stats["in_flight"] == 0 and stats["tokens_out"] == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert any("after the last token" in r.getMessage() and r.levelno == logging.INFO
               for r in caplog.records)


def test_in_flight_is_running_plus_queued_plus_outside_engine(tmp_path, monkeypatch):
    """/metrics showed requests in flight that were neither running nor queued (a request being
    tokenized, or answered after the engine, is in neither), and counted sequences, not requests.
    Now: one request running (n=2: two sequences, one request), two queued behind it
    (max_num_seqs 2), one held while it is tokenized."""
    import threading
    import time

    from service_helpers import app_on_unix_socket, client, tiny_engine_state

    from edge_runtime.service import generate

    tokenizing = threading.Event()
    release = threading.Event()
    encode = generate._encode

    def slow_encode(state, req):
        if req.prompt == (9, 9, 9):
            tokenizing.set()
            assert release.wait(60)
        return encode(state, req)

    monkeypatch.setattr(generate, "_encode", slow_encode)
    with tiny_engine_state(max_num_seqs=2) as state, \
            app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock, client(sock) as c:
        def post(body):
            with client(sock) as own:
                own.post("/v1/completions", json=dict(body, max_tokens=600, ignore_eos=True,
                                                      temperature=0.0))

        def start(body):
            thread = threading.Thread(target=post, args=(body,), daemon=True)
            thread.start()
            return thread

        def wait_stats(done):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                stats = c.get("/v1/stats").json()
                if done(stats):
                    break
            return stats

        threads = [start({"prompt": [1, 2, 3], "n": 2})]
        wait_stats(lambda s: s["engine"]["running"] == 2)  # both sequences: no free slot left
        threads += [start({"prompt": [4, 5, 6]}), start({"prompt": [7, 8]}),
                    start({"prompt": [9, 9, 9]})]
        assert tokenizing.wait(60)
        # the two queued requests reach the engine's queue a moment after they count in flight
        svc = wait_stats(lambda s: s["service"]["in_flight"] == 4
                         and s["service"]["outside_engine"] == 1)["service"]
        assert (svc["in_flight"], svc["running"], svc["queued"], svc["outside_engine"]) \
            == (4, 1, 2, 1), svc
        text = c.get("/metrics").text
        assert "edge_service_outside_engine 1" in text and "edge_service_running 1" in text
        release.set()
        for t in threads:
            t.join(120)
        svc = c.get("/v1/stats").json()["service"]
        assert (svc["in_flight"], svc["running"], svc["queued"], svc["outside_engine"]) \
            == (0, 0, 0, 0), svc


def test_a_tiny_temperature_is_greedy_end_to_end(tmp_path):
    """temperature 1e-300 was accepted and became 0 in the sampler's float32 tensor: NaN logits,
    the same token every step. Now it is greedy: the tokens of temperature 0, whatever the seed."""
    from service_helpers import app_on_unix_socket, client, tiny_engine_state

    body = {"prompt": [11, 12, 13, 14], "max_tokens": 8, "ignore_eos": True}
    with tiny_engine_state() as state, \
            app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock, client(sock) as c:
        def tokens(**extra):
            r = c.post("/v1/completions", json=dict(body, **extra))
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        greedy = tokens(temperature=0)
        assert tokens(temperature=1e-300, seed=1) == tokens(temperature=5e-324, seed=2) == greedy
        assert len(set(state.tokenizer.encode(greedy, add_special_tokens=False))) > 1
