"""bench.http_client against a tiny local OpenAI-compatible aiohttp server (TCP and Unix socket)."""

import asyncio
import json
import random

import pytest
from aiohttp import web

from edge_runtime.bench.http_client import OpenAIChatBackend, TargetError, parse_sse_line, parse_target
from edge_runtime.errors import InputError


def _make_app(words, send_usage, seen):
    async def chat(request):
        body = await request.json()
        seen.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = min(body["max_tokens"], len(words))
        for i, w in enumerate(words[:n]):
            chunk = {"choices": [{"index": 0, "delta": {"content": w},
                                  "finish_reason": "length" if i == n - 1 else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if send_usage:
            usage = {"prompt_tokens": 17, "completion_tokens": n,
                     "prompt_tokens_details": {"cached_tokens": 11}}
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def broken(request):
        return web.Response(status=503, text="overloaded")

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "tiny-model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/bad/v1/chat/completions", broken)
    app.router.add_get("/v1/models", models)
    return app


async def _serve_and_call(app, target_of, messages, max_tokens):
    runner = web.AppRunner(app)
    await runner.setup()
    site, target = target_of(runner)
    await site.start()
    backend = OpenAIChatBackend(target(site))
    try:
        return await backend.complete("0", messages, max_tokens)
    finally:
        await backend.close()
        await runner.cleanup()


def _tcp(runner):
    site = web.TCPSite(runner, "127.0.0.1", 0)
    return site, lambda s: f"http://127.0.0.1:{s._server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("send_usage", [True, False])
def test_stream_over_tcp(send_usage):
    rng = random.Random(3)
    words = [f"w{rng.randint(0, 999)} " for _ in range(9)]
    seen = []
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "turn on"}]
    out = asyncio.run(_serve_and_call(_make_app(words, send_usage, seen), _tcp, msgs, 6))
    assert out.text == "".join(words[:6])
    assert out.output_tokens == 6 and out.finish_reason == "length"
    assert out.first_token_t is not None and out.first_token_t <= out.end_t
    assert (out.prompt_tokens, out.cached_prompt_tokens) == ((17, 11) if send_usage else (None, None))
    assert seen[0]["messages"] == msgs and seen[0]["stream"] is True
    assert seen[0]["temperature"] == 0.0 and seen[0]["max_tokens"] == 6
    assert seen[0]["model"] == "tiny-model"  # from GET /v1/models


def test_stream_over_unix_socket(tmp_path):
    path = str(tmp_path / "s.sock")

    def unix(runner):
        return web.UnixSite(runner, path), lambda s: f"unix:{path}"

    out = asyncio.run(_serve_and_call(_make_app(["a", "b", "c"], True, []), unix,
                                      [{"role": "user", "content": "x"}], 8))
    assert out.text == "abc" and out.output_tokens == 3


def test_http_error_and_unreachable():
    def bad(runner):
        site, url = _tcp(runner)
        return site, lambda s: url(s) + "/bad"

    with pytest.raises(TargetError, match="HTTP 503"):
        asyncio.run(_serve_and_call(_make_app([], False, []), bad, [], 1))
    async def unreachable():
        backend = OpenAIChatBackend("unix:/nonexistent/edge.sock")
        try:
            await backend.complete("0", [], 1)
        finally:
            await backend.close()

    with pytest.raises(TargetError, match="cannot reach"):
        asyncio.run(unreachable())


def test_parse_helpers():
    assert parse_target("unix:/run/a.sock") == ("/run/a.sock", "http://localhost")
    assert parse_target("http://127.0.0.1:8080/") == (None, "http://127.0.0.1:8080")
    with pytest.raises(InputError):
        parse_target("ftp://x")
    assert parse_sse_line("data: [DONE]") is None and parse_sse_line(": ping") is None
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    with pytest.raises(TargetError):
        parse_sse_line("data: {oops")


def test_bench_trace_cli_against_target(tmp_path):
    """`bench trace --target URL` replays the whole trace through the client; history is carried."""
    import sys
    import threading
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_helpers import write_trace

    from edge_runtime.cli import main

    seen = []
    app = _make_app(["ok ", "done"], True, seen)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        trace = write_trace(tmp_path / "t.jsonl", streams=2, turns=3)
        out = tmp_path / "r.json"
        rc = main(["bench", "trace", "--trace", str(trace), "--target", f"http://127.0.0.1:{port}",
                   "--no-isolate", "--json", str(out)])
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert rc == 0
    data = json.loads(out.read_text())
    row = data["rows"][0]
    assert row["requests"] == 6 and row["output_tokens"] == 12 and row["cached_prompt_tokens"] == 66
    assert row["peak_kv_bytes"] is None and row["peak_rss_bytes"] is None  # remote: unknown here
    last = [b["messages"] for b in seen if len(b["messages"]) == 6]
    assert len(last) == 2 and all(m[2]["content"] == "ok done" for m in last)


def test_a_server_that_never_answers_is_a_target_error():
    """A listening socket that never replies: TargetError after the timeout, not a bare
    asyncio.TimeoutError traceback."""
    import socket

    async def silent():
        with socket.socket() as listener:  # accepts (kernel backlog) but never answers
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            backend = OpenAIChatBackend(f"http://127.0.0.1:{port}", model="m", timeout_s=0.5)
            try:
                await backend.complete("0", [{"role": "user", "content": "x"}], 1)
            finally:
                await backend.close()

    with pytest.raises(TargetError, match="did not answer within"):
        asyncio.run(silent())
