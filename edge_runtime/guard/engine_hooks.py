"""The guard's actions on a live Engine (docs/interfaces.md "Memory guard hooks").

A thin adapter: every action is an Engine method that takes the engine lock, so no step runs
while pages are evicted, sequences preempted or pool chunks retired (kv/pool_resize.py).
It also totals the bytes handed back to the OS, for the guard's log and tests.
"""

from __future__ import annotations


class EngineGuardHooks:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.released_bytes = 0

    def set_admission_paused(self, paused: bool) -> None:
        self.engine.set_admission_paused(paused)

    def evict_cached(self, max_pages: int | None) -> int:
        return self.engine.evict_cached(max_pages)

    def preempt_newest(self, k: int) -> int:
        return self.engine.preempt_newest(k)

    def shrink_pool(self, n_chunks: int) -> int:
        before = self.engine.snapshot().pool_bytes_released
        done = self.engine.shrink_pool(n_chunks)
        self.released_bytes += self.engine.snapshot().pool_bytes_released - before
        return done

    def grow_pool(self, n_chunks: int) -> int:
        return self.engine.grow_pool(n_chunks)

    def next_regrow_bytes(self) -> int:
        """Bytes the next regrown chunk makes resident again (0: nothing to regrow)."""
        snapshot = self.engine.snapshot()
        return snapshot.pool_bytes * snapshot.next_regrow_pages // snapshot.num_pages

    def refuse_waiting(self, message: str) -> int:
        return self.engine.refuse_waiting(message)
