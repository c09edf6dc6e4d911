"""Recent-key windows: which running sequence holds which window (bookkeeping only, no torch).

The read rule (engine/recent_window.py says why): with windows of W positions, a query at position
i reads key j (j <= i) exact iff j >= `exact_from(i, W)` = i - i % W, the start of i's aligned
block of W positions; every older key is read dequantized from int8. It depends on (i, j) alone,
so prefill and decode, a cold prompt and one whose prefix came from the cache, read the same.

A window holds the K/V of its sequence's current block exact (fp16), position p at offset p % W,
next to their int8 copies in pages and slots. A sequence computes every position of its current
block itself, because a prefix-cache hit is cut back to a multiple of W (`aligned_cached`): the
positions of a block are never split between a cached prefix and the sequence's own work.

Invariants (`check_invariants`, with the manager's): a window is free or owned by exactly one live
sequence; used + free == total; a windowed sequence's `window_start` (the first position it
computed) is a multiple of W.
"""

from __future__ import annotations

DEFAULT_WINDOW_TOKENS = 16  # EngineConfig.recent_window's default (docs/engine.md: the KL knee)
WINDOWS_PER_SEQUENCE = 2  # windows allocated per max running sequence: beam search forks before
# it drops the parents nobody chose


def window_bytes(num_layers: int, num_kv_heads: int, head_dim: int, window_tokens: int) -> int:
    """Bytes of one window: K and V, fp16, all layers."""
    return window_tokens * num_layers * 2 * num_kv_heads * head_dim * 2


def exact_from(position: int, window_tokens: int) -> int:
    """First key position a query at `position` reads exact (the start of its aligned block of
    `window_tokens`); position + 1, nothing exact, without windows. Works on ints and on numpy or
    torch integer arrays alike."""
    if window_tokens <= 0:
        return position + 1
    return position - position % window_tokens


def window_offset(position: int, window_tokens: int) -> int:
    """Where a position's exact K/V sit in its sequence's window."""
    return position % window_tokens


def aligned_cached(num_cached: int, window_tokens: int) -> int:
    """The prefix-cache tokens a sequence may use: `num_cached` cut back to a multiple of the
    window, so the block its first computed position is in starts at that position."""
    return num_cached - num_cached % window_tokens if window_tokens > 0 else num_cached


class RecentWindows:
    def __init__(self, num_windows: int, window_tokens: int):
        assert num_windows >= 0 and window_tokens >= 0, (num_windows, window_tokens)
        self.num_windows = num_windows if window_tokens > 0 else 0
        self.window_tokens = window_tokens
        self.owner: list = [None] * self.num_windows
        self._free = list(range(self.num_windows - 1, -1, -1))  # pop() gives window 0 first

    @property
    def num_used(self) -> int:
        return self.num_windows - len(self._free)

    def allocate(self, owner) -> int | None:
        """A free window for `owner`; None when every window is in use (or windows are off): the
        sequence then reads all its positions from int8, as without windows."""
        if not self._free:
            return None
        window = self._free.pop()
        assert self.owner[window] is None, window
        self.owner[window] = owner
        return window

    def release(self, window: int, owner) -> None:
        assert self.owner[window] == owner, f"window {window} released by {owner!r}, owned by " \
                                            f"{self.owner[window]!r}"
        self.owner[window] = None
        self._free.append(window)

    def check_invariants(self, live_windows: dict) -> None:
        """live_windows: window -> sequence id, from the live sequences."""
        assert len(set(self._free)) == len(self._free), "a window is free twice"
        assert self.num_used + len(self._free) == self.num_windows
        for w in range(self.num_windows):
            assert self.owner[w] == live_windows.get(w), \
                f"window {w}: owner {self.owner[w]!r}, held by {live_windows.get(w)!r}"
