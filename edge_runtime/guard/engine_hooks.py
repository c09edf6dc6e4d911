"""The guard's actions on a live Engine, with fallbacks for hooks the engine does not have yet.

The engine's own hooks (docs/interfaces.md "Memory guard hooks") are used when present. Missing
ones are emulated here and reported in `emulated` (exported as edge_guard_hook_emulated):

- shrink_pool(n): under the engine lock (so no step runs), evict every cached page, then hand the
  memory of up to n runs of contiguous FREE pages back to the OS (KVStorage.release_pages:
  madvise(DONTNEED) on CPU). Free pages hold no K/V, so nothing is lost: a released page that is
  allocated again is simply faulted back in (zeros) when the engine writes it.
- grow_pool(): re-touch (KVStorage.regrow_pages) released pages that are still FREE, so the pool
  is resident again at its budgeted size. Pages allocated meanwhile were regrown by their writes.

Invariant: pages are released or regrown only while they are FREE and the engine lock is held;
the KVManager's page states, ref counts and free list are never modified here.
"""

from __future__ import annotations

import contextlib

HOOKS = ("set_admission_paused", "evict_cached", "preempt_newest", "shrink_pool", "grow_pool")


class EngineGuardHooks:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.emulated = {h: not callable(getattr(engine, h, None)) for h in HOOKS}
        for hook in ("set_admission_paused", "evict_cached", "preempt_newest"):
            assert not self.emulated[hook], f"Engine lacks the guard hook {hook}"
        self.released_bytes = 0

    def set_admission_paused(self, paused: bool) -> None:
        self.engine.set_admission_paused(paused)

    def evict_cached(self, max_pages: int | None) -> int:
        return self.engine.evict_cached(max_pages)

    def preempt_newest(self, k: int) -> int:
        return self.engine.preempt_newest(k)

    def shrink_pool(self, n_chunks: int) -> int:
        if not self.emulated["shrink_pool"]:
            return self.engine.shrink_pool(n_chunks)
        with self._between_steps():
            self.engine.kv.evict(None)
            storage = self.engine.storage
            runs = [r for r in _runs(self._free_ids()) if not set(range(*r)) <= storage.released]
            done = 0
            for start, end in runs[:n_chunks]:
                freed = storage.release_pages(start, end)  # 0 on CUDA: nothing to hand back
                self.released_bytes += freed
                done += freed > 0
            return done

    def grow_pool(self) -> int:
        if not self.emulated["grow_pool"]:
            return self.engine.grow_pool()
        with self._between_steps():
            storage = self.engine.storage
            free = set(self._free_ids())
            stale = {p for p in storage.released if p not in free}
            # allocated since release: the engine's writes made them resident again
            storage.released.difference_update(stale)
            runs = _runs(sorted(storage.released))
            for start, end in runs:
                storage.regrow_pages(start, end)
            return len(runs)

    def _free_ids(self) -> list[int]:
        return sorted(self.engine.kv.pool.free_queue)

    def _between_steps(self):
        lock = getattr(self.engine, "_lock", None)  # Engine serialises step() and hooks on it
        return lock if lock is not None else contextlib.nullcontext()


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted page ids -> [(start, end)) runs of consecutive ids, longest first."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return sorted(((a, b) for a, b in runs), key=lambda r: r[0] - r[1])
