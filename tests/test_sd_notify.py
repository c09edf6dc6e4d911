"""sd_notify against a real AF_UNIX datagram socket (path and abstract namespace)."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from edge_runtime.service.sd_notify import SystemdNotifier


def _receiver(address):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


def _read(sock) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def test_path_socket_receives_each_message(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = _receiver(path)
    n = SystemdNotifier({"NOTIFY_SOCKET": path})
    assert n.enabled and not n.watchdog_enabled
    assert n.extend_timeout(90.5)
    assert _read(sock) == {"EXTEND_TIMEOUT_USEC": "90500000"}
    assert n.status("loading model\nsmollm2")
    assert _read(sock) == {"STATUS": "loading model smollm2"}
    assert n.ready("ready: 5 streams")
    assert _read(sock) == {"READY": "1", "STATUS": "ready: 5 streams", "MAINPID": str(os.getpid())}
    assert n.stopping()
    assert _read(sock) == {"STOPPING": "1"}
    n.close()
    sock.close()


def test_abstract_socket():
    name = f"edge-runtime-test-{uuid.uuid4().hex}"
    sock = _receiver(b"\0" + name.encode())
    n = SystemdNotifier({"NOTIFY_SOCKET": "@" + name})
    assert n.ready()
    assert _read(sock)["READY"] == "1"
    sock.close()


def test_watchdog_is_rate_limited_to_half_the_interval(tmp_path):
    path = str(tmp_path / "wd.sock")
    sock = _receiver(path)
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    n = SystemdNotifier(env)
    assert n.watchdog_enabled
    assert n.watchdog_ping(now=100.0)
    assert _read(sock) == {"WATCHDOG": "1"}
    assert not n.watchdog_ping(now=100.5)  # < 1 s (half of 2 s) since the last ping
    assert n.watchdog_ping(now=101.01)
    assert _read(sock) == {"WATCHDOG": "1"}
    sock.close()


def test_watchdog_for_another_pid_is_ignored(tmp_path):
    env = {"NOTIFY_SOCKET": str(tmp_path / "x"), "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}
    assert os.getpid() != 1
    assert not SystemdNotifier(env).watchdog_enabled


@pytest.mark.parametrize("value", ["", "relative/path", "vsock:2:5"])
def test_no_socket_means_no_op(value):
    n = SystemdNotifier({"NOTIFY_SOCKET": value} if value else {})
    assert not n.enabled
    assert not n.ready() and not n.watchdog_ping() and not n.stopping()
