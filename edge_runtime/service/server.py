"""Run the service: bind (or receive) the sockets, load the model, notify systemd, drain on SIGTERM.

Lifecycle (each step is reported to systemd with STATUS=):
  socket listening (answers /health "loading") -> model load in a thread (EXTEND_TIMEOUT_USEC every
  few seconds) -> warm-up request -> READY=1 -> serving (WATCHDOG=1 while the engine loop makes
  progress; guard polling) -> SIGTERM/SIGINT: STOPPING=1, stop accepting, let in-flight requests
  finish until the deadline, cancel the rest, exit 0.

Invariants:
- The socket file is created with mode 0660 (umask set around bind, then chmod) and removed on
  exit unless it came from systemd (socket activation: systemd owns it and keeps listening).
  A path that cannot be bound (a symlink, a live socket, another file, an OS refusal) is a
  one-line ConfigError at start-up naming the flag, never a traceback.
- WATCHDOG=1 is sent only if the engine loop thread is alive and the engine is idle or its step
  counter moved since the last check, so a hung step or a dead loop stops the pings and systemd
  restarts the service. (A dead loop leaves the Engine looking idle: the loop's own state counts.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from aiohttp import web

from edge_runtime.errors import ConfigError
from edge_runtime.service.app import ServiceState, build_app
from edge_runtime.service.connections import check_descriptor_limit, start_listening
from edge_runtime.listen_address import describe
from edge_runtime.service.sd_notify import SystemdNotifier
from edge_runtime.engine.api import SamplingParams
from edge_runtime.guard.guard import run_guard_thread

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    """What the loader returns (built in edge_runtime/service/engine_setup.py)."""

    model: object  # LoadedModel
    engine: object  # Engine
    aengine: object  # AsyncEngine
    backends: dict | None
    guard: object | None  # MemoryGuard, or None when disabled


def bind_unix_socket(path: str, flag: str = "--socket", backlog: int = 1024) -> socket.socket:
    """A listening AF_UNIX socket at `path`, mode 0660; refuses to steal a live socket.

    Every OS error (a symlink in the way, a read-only or special file system, no permission) is a
    ConfigError naming `flag` and the path, which the CLI prints as one line."""
    where = f"{flag} {path}"
    _remove_stale_socket(path, where)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{where}: cannot bind ({_why(exc)}); choose another path") from None
    finally:
        os.umask(old)
    try:
        os.chmod(path, 0o660)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise ConfigError(f"{where}: bound, but cannot chmod 0660 and listen ({_why(exc)}); "
                          "choose another path") from None
    return sock


def _remove_stale_socket(path: str, where: str) -> None:
    """Unlink the socket file of a crashed run; refuse a live socket, a symlink, any other file."""
    if os.path.islink(path):  # bind() would not follow it: EADDRINUSE even when it dangles
        target = os.readlink(path)
        dangling = "" if os.path.exists(path) else ", which does not exist"
        raise ConfigError(f"{where} is a symbolic link (to {target}{dangling}); give the real "
                          "path of the socket, or remove the link")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"{where}: cannot inspect it ({_why(exc)}); choose another "
                          "path") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{where} exists and is not a socket; choose another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        raise ConfigError(f"{where}: another server is already listening on it")
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # stale socket of a crashed run
    except OSError as exc:
        raise ConfigError(f"{where}: cannot check whether a server listens on it "
                          f"({_why(exc)}); remove it or choose another path") from None
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"{where}: cannot remove the stale socket ({_why(exc)}); remove it or "
                          "choose another path") from None


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class Server:
    def __init__(self, state: ServiceState, socks: list[socket.socket],
                 loader: Callable[[], Loaded], notifier: SystemdNotifier | None = None,
                 owns_path: str | None = None) -> None:
        self.state = state
        self.socks = socks  # the Unix socket, then the TCP one when configured (listen.py)
        self.loader = loader
        self.notifier = notifier or SystemdNotifier()
        self.owns_path = owns_path  # socket file to unlink at exit (None under socket activation)
        self.stop_event: asyncio.Event | None = None
        self.loaded: Loaded | None = None
        self._guard_stop = threading.Event()

    async def run(self) -> int:
        self.stop_event = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        check_descriptor_limit(self.state.limits.max_connections)
        runner = web.AppRunner(build_app(self.state), handler_cancellation=True, access_log=None)
        await runner.setup()
        sites = await start_listening(runner, self.socks, self.state)
        where = " and ".join(describe(sock) for sock in self.socks)
        _say(f"listening on {where} (loading model...)")
        try:
            if not await self._load():
                return 0
            await self._serve()
            await self._drain(sites)
        finally:
            await runner.cleanup()
            self._close()
        return 0

    async def _load(self) -> bool:
        """Load + warm up; returns False if a stop signal arrived meanwhile."""
        self.notifier.status("loading model")
        task = asyncio.ensure_future(asyncio.to_thread(self.loader))
        t0 = time.monotonic()
        while not task.done():
            self.notifier.extend_timeout(30)
            await asyncio.wait([task], timeout=5)
            if self.stop_event.is_set():
                await asyncio.wait([task])  # a half-loaded model cannot be interrupted safely
                task.result()
                return False
        self.loaded = task.result()
        await self._warm_up()
        st = self.state
        st.guard = self.loaded.guard
        st.set_ready(self.loaded.model, self.loaded.engine, self.loaded.aengine,
                     self.loaded.backends)
        msg = f"ready: {st.model_name} in {time.monotonic() - t0:.1f} s"
        self.notifier.ready(msg)
        _say(msg)
        return not self.stop_event.is_set()

    async def _warm_up(self) -> None:
        self.notifier.status("warming up")
        tok = self.loaded.model.tokenizer
        ids = tok.encode("Hello", add_special_tokens=False) or [0]
        async for _ in self.loaded.aengine.stream(ids, SamplingParams(max_tokens=2)):
            pass

    async def _serve(self) -> None:
        if self.loaded.guard is not None:
            run_guard_thread(self.loaded.guard, self._guard_stop)
        watchdog = asyncio.ensure_future(self._watchdog())
        try:
            await self.stop_event.wait()
        finally:
            watchdog.cancel()

    async def _watchdog(self) -> None:
        if not self.notifier.watchdog_enabled:
            return
        period = self.notifier.watchdog_usec / 4e6
        last_steps = -1
        while True:
            # in a thread: a hung step holds the engine lock, and then this await never returns
            steps, busy = await asyncio.to_thread(_engine_progress, self.loaded.engine)
            failure = self.state.engine_failure()
            if failure is not None:
                log.error("%s: withholding WATCHDOG=1", failure)
            elif engine_alive(last_steps, steps, busy):
                self.notifier.watchdog_ping()
            else:
                log.error("engine made no progress for %.1f s: withholding WATCHDOG=1", period)
            last_steps = steps
            await asyncio.sleep(period)

    async def _drain(self, sites) -> None:
        st, deadline = self.state, self.state.limits.shutdown_deadline_s
        st.stopping = True
        self.notifier.stopping(f"stopping: {st.in_flight} requests in flight")
        _say(f"stopping: draining {st.in_flight} requests (deadline {deadline:g} s)")
        for site in sites:  # no new connections; open ones get 503 "shutting_down"
            await site.stop()
        t_end = time.monotonic() + deadline
        while st.in_flight and time.monotonic() < t_end:
            await asyncio.sleep(0.05)
        if st.in_flight:
            log.warning("deadline passed: cancelling %d requests", len(st.active))
            for rid in list(st.active):
                await self.loaded.aengine.cancel(rid)
            t_end = time.monotonic() + 2.0
            while st.in_flight and time.monotonic() < t_end:
                await asyncio.sleep(0.05)
            for task in list(st.active.values()):
                task.cancel()

    def _close(self) -> None:
        self._guard_stop.set()
        if self.loaded is not None:
            close = getattr(self.loaded.aengine, "close", None) or getattr(
                self.loaded.aengine, "shutdown", None)
            if close is not None:
                result = close()
                assert not asyncio.iscoroutine(result), "AsyncEngine.close must be synchronous"
        if self.owns_path and os.path.exists(self.owns_path):
            os.unlink(self.owns_path)
        self.notifier.close()


def engine_alive(last_steps: int, steps: int, busy: bool) -> bool:
    """The engine loop is healthy if it has nothing to do or finished a step since last check."""
    return not busy or steps != last_steps


def _engine_progress(engine) -> tuple[int, bool]:
    stats = engine.stats()
    steps = int(stats.get("steps", 0))
    busy = bool(engine.has_unfinished())
    return steps, busy


def _say(msg: str) -> None:
    print(f"edge-runtime serve: {msg}", file=sys.stderr, flush=True)
