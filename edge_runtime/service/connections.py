"""Open connections: a cap, an idle timeout, and accept errors logged once per interval.

aiohttp keeps a connection that never sends a request for an hour (keepalive_timeout 3,630 s) and
caps nothing: about 1,100 such connections used up the process's 1,024 descriptors, /health timed
out, and asyncio logged every failed accept() with a traceback.

Invariants:
- At most `service.max_connections` connections are open, counted over every listener (the
  Unix socket and the optional TCP one share one ConnectionLimiter). One more closes the
  connection idle longest first: idle means no request of it is being handled (it waits for its
  first request or the next keep-alive one, is still sending headers, or is sending a request
  body, which holds no request slot yet). Only when every open connection is handling a request is the new one closed
  at once (`connections_refused`). ServiceLimits keeps the cap above `max_in_flight`, so /health
  and /metrics can still connect while every request slot is taken.
- A connection idle for `service.idle_timeout_s` is closed: aiohttp's keepalive_timeout (app.py),
  which also runs from the moment a connection opens and while its headers arrive.
- asyncio's accept loop reports a failed accept() (EMFILE, ENFILE, ENOBUFS, ENOMEM) to the loop's
  exception handler and schedules a retry a second later, for each of up to `backlog` failures
  per pass (so thousands a second); `AcceptErrorLog` counts each (`accept_errors`) and logs at
  most one WARNING line per interval, without a traceback. Retries that fire after the listener
  closed (shutdown) raise ValueError in asyncio's callback: logged at DEBUG. The process's descriptor limit
  is checked at start-up against the cap (`check_descriptor_limit`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time

from aiohttp import web

from edge_runtime.errors import ConfigError

log = logging.getLogger(__name__)
# asyncio accepts up to `backlog` connections per event-loop pass, each a new descriptor, before
# any of them can close an idle one: the burst is bounded by this (also the listen backlog).
ACCEPT_BACKLOG = 128
# Descriptors the process needs besides its connections: an accept burst and the connections it
# closes (closed on the next pass), model files, the listening and notify sockets, event fds,
# thread pools, and on a Jetson the GPU's /dev/nv* nodes.
RESERVED_DESCRIPTORS = 2 * ACCEPT_BACKLOG + 256
ACCEPT_ERROR_LOG_INTERVAL_S = 10.0
_ACCEPT_FAILED = "socket.accept() out of system resource"


class ConnectionLimiter:
    """Counts the open connections of the listeners and closes the idle-longest past the cap.
    Only the event loop thread uses it."""

    def __init__(self, server: web.Server, max_connections: int, metrics) -> None:
        self.server = server  # aiohttp's low-level server: the protocol factory
        self.max_connections = max_connections
        self.metrics = metrics
        self._idle_since: dict[object, float | None] = {}  # handler -> idle since (None: busy)

    @property
    def num_open(self) -> int:
        return len(self._idle_since)

    def protocol(self) -> asyncio.Protocol:
        """The protocol factory for loop.create_server."""
        return _Tracked(self.server(), self)

    def opened(self, tracked: "_Tracked") -> bool:
        """A connection arrived; False if it must be closed at once (every open one is busy)."""
        if len(self._idle_since) >= self.max_connections and not self._close_idle_longest():
            self.metrics.connections_refused += 1
            return False
        self._idle_since[tracked.handler] = time.monotonic()
        return True

    def closed(self, handler) -> None:
        self._idle_since.pop(handler, None)

    def busy(self, handler) -> None:
        if handler in self._idle_since:
            self._idle_since[handler] = None

    def idle(self, handler) -> None:
        if handler in self._idle_since:
            self._idle_since[handler] = time.monotonic()

    def _close_idle_longest(self) -> bool:
        idle = [(since, i, handler) for i, (handler, since) in enumerate(self._idle_since.items())
                if since is not None]
        if not idle:
            return False
        handler = min(idle, key=lambda entry: entry[:2])[2]
        self._idle_since.pop(handler)  # its connection_lost comes later
        handler.force_close()
        self.metrics.connections_evicted += 1
        return True


class _Tracked(asyncio.Protocol):
    """aiohttp's RequestHandler, with its connection counted by a ConnectionLimiter."""

    def __init__(self, handler, limiter: ConnectionLimiter) -> None:
        self.handler, self.limiter = handler, limiter
        self.admitted = False

    def connection_made(self, transport) -> None:
        self.admitted = self.limiter.opened(self)
        if self.admitted:
            self.handler.connection_made(transport)
        else:
            transport.abort()

    def connection_lost(self, exc) -> None:
        if self.admitted:
            self.limiter.closed(self.handler)
            self.handler.connection_lost(exc)

    def data_received(self, data) -> None:
        self.handler.data_received(data)

    def eof_received(self):
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


class LimitedSockSite(web.SockSite):
    """web.SockSite whose connections go through a ConnectionLimiter."""

    def __init__(self, runner: web.BaseRunner, sock, limiter: ConnectionLimiter,
                 backlog: int = ACCEPT_BACKLOG) -> None:
        super().__init__(runner, sock, backlog=backlog)
        self.limiter = limiter

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.limiter.protocol, sock=self._sock,
                                                backlog=self._backlog)


async def start_listening(runner: web.BaseRunner, socks: list, state,
                          backlog: int = ACCEPT_BACKLOG) -> list[LimitedSockSite]:
    """Serve `runner` on each listening socket of `socks` (the Unix socket, and the TCP one when
    configured) under one `state.limits.max_connections` cap shared by all of them, with accept
    errors rate-limited on this event loop; `state.connections` is the limiter."""
    asyncio.get_running_loop().set_exception_handler(AcceptErrorLog(state.metrics))
    state.connections = ConnectionLimiter(runner.server, state.limits.max_connections,
                                          state.metrics)
    sites = []
    for sock in socks:
        site = LimitedSockSite(runner, sock, state.connections, backlog=backlog)
        await site.start()
        sites.append(site)
    return sites


class AcceptErrorLog:
    """The event loop's exception handler: failed accept() calls counted, logged once per
    interval; every other report goes to asyncio's default handler."""

    def __init__(self, metrics, interval_s: float = ACCEPT_ERROR_LOG_INTERVAL_S) -> None:
        self.metrics, self.interval_s = metrics, interval_s
        self._logged_at: float | None = None
        self._since_logged = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if _stale_accept_retry(context):  # one per failed accept() of the last second: quiet
            log.debug("accept() was paused after a failure when the listener closed: nothing lost")
            return
        if context.get("message") != _ACCEPT_FAILED:
            loop.default_exception_handler(context)
            return
        self.metrics.accept_errors += 1
        self._since_logged += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= self.interval_s:
            exc = context.get("exception")
            log.warning("accept() failed %d time(s) in the last %g s (%s); new connections wait "
                        "in the backlog. Lower service.max_connections or raise the descriptor "
                        "limit (LimitNOFILE)", self._since_logged, self.interval_s,
                        exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
            self._logged_at, self._since_logged = now, 0


def _stale_accept_retry(context: dict) -> bool:
    """asyncio re-arms accept() a second after a failure even when the listening socket has
    closed since (shutdown): its callback raises ValueError("Invalid file descriptor: -1")."""
    return isinstance(context.get("exception"), ValueError) \
        and "_start_serving" in repr(context.get("handle"))


def check_descriptor_limit(max_connections: int) -> None:
    """Raise the soft RLIMIT_NOFILE up to the hard one if the cap needs it; a ConfigError if even
    the hard limit is too low."""
    needed = max_connections + RESERVED_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ConfigError(f"service.max_connections ({max_connections}) + {RESERVED_DESCRIPTORS} "
                          f"descriptors for the rest of the process need an open-file limit of "
                          f"{needed}, above this process's hard limit of {hard}; lower "
                          "service.max_connections or raise LimitNOFILE (ulimit -n)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
