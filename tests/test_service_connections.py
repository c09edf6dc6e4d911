"""Open connections (service/connections.py): 2,000 idle connections against a real `serve`
process held to the 1,024 descriptors of a default systemd service (on its Unix socket, and on
its TCP listener at 127.0.0.1 with API keys), the idle-longest closed past the cap, the idle
timeout, accept errors counted and logged once per interval."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import time

import pytest

from service_helpers import (app_on_unix_socket, client, raw_connect, read_response,
                             start_server, stop_server, stub_state, wait_ready)

from edge_runtime.import_path import code_argv

IDLE_CONNECTIONS = 2000


def _raise_own_descriptor_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files, the hard limit here is {hard}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith(name + " "))


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_2000_idle_connections_leave_health_and_chat_answering(tmp_path, transport):
    """About 1,100 connections that never sent a request used up the server's 1,024 descriptors:
    /health timed out and the log filled with accept() tracebacks. Over TCP (127.0.0.1, API
    keys) the same cap holds, shared with the Unix socket."""
    from engine_helpers import tiny_folder
    from service_helpers import tcp_address, write_keys

    _raise_own_descriptor_limit(IDLE_CONNECTIONS + 512)
    sock = str(tmp_path / "api.sock")
    extra, headers = (), None
    if transport == "tcp":
        key = "soak-" + "0123456789abcdef" * 2
        extra = ("--listen", "127.0.0.1:0", "--api-keys", str(write_keys(tmp_path / "k", key)))
        headers = {"Authorization": f"Bearer {key}"}
    proc = start_server(sock, None, str(tiny_folder()), max_open_files=1024, extra_args=extra)
    idle = []
    try:
        wait_ready(proc, sock)
        address = tcp_address(proc) if transport == "tcp" else sock
        for _ in range(IDLE_CONNECTIONS):  # connect and never send a byte
            idle.append(_connect_when_the_backlog_has_room(address))
        with client(address, timeout=30, headers=headers) as c:  # a hung server: the timeout
            assert c.get("/health").status_code == 200  # ready, or degraded by the guard
            chat = c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert chat.status_code == 200, chat.text
            assert chat.json()["usage"]["completion_tokens"] >= 1
            metrics = c.get("/metrics").text
        if transport == "tcp":
            with client(address, timeout=30) as c:
                assert c.get("/health").status_code == 401  # no key
            with client(sock, timeout=30) as c:
                assert c.get("/health").status_code == 200  # the Unix socket needs none
        assert _metric(metrics, "edge_service_connections_open") <= 256
        assert _metric(metrics, "edge_service_connections_evicted_total") \
            >= IDLE_CONNECTIONS - 256
        assert _metric(metrics, "edge_service_accept_errors_total") == 0
    finally:
        for conn in idle:
            conn.close()
        code, log = stop_server(proc)
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and len(log.splitlines()) < 300, log[-3000:]


def test_past_the_cap_the_idle_longest_goes_and_a_busy_one_stays(tmp_path):
    """max_connections 3 (one request slot): the connection handling a request survives any
    number of newcomers; idle ones are closed oldest first; /health always gets through."""
    import threading

    from service_helpers import post_bytes

    state = stub_state(max_connections=3, max_concurrent_sequences=1, max_queue=0)
    gate = threading.Event()
    stub = state.aengine

    class Held(type(stub)):
        async def stream(self, prompt_ids, params, request_id):
            while not gate.is_set():
                await asyncio.sleep(0.01)
            async for ev in stub.stream(prompt_ids, params, request_id):
                yield ev

    state.aengine = Held()
    with app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock:
        busy = raw_connect(sock, timeout=30)
        busy.sendall(post_bytes("/v1/completions", b'{"prompt": [1], "max_tokens": 2}'))
        _wait(lambda: state.in_flight == 1)
        first, second = raw_connect(sock), raw_connect(sock)
        _wait(lambda: state.connections.num_open == 3)
        third = raw_connect(sock)  # closes `first`, the idle-longest
        assert first.recv(1) == b""
        with client(sock, timeout=30) as c:  # closes `second`
            assert c.get("/health").status_code == 200
        assert second.recv(1) == b""
        gate.set()
        status, _, body = read_response(busy)
        assert status == 200 and json.loads(body)["choices"][0]["text"] == "ab"
        assert state.metrics.connections_evicted == 2 and state.metrics.connections_refused == 0
        for conn in (busy, third):
            conn.close()


def test_an_idle_connection_is_closed_after_idle_timeout_s(tmp_path):
    state = stub_state(idle_timeout_s=0.5)
    with app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock:
        silent = raw_connect(sock, timeout=30)
        half = raw_connect(sock, timeout=30)
        half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        t0 = time.monotonic()
        assert silent.recv(1) == b"" and half.recv(1) == b""  # closed, not left for an hour
        assert time.monotonic() - t0 < 20  # the safety net's order, not a measurement
        _wait(lambda: state.connections.num_open == 0)


def test_accept_errors_are_counted_and_logged_once_per_interval(caplog):
    from edge_runtime.service.connections import AcceptErrorLog
    from edge_runtime.service.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    handler = AcceptErrorLog(metrics, interval_s=3600)
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(handler)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        exc = OSError(24, "Too many open files")
        for _ in range(5000):  # what asyncio's accept loop reports on EMFILE
            loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                         "exception": exc, "socket": listener})
        loop.call_exception_handler({"message": "something else"})  # asyncio's own handling
        # the accept() retry asyncio schedules, firing after the listener closed (shutdown)
        retry = asyncio.Handle(loop._start_serving, (None, listener), loop)  # never run
        loop.call_exception_handler({"message": f"Exception in callback {retry!r}",
                                     "exception": ValueError("Invalid file descriptor: -1"),
                                     "handle": retry})
    finally:
        loop.close()
        listener.close()
    lines = [r for r in caplog.records if "accept() failed" in r.getMessage()]
    assert len(lines) == 1 and "Too many open files" in lines[0].getMessage()
    assert lines[0].levelno == logging.WARNING and not lines[0].exc_info
    assert metrics.accept_errors == 5000
    assert any(r.getMessage() == "something else" for r in caplog.records)
    assert not [r for r in caplog.records if "Invalid file descriptor" in r.getMessage()
                or (r.exc_info and isinstance(r.exc_info[1], ValueError))]


def test_a_cap_the_descriptor_limit_cannot_hold_is_refused_at_start():
    from edge_runtime.errors import ConfigError
    from edge_runtime.service.connections import RESERVED_DESCRIPTORS, check_descriptor_limit
    from edge_runtime.service_limits import ServiceLimits

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    with pytest.raises(ConfigError, match="service.max_connections .* LimitNOFILE"):
        check_descriptor_limit(hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)
    with pytest.raises(ConfigError, match="so that /health"):
        ServiceLimits(max_connections=40)  # 8 sequences + 32 queued take every connection
    assert ServiceLimits().max_connections + RESERVED_DESCRIPTORS <= 1024


def _wait(done, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _connect_when_the_backlog_has_room(address) -> socket.socket:
    """A Unix socket's connect() fails with EAGAIN while the listen backlog is full (TCP's waits
    and retries its SYN itself)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return raw_connect(address, timeout=30)
        except BlockingIOError:
            assert time.monotonic() < deadline, "the server stopped accepting"
            time.sleep(0.005)


_SERVER_OUT_OF_DESCRIPTORS = """
import logging, os, resource, sys, time
sys.path.insert(0, {tests!r})
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
from service_helpers import app_on_unix_socket, stub_state
state = stub_state(max_connections=5000)  # a cap this process's descriptors cannot hold
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, 20000))
with app_on_unix_socket(state, {sock!r}):
    print("listening", flush=True)
    sys.stdin.readline()
print("accept_errors", state.metrics.accept_errors, flush=True)
"""


def test_a_server_out_of_descriptors_logs_accept_errors_once_per_interval(tmp_path):
    """The real accept() failure path: asyncio reports EMFILE and retries every second; each
    report was an ERROR with a traceback (tens of thousands in the log)."""
    import subprocess

    from service_helpers import ROOT

    sock = str(tmp_path / "api.sock")
    code = _SERVER_OUT_OF_DESCRIPTORS.format(tests=str(ROOT / "tests"), sock=sock)
    proc = subprocess.Popen(code_argv(code), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    held = []
    try:
        assert proc.stdout.readline().strip() == "listening"
        for _ in range(120):  # the server runs out of descriptors after about 40
            try:
                held.append(raw_connect(sock, timeout=5))
            except BlockingIOError:  # the backlog is full: the server stopped accepting
                break
        time.sleep(3)  # asyncio retries accept() once a second
    finally:
        for conn in held:
            conn.close()
        out, _ = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, out[-3000:]
    errors = int(out.split("accept_errors")[1].split()[0])
    lines = [line for line in out.splitlines() if "accept() failed" in line]
    assert errors >= 2 and len(lines) == 1, out[-3000:]
    assert lines[0].startswith("WARNING") and "Too many open files" in lines[0]
    assert "Traceback" not in out and len(out.splitlines()) < 20, out[-3000:]
