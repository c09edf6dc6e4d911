"""edge_runtime/voice/remote.py against sockets that are not a healthy `edge-runtime serve`: every
failure is a ServiceError naming the socket (the loop makes it a fault of that turn), never a
traceback and never a silently empty or truncated answer. Fake servers, no model: fast."""

from __future__ import annotations

import asyncio

import pytest

from edge_runtime.voice.remote import RemoteEngine, ServiceError

SSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
CHUNK = b'data: {"choices": [{"index": 0, "text": "hi", "finish_reason": null}]}\n\n'
DONE = b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


def _tokenizer(text, add_special_tokens=False):
    return {"input_ids": list(range(len(text)))}


async def _collect(sock: str, reply: bytes):
    async def handle(reader, writer):
        await reader.read(65536)
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=sock)
    try:
        return [ev async for ev in RemoteEngine(sock, _tokenizer).stream([1, 2, 3])]
    finally:
        server.close()


def _run(tmp_path, reply: bytes):
    return asyncio.run(_collect(str(tmp_path / "fake.sock"), reply))


def test_a_whole_answer_is_accepted(tmp_path):
    events = _run(tmp_path, SSE + CHUNK + DONE)
    assert events[0].text == "hi" and events[-1].result.completions[0].text == "hi"


@pytest.mark.parametrize("reply,expected", [
    (b"hello there\n", "did not answer in HTTP"),
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nhi",
     "answered with text/html, not an event stream"),
    (SSE + b"data: {not json\n\n", "not a JSON object: '{not json'"),
    (SSE + b"data: [1, 2]\n\n", "not a JSON object: '[1, 2]'"),
    (SSE + b"data: \xff\xfe\n\n", "not a JSON object"),
    (SSE + CHUNK, "closed the stream before the answer finished"),
    (SSE + CHUNK + b'data: {"error": {"message": "out of KV pages"}}\n\n', "out of KV pages"),
    (b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\n\xff\xfe!", "refused the request (404)"),
])
def test_a_bad_reply_is_a_service_error_naming_the_socket(tmp_path, reply, expected):
    with pytest.raises(ServiceError) as info:
        _run(tmp_path, reply)
    assert expected in str(info.value) and "fake.sock" in str(info.value)


def test_nothing_listening_is_a_service_error(tmp_path):
    async def go():
        engine = RemoteEngine(str(tmp_path / "no.sock"), _tokenizer, retry_window_s=0)
        return [ev async for ev in engine.stream([1])]

    with pytest.raises(ServiceError, match="cannot reach the service at .*no.sock"):
        asyncio.run(go())


BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}")


def test_a_service_loading_or_restarting_is_retried_until_it_answers(tmp_path):
    """503 + Retry-After (loading), then nothing listening (restart), then the answer: the command
    is answered, not lost."""
    sock = str(tmp_path / "svc.sock")
    replies = [BUSY]

    async def go():
        async def handle(reader, writer):
            await reader.read(65536)
            writer.write(replies.pop(0) if replies else SSE + CHUNK + DONE)
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(handle, path=sock)
        engine = RemoteEngine(sock, _tokenizer, retry_window_s=5)
        events = [ev async for ev in engine.stream([1])]  # one 503, then the answer
        server.close()
        await server.wait_closed()
        import os

        os.unlink(sock)

        async def come_back():
            await asyncio.sleep(0.7)
            return await asyncio.start_unix_server(handle, path=sock)

        back = asyncio.ensure_future(come_back())
        events += [ev async for ev in engine.stream([2])]  # nothing listening for 0.7 s
        (await back).close()
        return events, engine

    events, engine = asyncio.run(go())
    answers = [ev.result.completions[0].text for ev in events if ev.result is not None]
    assert answers == ["hi", "hi"] and engine.down_since is None


def test_retries_stop_after_the_window_and_later_turns_fail_at_once(tmp_path):
    import time

    async def go():
        engine = RemoteEngine(str(tmp_path / "no.sock"), _tokenizer, retry_window_s=0.6)
        for _ in range(2):
            start = time.monotonic()
            with pytest.raises(ServiceError, match="unavailable for .*retried for up to 1 s"):
                [ev async for ev in engine.stream([1])]
            yield time.monotonic() - start

    async def collect():
        return [t async for t in go()]

    first, second = asyncio.run(collect())
    assert 0.3 <= first < 5 and second < 0.3  # the outage is known: no second wait
