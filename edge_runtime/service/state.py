"""The service's state, shared by every handler: limits, the engine once loaded, the accounting
of accepted requests, and what /health, /metrics and /v1/stats report. service/app.py keeps it
under `STATE_KEY` on the aiohttp application; the invariants it serves are in app.py's docstring.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from edge_runtime.service.accounting import InFlight, RequestBook, engine_requests, split
from edge_runtime.service_limits import ServiceLimits
from edge_runtime.service.metrics import ServiceMetrics

STATE_KEY = web.AppKey("edge_state", object)


class ServiceState:
    def __init__(self, limits: ServiceLimits, model_name: str, guard=None) -> None:
        self.limits = limits
        self.model_name = model_name
        self.guard = guard
        self.metrics = ServiceMetrics()
        self.status = "loading"
        self.reason = "loading model"
        self.created = int(time.time())
        self.book = RequestBook()  # accepted requests by phase
        self.stopping = False
        self.engine = None  # edge_runtime.engine.engine.Engine
        self.aengine = None  # edge_runtime.engine.async_engine.AsyncEngine
        self.tokenizer = None
        self.context_len = 0
        self.vocab_size = 0
        self.backends: dict | None = None
        self.active: dict[str, object] = {}  # request id -> handler task, for shutdown
        self.connections = None  # connections.ConnectionLimiter, once listening
        self.api_keys = None  # api_keys.ApiKeys the TCP listener requires, or None

    @property
    def in_flight(self) -> int:
        return len(self.book)

    def set_ready(self, loaded, engine, aengine, backends: dict | None) -> None:
        self.engine, self.aengine, self.tokenizer = engine, aengine, loaded.tokenizer
        self.context_len = loaded.config.max_position_embeddings
        self.vocab_size = loaded.config.vocab_size
        self.backends = backends
        self.status, self.reason = "ready", ""

    def health(self) -> tuple[int, dict]:
        if self.stopping:
            return 503, {"status": "stopping", "reason": "shutting down"}
        if self.status != "ready":
            return 503, {"status": self.status, "reason": self.reason}
        failure = self.engine_failure()
        if failure is not None:
            return 503, {"status": "failed", "reason": failure}
        guard = self.guard.snapshot() if self.guard else None
        if guard and guard.get("telemetry_error"):  # the guard is blind: its state is stale
            return 200, {"status": "degraded", "guard": guard["state"],
                         "reason": f"memory guard cannot read memory ({guard['telemetry_error']}); "
                                   "memory pressure is not being watched"}
        if guard and guard["state"] != "ok":
            return 200, {"status": "degraded", "reason": guard["reason"], "guard": guard["state"]}
        return 200, {"status": "ready", "reason": ""}

    def engine_failure(self) -> str | None:
        """Why the engine loop thread stopped, or None while it runs."""
        exc = self.aengine.failure if self.aengine is not None else None
        if exc is None:
            return None
        return (f"the engine loop stopped ({type(exc).__name__}: {exc}); the service must be "
                "restarted (systemd does so once the watchdog times out)")

    def stats(self, in_flight: InFlight | None = None) -> dict:
        """Everything /metrics and /v1/stats show; without `in_flight` (see `collect_stats`) no
        request counts as held by the engine."""
        engine_stats = self.engine.stats() if self.engine is not None else {}
        guard = self.guard.snapshot() if self.guard else None
        status = self.health()[1]["status"]
        in_flight = in_flight or split(self.book.snapshot(), set(), set())
        state = {"status": status, "model": self.model_name, **in_flight.as_dict()}
        if self.connections is not None:
            state["connections_open"] = self.connections.num_open
        return self.metrics.snapshot(engine_stats, guard, self.backends, state)

    async def collect_stats(self) -> dict:
        """`stats()` with in-flight requests split by what the engine holds: the book and the
        engine are read together on the engine's loop thread, between steps."""
        in_flight = None
        if self.aengine is not None and hasattr(self.aengine, "call"):
            def read(engine):
                return split(self.book.snapshot(), *engine_requests(engine))

            call = asyncio.ensure_future(self.aengine.call(read))
            while not call.done() and self.engine_failure() is None:
                await asyncio.wait([call], timeout=1.0)  # a dead loop never answers
            if call.done():
                in_flight = call.result()
            else:
                call.cancel()
        # engine.stats() takes the engine lock, held during a step: keep the event loop free
        return await asyncio.to_thread(self.stats, in_flight)
