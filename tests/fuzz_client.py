"""Seeded request generator and checking raw client for tests/test_service_fuzz.py.

`RequestFuzzer(seed)` makes chat and completion requests over every field of both schemas: valid
values (so requests get past the schema and run), wrong types and edge numbers, raw literals JSON
allows but Python does not take (5,000-digit integers, NaN, 1e999), lone surrogates, control-token
text, broken or compressed bodies, raw bytes and malformed HTTP. `exchange()` sends one over a new
connection (a Unix socket path, or a (host, port) on 127.0.0.1), may disconnect at a chosen point, and checks the answer: never 5xx, every
error JSON except aiohttp's documented text/plain 400 for requests its parser refuses, every
stream well formed up to `data: [DONE]`.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import socket
from dataclasses import dataclass

CHAT_FIELDS = ("messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p",
               "top_k", "n", "seed", "stop", "stream", "stream_options", "presence_penalty",
               "frequency_penalty", "logprobs", "top_logprobs", "logit_bias", "tools",
               "functions", "response_format", "ignore_eos", "repetition_penalty", "user")
COMPLETION_FIELDS = ("prompt", "model", "max_tokens", "max_completion_tokens", "temperature",
                     "top_p", "top_k", "n", "seed", "stop", "stream", "stream_options",
                     "presence_penalty", "frequency_penalty", "logprobs", "echo", "best_of",
                     "suffix", "logit_bias", "ignore_eos", "repetition_penalty", "user")
# values that reach the engine: every schema check passes with them
VALID = {
    "messages": [[{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b"}],
                 [{"role": "developer", "content": [{"type": "text", "text": "x"}]},
                  {"role": "user", "content": "é"}]],
    "prompt": ["hello", ["one"], [1, 2, 3], [5]],
    "max_tokens": [1, 2, 4], "max_completion_tokens": [1, 3], "temperature": [0, 0.7, 2, 1e-300],
    "top_p": [1, 0.5, 1e-9], "top_k": [-1, 0, 1, 2**31 - 1], "n": [1, 2, 3],
    "seed": [0, -1, 2**64 - 1, -(2**63)], "stop": ["\n", ["a", "b"]], "stream": [True, False],
    "stream_options": [{"include_usage": True}, {"include_usage": False}],
    "presence_penalty": [0, 1.5, -2], "frequency_penalty": [0.0, 0.5, 2], "logprobs": [False], "echo": [False],
    "best_of": [1], "suffix": [""], "logit_bias": [{}], "tools": [[]],
    "response_format": [{"type": "text"}], "ignore_eos": [True, False],
    "repetition_penalty": [1.0, 1e-9, 10], "model": ["m"], "user": ["u"],
}
ANY = [None, True, False, 0, 1, -1, 17, 0.5, -0.0, 1e-300, 5e-324, 1e308, -1e308, 2**63,
       2**64, 10**30, -(2**63) - 1, "", "x", "<|im_end|>", "\ud800", "\x00", [], {}, [1, -2],
       ["a", 5], {"a": 1}, [[[]]], [{"role": "user"}], [{"role": "user", "content": 5}],
       {"include_usage": "yes"}, ["a"] * 5, "9" * 50]
RAW_LITERALS = [b"9" * 5000, b"-" + b"7" * 4301, b"NaN", b"Infinity", b"-Infinity", b"1e999",
                b"1" * 4300]
BASES = {"chat": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
         "completion": {"prompt": [1, 2, 3], "max_tokens": 2}}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@dataclass
class Outcome:
    status: int | None  # None: the client left before the answer
    headers: dict
    body: bytes
    events: list  # SSE data payloads (JSON objects, or "[DONE]") of a stream answer


class RequestFuzzer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def body(self, kind: str) -> bytes:
        """A JSON body: a valid one with 0-4 fields changed (or removed), some as raw literals."""
        rng = self.rng
        body = dict(BASES[kind]) if rng.random() < 0.9 else {}
        fields = CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS
        raw = {}
        for key in rng.sample(fields, rng.randint(0, 4)):
            roll = rng.random()
            if roll < 0.45:
                body[key] = rng.choice(VALID.get(key, ANY))
            elif roll < 0.85:
                body[key] = rng.choice(ANY)
            elif roll < 0.93:
                body.pop(key, None)
            else:
                body[key] = f"@raw{len(raw)}@"
                raw[f'"@raw{len(raw)}@"'.encode()] = rng.choice(RAW_LITERALS)
        text = json.dumps(body).encode()
        for marker, literal in raw.items():
            text = text.replace(marker, literal)
        return text

    def request(self) -> tuple[str, bytes, bool]:
        """(kind, request bytes, whether it asks for a stream)."""
        rng = self.rng
        kind = rng.choice(["chat", "completion"])
        body, headers = self.body(kind), ""
        roll = rng.random()
        if roll < 0.05:
            body, headers = gzip.compress(body), "Content-Encoding: gzip\r\n"
        elif roll < 0.08:
            headers = "Content-Encoding: gzip\r\n"  # says gzip, is not
        elif roll < 0.10:
            headers = "Content-Encoding: br\r\n"
        elif roll < 0.17:
            body = self._mangled(body)
        elif roll < 0.20:
            return kind, self._malformed_http(body), False
        stream = b'"stream": true' in body
        return kind, http_request(PATHS[kind], body, headers), stream

    def _mangled(self, body: bytes) -> bytes:
        rng, data = self.rng, bytearray(body)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.3 and data:
                del data[rng.randrange(len(data)):]
            elif choice < 0.6 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            else:
                data[rng.randint(0, len(data)):0] = rng.randbytes(rng.randint(1, 8))
        return bytes(data)

    def _malformed_http(self, body: bytes) -> bytes:
        rng = self.rng
        return rng.choice([
            rng.randbytes(rng.randint(1, 64)) + b"\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + body,
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"zz\r\n" + body,
            b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1048577\r\n"
            b"Connection: close\r\n\r\n" + body,
            http_request("/v1/nowhere", body, ""),
            http_request("/v1/models", body, "").replace(b"POST", b"PUT", 1),
        ])


def http_request(path: str, body: bytes, headers: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\n{headers}Content-Length: {len(body)}\r\n\r\n").encode() + body


def with_header(request: bytes, line: str) -> bytes:
    """`request` with the header `line` after its request line (as is, if it has none)."""
    first, sep, rest = request.partition(b"\r\n")
    return first + sep + line.encode() + b"\r\n" + rest if sep else request


def exchange(address, request: bytes, leave_after: int | None = None,
             timeout: float = 30.0) -> Outcome:
    """Send `request` on a new connection and read the answer to the close. `leave_after`:
    close after sending that many bytes of the request (negative: after that many stream
    events, -1 being the first), without reading the rest."""
    if isinstance(address, tuple):
        assert address[0] == "127.0.0.1", address  # no traffic leaves the machine
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    else:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)  # a server that stops answering fails here
    conn.connect(address)
    try:
        if leave_after is not None and leave_after >= 0:
            conn.sendall(request[:leave_after])
            return Outcome(None, {}, b"", [])
        conn.sendall(request)
        unsent_body = _declared_length(request) > len(request.partition(b"\r\n\r\n")[2])
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
            if leave_after is not None and data.count(b"data: ") >= -leave_after:
                return Outcome(None, {}, data, [])
            if unsent_body and _whole_answer(data):
                # answered without the declared body: aiohttp then reads on for its lingering
                # time (10 s) before it closes, as it would for a client that keeps sending
                break
    except (BrokenPipeError, ConnectionResetError):  # the server closed first: its right
        return Outcome(None, {}, b"", [])
    finally:
        conn.close()
    return _parse(data)


def _declared_length(message: bytes) -> int:
    """The Content-Length of an HTTP message's head, -1 without one."""
    head = message.partition(b"\r\n\r\n")[0]
    found = re.search(rb"\r\ncontent-length: *(-?\d+)\r", head + b"\r", re.IGNORECASE)
    return int(found.group(1)) if found else -1


def _whole_answer(data: bytes) -> bool:
    """`data` holds an answer's head and all of its body (by Content-Length or the last chunk)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    if b"transfer-encoding: chunked" in head.lower():
        return body.endswith(b"0\r\n\r\n")
    return 0 <= _declared_length(data) <= len(body)


def _parse(data: bytes) -> Outcome:
    assert b"\r\n\r\n" in data, f"no complete answer: {data[:300]!r}"
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    events = []
    if headers.get("content-type", "").startswith("text/event-stream"):
        for block in body.decode().split("\n\n"):
            if block:
                assert block.startswith("data: "), block
                payload = block[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return Outcome(status, headers, body, events)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, data = data.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2:]


def check(outcome: Outcome, malformed_http: bool) -> None:
    """Raise AssertionError unless the answer is one the API documents."""
    if outcome.status is None:
        return
    status, headers = outcome.status, outcome.headers
    assert status < 500, (status, outcome.body[:500])
    json_body = headers.get("content-type", "").startswith("application/json")
    if status >= 400:
        if not json_body:  # only aiohttp's own answer to a request its parser refused
            assert malformed_http and status == 400, (status, headers, outcome.body[:300])
            return
        error = json.loads(outcome.body)["error"]
        assert set(error) == {"message", "type", "code", "param"} and error["message"], error
        return
    if outcome.events or headers.get("content-type", "").startswith("text/event-stream"):
        assert outcome.events and outcome.events[-1] == "[DONE]", outcome.events[-3:]
        for event in outcome.events[:-1]:
            assert "choices" in event or set(event["error"]) >= {"message", "code"}, event
        return
    assert json_body, headers
    json.loads(outcome.body)
