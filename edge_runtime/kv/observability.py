"""KV bookkeeping observability: counters, a debug event log, and the low-free-pages dump.

Debug mode (constructor flag `debug=True` or env `EDGE_RUNTIME_KV_DEBUG=1`) logs every page
allocation, reference change, release and eviction on the `edge_runtime.kv` logger at DEBUG, one
line each: `t=<seconds since start> req=<seq id> <event> page=<id> ref=<n>`. The events are also
kept in `events` (bounded) so tests and post-mortems can read them without a logging setup.

The dump (`dump_state`) is a multi-line text of every non-free page and every sequence's block
table; `LowFreePagesDump` logs it at WARNING once each time free pages fall under `dump_below_free`
(KVManager's constructor argument), checked after every page allocation for a tail.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Callable

from edge_runtime import env

LOG = logging.getLogger("edge_runtime.kv")


def debug_enabled_by_env() -> bool:
    return env.kv_debug()


@dataclass
class KVCounters:
    """Monotone counters since start (the gauges are computed by KVManager.stats)."""

    admitted: int = 0
    finished: int = 0
    cancelled: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    copies: int = 0
    copied_tokens: int = 0
    inline_to_pages: int = 0
    pages_to_slots: int = 0  # a page tail continued in inline slots
    take_overs: int = 0
    failed_allocations: int = 0
    local_pages_released: int = 0  # layer groups: pages whose local part a sequence dropped

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class EventLog:
    """Debug log of bookkeeping events; a no-op unless enabled."""

    def __init__(self, enabled: bool | None = None, keep: int = 100_000):
        self.enabled = debug_enabled_by_env() if enabled is None else enabled
        self.t0 = time.monotonic()
        self.events: deque[tuple] = deque(maxlen=keep)

    def __call__(self, event: str, seq_id, **fields_) -> None:
        if not self.enabled:
            return
        t = time.monotonic() - self.t0
        self.events.append((t, event, seq_id, fields_))
        if LOG.isEnabledFor(logging.DEBUG):
            extra = " ".join(f"{k}={v}" for k, v in fields_.items())
            LOG.debug("t=%.6f req=%s %s %s", t, seq_id, event, extra)


class LowFreePagesDump:
    """Logs `describe()` at WARNING when free pages fall under `threshold`, once per fall: it
    re-arms when they are back at or above it (threshold 0: never)."""

    def __init__(self, threshold: int, describe: Callable[[], str]):
        self.threshold = threshold
        self.describe = describe
        self.logged = False  # logged during the current fall below the threshold

    def after_allocation(self, num_free: int) -> None:
        if num_free < self.threshold and not self.logged:
            self.logged = True
            LOG.warning("free KV pages below %d:\n%s", self.threshold, self.describe())
        elif num_free >= self.threshold:
            self.logged = False


def dump_state(pool, seqs: dict, arena) -> str:
    """Human-readable state of the pool: every non-free page, every sequence, the arena."""
    lines = [f"pool: {pool.num_pages} pages, free={pool.num_free} cached={pool.num_cached} "
             f"live={pool.num_live}; LRU(head first)={pool.lru_ids()[:32]}"]
    for page in pool.pages:
        if page.state != "free":
            lines.append(f"  {page!r} children={sorted(page.children)}")
    for seq_id, seq in seqs.items():
        lines.append(f"  seq {seq_id}: prefix={seq.prefix_pages} p={seq.prefix_len} "
                     f"tail={seq.tail_kind}:{seq.tail_ids()} len={seq.num_tokens} "
                     f"cap={seq.capacity}")
    if arena is not None:
        lines.append(f"  inline: {arena.num_used}/{arena.num_slots} slots used")
    return "\n".join(lines)
