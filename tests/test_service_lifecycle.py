"""Service lifecycle with a real child server (tiny random Llama) started as systemd would: socket
activation with a listening socket passed as fd 3, notifications on a real datagram NOTIFY_SOCKET,
watchdog pings, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading

import pytest

from bench_helpers import make_tiny_llama
from service_helpers import client, start_server, stop_server, wait_ready, write_config

from edge_runtime.import_path import code_argv

# Sets what systemd sets for an activated service, in the process that then becomes the server:
# LISTEN_PID must be the server's own pid, which exec keeps.
WRAPPER = ("import os, sys; fd = int(sys.argv[1]); os.dup2(fd, 3); os.close(fd); "
           "os.environ.update(LISTEN_FDS='1', LISTEN_FDNAMES='api', LISTEN_PID=str(os.getpid())); "
           "from edge_runtime.import_path import module_argv; argv = module_argv('edge_runtime', *sys.argv[2:]); "
           "os.execv(argv[0], argv)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny")))


def _stream_in_thread(sock: str, body: dict, out: dict, first_chunk: threading.Event):
    def run():
        with client(sock) as c, c.stream("POST", "/v1/completions",
                                         json=dict(body, stream=True)) as r:
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first_chunk.set()
            out["events"] = events

    t = threading.Thread(target=run)
    t.start()
    return t


def _finish_reason(events: list[str]) -> str:
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]
            if json.loads(e)["choices"]][-1]


def _datagrams(sock: socket.socket) -> list[dict]:
    out = []
    sock.setblocking(False)
    while True:
        try:
            data = sock.recv(4096).decode()
        except BlockingIOError:
            return out
        out.append(dict(line.split("=", 1) for line in data.split("\n")))


def test_activation_notify_watchdog_and_abort_at_deadline(tmp_path, tiny):
    """As under systemd: listening socket on fd 3, NOTIFY_SOCKET, WATCHDOG_USEC; SIGTERM with a
    0 s deadline aborts the in-flight request (the draining path that finishes requests is
    tests/test_service.py::test_sigterm_finishes_in_flight_request_then_exits_0)."""
    notify_path = str(tmp_path / "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    path = str(tmp_path / "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # what systemd's .socket unit does
    listener.bind(path)
    listener.listen(64)
    not_used = str(tmp_path / "config-socket.sock")
    config = write_config(tmp_path / "b.yaml", {"socket": not_used, "shutdown_deadline_s": 0,
                                                 "max_tokens": 2000},
                          {"enabled": True, "poll_interval_s": 0.2})
    fd = listener.fileno()
    proc = start_server(path, config, tiny, {"NOTIFY_SOCKET": notify_path,
                                             "WATCHDOG_USEC": "1000000"},
                        argv_prefix=code_argv(WRAPPER, str(fd)),
                        pass_fds=(fd,), socket_arg=False)
    try:
        wait_ready(proc, path)
        with client(path) as c:
            metrics = c.get("/metrics").text
        assert 'edge_guard_state{state="ok",source="proc-meminfo' in metrics
        out, first = {}, threading.Event()
        t = _stream_in_thread(path, {"prompt": "abc", "max_tokens": 1900, "ignore_eos": True},
                              out, first)
        assert first.wait(60)
        proc.send_signal(signal.SIGTERM)  # deadline 0: the in-flight request is aborted
        t.join(120)
        code, log = stop_server(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log
    assert _finish_reason(out["events"]) == "cancelled"
    msgs = _datagrams(notify)
    keys = [k for m in msgs for k in m]
    assert "EXTEND_TIMEOUT_USEC" in keys and "WATCHDOG" in keys
    ready = next(m for m in msgs if "READY" in m)
    assert ready["MAINPID"] == str(proc.pid) and ready["STATUS"].startswith("ready")
    assert keys.index("READY") < keys.index("WATCHDOG") < keys.index("STOPPING")
    assert not os.path.exists(not_used)  # the passed socket was used, not the configured path
    # systemd's copy keeps listening across service restarts: the kernel still queues clients
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.connect(path)
    probe.close()
    listener.close()
