"""The systems the trace benchmark compares, built from one model: edge, edge-noshare, edge-fp16kv.

- `edge`: the engine as shipped: int8 KV pages, prefix cache, inline path.
- `edge-noshare`: the same engine with the prefix cache and the inline path off (every request
  prefills its whole prompt into private pages).
- `edge-fp16kv`: int8 -> fp16 KV, everything else as `edge`.
- `edge-fp32w`: `edge` on float32 weights (a GGUF's float32 conversion) instead of its own blocks.
And the `hf` baseline (bench/hf_backend.py) on the same converted fp32 weights.

KV bytes held, sampled after every engine step (the step is wrapped, so each sample sees a
consistent state from the engine's own thread): live pages (ref > 0) + inline slots in use, times
their bytes (all layers, K+V, and the int8 scales), + the recent-key windows held by running
sequences (int8 KV: W fp16 positions each, kv/recent_window.py). Cached pages (ref 0, evictable) are reported
separately as `peak_kv_cached_bytes`: they cost no new memory (the pool is allocated at start) and
are reclaimed on demand.
"""

from __future__ import annotations

import sys
import time

from edge_runtime.bench.monitor import Timeline
from edge_runtime.bench.replay import Outcome
from edge_runtime.errors import InputError, RequestError
from edge_runtime.bench.hf_backend import HFBackend
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.kernels.openmp_pool import release_thread_pool
from edge_runtime.kv.page_math import pages_for_tokens
from edge_runtime.kv.recent_window import window_bytes
from edge_runtime.model.chat import encode_messages

SYSTEM_FLAGS = {  # system -> (kv_dtype, prefix cache, inline path)
    "edge": ("int8", True, True),
    "edge-noshare": ("int8", False, False),
    "edge-fp16kv": ("fp16", True, True),
    "edge-fp32w": ("int8", True, True),
}
# system -> its weights (bench/edge_systems.load); the others take the run's (default "auto": a
# GGUF's own blocks). edge-fp32w is `edge` on the float32 weights, the reference.
SYSTEM_WEIGHTS = {"edge-fp32w": "fp32"}


def _progress(msg: str) -> None:
    print(f"edge-runtime: {msg}", file=sys.stderr, flush=True)


def load(model: str, weights: str | None = None, device: str = "auto", backend: str | None = None):
    """The model loaded and prepared for its back end (engine/placement.py). weights: "auto" or
    "gguf" (a GGUF's own blocks on either back end, model/gguf_int4.py), "fp32" | "fp16" | "bf16"
    (float weights in that dtype; a GGUF converted first), None: float weights in the back end's
    dtype."""
    if weights in ("auto", "gguf"):
        return load_for(model, resolve(device, backend), progress=_progress, weights=weights)
    return load_for(model, resolve(device, backend, weight_dtype=weights), progress=_progress,
                    weights="fp32")


def describe_backend(device: str = "auto", backend: str | None = None) -> dict:
    """The back end and every kernel it runs, for the bench JSON (engine/backend.py)."""
    from edge_runtime.engine.backend import select_backend  # start-up time: imports torch

    placement = resolve(device, backend)
    return {**placement.describe(), **select_backend(placement.backend, placement.device).describe()}


def load_hf_backend(model: str, model_path: str | None = None):
    # start-up time: imports torch
    from edge_runtime.model.loader import fp32_folder, load_tokenizer

    folder = fp32_folder(model_path or model, _progress)  # transformers reads float weights
    return HFBackend(folder, load_tokenizer(folder))


def kv_bytes_per_token(model_config, kv_dtype: str) -> int:
    """Bytes of one token's K+V over all layers (+ fp16 scales per token and head for int8)."""
    elt = {"int8": 1, "fp16": 2, "fp32": 4}[kv_dtype]
    scale = 2 if kv_dtype == "int8" else 0
    per_head = model_config.head_dim * elt + scale
    return model_config.num_layers * 2 * model_config.num_kv_heads * per_head


def build_engine(loaded, system: str, kv_dtype: str | None = None, num_pages: int = 32,
                 page_tokens: int | None = None, max_batch: int = 8, max_tokens: int = 0,
                 recent_window: int | None = None):
    """An Engine configured as `system`; `kv_dtype` overrides the system's KV dtype."""
    from edge_runtime.engine.config import EngineConfig  # start-up time: imports torch
    from edge_runtime.engine.engine import Engine  # start-up time: imports numpy, torch

    dtype, share, inline = SYSTEM_FLAGS[system]
    extra = {"page_tokens": page_tokens} if page_tokens else {}
    if recent_window is not None:
        extra["recent_window"] = recent_window
    cfg = EngineConfig(kv_dtype=kv_dtype or dtype, enable_prefix_cache=share, enable_inline=inline,
                       num_pages=num_pages, max_num_seqs=max(8, max_batch),
                       device=str(loaded.model.device), backend=loaded.model.prepared_for, **extra)
    check_pool(max_batch, max_tokens, num_pages, cfg.page_tokens)
    return Engine(loaded, cfg)


def check_pool(max_batch: int, max_tokens: int, num_pages: int = 32,
               page_tokens: int | None = None) -> None:
    """`max_batch` sequences of `max_tokens` tokens fit in the bench's KV pool; cheap, so the
    commands call it before loading the model (build_engine checks it again)."""
    from edge_runtime.engine.config import EngineConfig  # start-up time: imports torch

    page_tokens = page_tokens or EngineConfig.page_tokens
    need = max_batch * pages_for_tokens(max_tokens, page_tokens)
    if need > num_pages:
        raise InputError(f"{max_batch} sequences of {max_tokens} tokens need {need} KV pages of "
                         f"{page_tokens} tokens, the bench's pool has {num_pages}: lower the batch "
                         "size or the prompt/generated tokens")


class KVProbe:
    """KV bytes held by an engine, from its stats: live pages + inline slots in use + the
    recent-key windows of running sequences (kv/recent_window.py)."""

    def __init__(self, engine, model_config) -> None:
        cfg = engine.config
        per_token = kv_bytes_per_token(model_config, cfg.kv_dtype)
        self.page_bytes = per_token * cfg.page_tokens
        self.slot_bytes = per_token * cfg.inline_tokens
        self.window_bytes = window_bytes(model_config.num_layers, model_config.num_kv_heads,
                                         model_config.head_dim, engine.kv.windows.window_tokens)
        self.engine = engine

    def read(self, kv_stats: dict | None = None) -> tuple[int, int, float]:
        """(held bytes, cached-page bytes, page utilization) right now."""
        s = kv_stats if kv_stats is not None else self.engine.stats()["kv"]
        held = (s["pages_live"] * self.page_bytes + s["inline_slots_used"] * self.slot_bytes
                + s.get("windows_used", 0) * self.window_bytes)
        return held, s["pages_cached"] * self.page_bytes, s["page_utilization"]


class EdgeBackend:
    """`Backend` for bench.replay: the Engine stepped by one driver thread, events to asyncio.

    The bench drives the engine itself rather than through AsyncEngine so that it can sample the
    KV state after every step, in the engine's thread, at no cost to the step it measures. As
    AsyncEngine, asyncio code only enqueues requests and the driver thread adds them between
    steps: `add_request` takes the engine's lock, and called from the event loop during a step it
    held every other stream's send until the step ended (a cold-start prefill: ~0.5 s), which
    the service (engine/async_engine.py) never does.
    """

    def __init__(self, loaded, system: str, engine) -> None:
        import collections
        import threading

        self.name = system
        self.loaded = loaded
        self.engine = engine
        self.probe = KVProbe(engine, loaded.config)
        self.kv = Timeline()
        self.kv_cached = Timeline()
        self.utilization: list[float] = []
        self._queues: dict = {}  # request id -> (loop, asyncio.Queue)
        self._incoming: collections.deque = collections.deque()  # add_request arguments, FIFO
        self._wake = threading.Event()
        self._closed = False
        self._error: BaseException | None = None
        release_thread_pool()  # built in this thread, stepped in the driver (kernels/openmp_pool.py)
        self._thread = threading.Thread(target=self._loop, name=f"bench-{system}", daemon=True)
        self._thread.start()

    @classmethod
    def create(cls, model: str, system: str, opts: dict) -> "EdgeBackend":
        loaded = load(model, SYSTEM_WEIGHTS.get(system, opts.get("weights", "auto")),
                      opts.get("device", "auto"), opts.get("backend"))
        engine = build_engine(loaded, system, num_pages=opts.get("num_pages") or 32,
                              page_tokens=opts.get("page_tokens"),
                              recent_window=opts.get("recent_window"))
        return cls(loaded, system, engine)

    def _sample(self) -> None:
        held, cached, util = self.probe.read(self.engine.stats()["kv"])
        now = time.perf_counter()
        self.kv.add(held, now)
        self.kv_cached.add(cached, now)
        if held or cached:
            self.utilization.append(util)

    def _loop(self) -> None:
        try:
            while not self._closed:
                self._admit_incoming()
                if not self.engine.has_unfinished():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                events = self.engine.step()
                self._sample()
                for ev in events:
                    loop, queue = self._queues[ev.request_id]
                    loop.call_soon_threadsafe(queue.put_nowait, (time.perf_counter(), ev))
        except BaseException as exc:  # surfaced to every waiting request, never swallowed
            self._error = exc
            for loop, queue in list(self._queues.values()):
                loop.call_soon_threadsafe(queue.put_nowait, (time.perf_counter(), exc))
            raise

    def _admit_incoming(self) -> None:
        """Add the enqueued requests, in the order they came; a refused one gets its error."""
        while self._incoming:
            prompt_ids, params, rid, stream = self._incoming.popleft()
            try:
                self.engine.add_request(prompt_ids, params, request_id=rid, stream_id=stream)
            except Exception as exc:  # noqa: BLE001 - delivered to that request's caller
                loop, queue = self._queues[rid]
                loop.call_soon_threadsafe(queue.put_nowait, (time.perf_counter(), exc))

    async def complete(self, stream: str, messages: list[dict], max_tokens: int) -> Outcome:
        import asyncio

        if self._error is not None:
            raise RuntimeError(f"{self.name} engine thread failed") from self._error
        prompt_ids = encode_messages(self.loaded.tokenizer, messages)
        queue: asyncio.Queue = asyncio.Queue()
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        rid = f"{stream}-{len(messages)}"
        self._queues[rid] = (asyncio.get_running_loop(), queue)
        self._incoming.append((prompt_ids, params, rid, stream))
        self._wake.set()
        first_t = None
        while True:
            t, ev = await queue.get()
            if isinstance(ev, BaseException):
                if self._error is None:  # add_request refused this one; the engine goes on
                    del self._queues[rid]
                    if isinstance(ev, RequestError):  # the request does not fit this bench's engine
                        hint = (" (the bench's pool: --num-pages, --page-tokens)"
                                if "KV pool" in str(ev) else "")
                        raise InputError(f"{self.name} refused request {rid}: {ev}{hint}") from None
                    raise RuntimeError(f"{self.name} refused request {rid}: {ev}") from ev
                raise RuntimeError(f"{self.name} engine thread failed") from ev
            if ev.token_ids and first_t is None:
                first_t = t
            if ev.result is not None:
                break
        del self._queues[rid]
        res = ev.result
        return Outcome(
            text=res.text, output_tokens=res.generated_tokens, first_token_t=first_t, end_t=t,
            prompt_tokens=res.prompt_tokens, cached_prompt_tokens=res.cached_prompt_tokens,
            finish_reason=res.finish_reason, token_ids=list(res.token_ids),
        )

    def extra_columns(self) -> dict:
        util = self.utilization
        stats = self.engine.stats()
        return {
            "page_utilization": sum(util) / len(util) if util else None,
            "peak_kv_cached_bytes": self.kv_cached.peak,
            "kv_pool_bytes": stats["kv_bytes"], "kv_dtype": stats["kv_dtype"],
            "preemptions": stats["preemptions"], "evictions": stats["kv"]["evictions"],
            "engine_steps": stats["steps"],
        }

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join()
