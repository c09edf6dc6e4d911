"""AsyncEngine: the Engine's step loop in a background thread, an asyncio streaming front.

`stream()` submits a request and yields its TokenEvents as they are produced; the last event
carries `.result`. `cancel()` (or abandoning the stream: closing the generator, cancelling the
task) cancels the request in the engine, which frees every page it held.

Invariants:
- Only the loop thread calls `Engine.step`, `Engine.add_request` and `Engine.cancel`; asyncio code
  only enqueues work (thread-safe deque + wake-up event), so it never blocks on a running step.
- Request validation (`RequestError`) happens in the caller, before anything is queued; an error
  that `add_request` still raises on the loop thread reaches that stream as itself.
- Every stream ends: with its final event, or with `EngineLoopStopped` (caused by the exception
  that stopped the loop thread). A stopped loop never restarts: `failure` says so, and the service
  reports itself unhealthy so that systemd restarts the process.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import AsyncIterator

from edge_runtime.engine.api import GenerationResult, SamplingParams, TokenEvent
from edge_runtime.engine.engine import Engine
from edge_runtime.kernels.openmp_pool import release_thread_pool
from edge_runtime.errors import RequestError


class EngineLoopStopped(RuntimeError):
    """The loop thread died (an exception escaped Engine.step); no request will run any more."""


class AsyncEngine:
    def __init__(self, engine: Engine, idle_wait_s: float = 0.05):
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self._inbox: deque = deque()  # ("add", args) | ("cancel", rid) | ("call", fn, future)
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stop = False
        self._error: BaseException | None = None
        # the engine was built in this thread, it runs in the loop thread: free this thread's
        # OpenMP workers, or every parallel region of the loop thread pays a wake-up
        release_thread_pool()
        self._thread = threading.Thread(target=self._run, name="edge-engine", daemon=True)
        self._thread.start()

    @property
    def failure(self) -> BaseException | None:
        """Why the loop thread stopped on its own, or None while it runs (or after shutdown())."""
        if self._error is None and not self._stop and not self._thread.is_alive():
            return RuntimeError("the engine loop thread exited")
        return self._error

    # --- asyncio side ----------------------------------------------------------------------
    async def stream(self, prompt_ids: list[int], params: SamplingParams | None = None,
                     request_id: str | None = None, stream_id: str | None = None,
                     priority: int = 0) -> AsyncIterator[TokenEvent]:
        params = params or SamplingParams()
        self.engine.validate_request([int(t) for t in prompt_ids], params)
        if self._error is not None:
            raise _stopped(self._error) from self._error
        rid = request_id or f"areq-{next(self._ids)}"
        if rid in self._queues:
            raise RequestError(f"request id {rid!r} is already streaming; pick another")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = (asyncio.get_running_loop(), queue)
        self._submit(("add", (list(prompt_ids), params, rid, stream_id, priority)))
        done = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    # the loop stopped (EngineLoopStopped), or add_request refused this request
                    # on the loop thread while the loop goes on: re-raise the engine's own error
                    raise item
                yield item
                if item.result is not None:
                    done = True
                    return
        finally:
            if not done:
                self._queues.pop(rid, None)
                self._submit(("cancel", rid))

    async def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                       request_id: str | None = None) -> GenerationResult:
        async for ev in self.stream(prompt_ids, params, request_id):
            if ev.result is not None:
                return ev.result
        raise AssertionError("stream ended without a result")

    async def cancel(self, request_id: str) -> None:
        self._submit(("cancel", request_id))

    async def call(self, fn):
        """Run fn(engine) on the loop thread between steps (guard hooks, stats)."""
        fut = asyncio.get_running_loop().create_future()
        self._submit(("call", fn, fut))
        return await fut

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    # --- loop thread -----------------------------------------------------------------------
    def _submit(self, item) -> None:
        self._inbox.append(item)
        self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stop:
                self._drain_inbox()
                if self.engine.has_unfinished():
                    events = self.engine.step()
                    self._deliver(events)
                    if not events and self.engine.last_step_tokens == 0:
                        self._wake.wait(self.idle_wait_s)  # e.g. admission paused: do not spin
                        self._wake.clear()
                else:
                    self._wake.wait(self.idle_wait_s)
                    self._wake.clear()
        except BaseException as exc:  # surface to every stream, then stop
            self._error = exc
            for rid in list(self._queues):
                stopped = _stopped(exc)
                stopped.__cause__ = exc
                self._put(rid, stopped)
            raise

    def _drain_inbox(self) -> None:
        while self._inbox:
            item = self._inbox.popleft()
            if item[0] == "add":
                prompt, params, rid, stream_id, priority = item[1]
                try:
                    self.engine.add_request(prompt, params, request_id=rid, stream_id=stream_id,
                                            priority=priority)
                except Exception as exc:  # reaches the caller's stream as an error
                    self._put(rid, exc)
            elif item[0] == "cancel":
                self.engine.cancel(item[1])
            else:
                _, fn, fut = item
                self._resolve(fut, fn)

    def _resolve(self, fut, fn) -> None:
        loop = fut.get_loop()
        try:
            value = fn(self.engine)
        except Exception as exc:
            loop.call_soon_threadsafe(_set_exc, fut, exc)
        else:
            loop.call_soon_threadsafe(_set_result, fut, value)

    def _deliver(self, events: list[TokenEvent]) -> None:
        for ev in events:
            self._put(ev.request_id, ev)

    def _put(self, rid: str, item) -> None:
        entry = self._queues.get(rid)
        if entry is None:
            return
        loop, queue = entry
        if isinstance(item, BaseException) or item.result is not None:
            self._queues.pop(rid, None)
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening
            pass


def _stopped(exc: BaseException) -> EngineLoopStopped:
    return EngineLoopStopped(f"the engine loop stopped ({type(exc).__name__}: {exc}); "
                             "the process must be restarted")


def _set_result(fut, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut, exc) -> None:
    if not fut.done():
        fut.set_exception(exc)
