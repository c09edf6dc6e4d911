"""WATCHDOG=1 follows the engine loop: pings while it steps or idles, none while a step hangs."""

from __future__ import annotations

import asyncio
import socket
import threading
from types import SimpleNamespace

from edge_runtime.service.app import ServiceState
from edge_runtime.service_limits import ServiceLimits
from edge_runtime.service.sd_notify import SystemdNotifier
from edge_runtime.service.server import Loaded, Server, engine_alive


def test_engine_alive_rule():
    assert engine_alive(5, 6, busy=True)  # stepped since last check
    assert not engine_alive(6, 6, busy=True)  # busy but no step finished: hung
    assert engine_alive(6, 6, busy=False)  # idle


class _Engine:
    """Stand-in with the two methods the watchdog reads; `stats` blocks like a hung step would
    (the real Engine.stats takes the lock that a running step holds)."""

    def __init__(self, hung: bool):
        self.steps = 0
        self.release = threading.Event()
        if not hung:
            self.release.set()

    def stats(self):
        self.release.wait()
        self.steps += 1
        return {"steps": self.steps}

    def has_unfinished(self):
        return True


def _pings(tmp_path, engine, wait_for_first: bool, loop_failure=None) -> int:
    path = str(tmp_path / "notify")
    recv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    recv.bind(path)
    recv.settimeout(10 if wait_for_first else 0.6)
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    state = ServiceState(ServiceLimits(), "m")
    state.aengine = SimpleNamespace(failure=loop_failure)
    server = Server(state, None, None, notifier)
    server.loaded = Loaded(None, engine, state.aengine, None, None)

    async def run():
        task = asyncio.ensure_future(server._watchdog())
        got = await asyncio.to_thread(_recv_all, recv)
        task.cancel()
        engine.release.set()
        return got

    return asyncio.run(run())


def _recv_all(recv) -> int:
    n = 0
    try:
        while n < 3:
            assert recv.recv(64) == b"WATCHDOG=1"
            n += 1
    except socket.timeout:
        pass
    return n


def test_pings_while_the_engine_steps(tmp_path):
    assert _pings(tmp_path, _Engine(hung=False), wait_for_first=True) == 3


def test_no_ping_while_a_step_hangs(tmp_path):
    assert _pings(tmp_path, _Engine(hung=True), wait_for_first=False) == 0


class _IdleEngine(_Engine):
    def has_unfinished(self):
        return False


def test_no_ping_once_the_engine_loop_died(tmp_path):
    """A dead loop thread leaves the Engine idle (nothing runs, nothing is queued): the pings must
    follow the loop, not the Engine, or systemd never restarts the service."""
    assert _pings(tmp_path, _IdleEngine(hung=False), wait_for_first=True) == 3
    dead = ValueError("Overflow when unpacking long long")
    (tmp_path / "dead").mkdir()
    assert _pings(tmp_path / "dead", _IdleEngine(hung=False), wait_for_first=False,
                  loop_failure=dead) == 0
