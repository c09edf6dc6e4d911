"""The Wyoming listener: TCP connections -> voice/wyoming_connection.py's `Connection`s.

Invariants:
- At most `wyoming.max_connections` connections are open. A newcomer past the cap closes the
  connection idle longest (no request being answered, no audio stream open; an `error` event tells
  it why), so idle sockets cannot lock the satellites out; only when every open connection is busy
  is the newcomer closed at once with an `error` event (`server-full`).
- A connection that sends nothing for `wyoming.idle_timeout_s` while nothing of it is being
  answered is closed (Connection's read loop).
- `stop()` closes the listener and every connection and waits for their tasks, so nothing of the
  server outlives it (a turn being answered is cancelled in the engine).
Wyoming has no authentication: the address is loopback unless one is named
(voice/wyoming_config.py), and docs/voice.md says what another address exposes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from edge_runtime.voice.wyoming_connection import Connection
from edge_runtime.voice.wyoming_framing import MAX_HEADER_BYTES
from edge_runtime.voice.wyoming_shared import WyomingShared

log = logging.getLogger(__name__)
ACCEPT_BACKLOG = 128


class WyomingServer:
    def __init__(self, shared: WyomingShared, host: str, port: int):
        self.shared = shared
        self.host = host
        self.port = port
        self.connections: dict[Connection, asyncio.Task] = {}
        self.counters = {"accepted": 0, "closed_for_room": 0, "refused": 0}
        self._ids = itertools.count()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> tuple[str, int]:
        """Listen; -> the bound (host, port) (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port,
                                                  limit=MAX_HEADER_BYTES, backlog=ACCEPT_BACKLOG)
        return self._server.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        tasks = list(self.connections.values())
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)
        if self._server is not None:
            await self._server.wait_closed()

    def stats(self) -> dict:
        return {"open": len(self.connections), **self.counters}

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer_name(writer)
        conn = Connection(self.shared, next(self._ids), reader, writer, peer)
        self.counters["accepted"] += 1
        cap = self.shared.config.max_connections
        victim = None
        if len(self.connections) >= cap:
            victim = self._idle_longest()
            if victim is None:
                self.counters["refused"] += 1
                log.warning("wyoming: refused %s: all %d connections are busy", peer, cap)
                await conn.fail(f"server full: all {cap} connections (wyoming.max_connections) "
                                "are busy; try again shortly", "server-full")
                return
            self.counters["closed_for_room"] += 1
            del self.connections[victim]
        # counted before any await: a newcomer accepted meanwhile sees this one's place taken
        self.connections[conn] = asyncio.current_task()
        try:
            if victim is not None:
                idle_s = time.monotonic() - victim.last_event
                await victim.fail(f"closed to make room for a new connection: {cap} connections "
                                  f"(wyoming.max_connections) are open and this one was idle "
                                  f"longest ({idle_s:.0f} s)", "server-full")
            await conn.run()
        finally:
            self.connections.pop(conn, None)

    def _idle_longest(self) -> Connection | None:
        idle = [c for c in self.connections if not c.active]
        return min(idle, key=lambda c: c.last_event) if idle else None


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
