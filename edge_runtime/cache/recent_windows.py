"""Recent-key windows: which running sequence holds which window (bookkeeping only, no torch).

A window holds the K/V of a sequence's most recent `window_tokens` positions exact (fp16), next to
their int8 copies in pages and slots, and attention reads those positions from the window
(engine/recent_window.py says why and how). Only positions the sequence computed itself are exact:
the window starts at `window_start`, the first position it computed (after its prefix-cache hit),
and position p sits at offset (p - window_start) % W. So after n positions the exact ones are
[max(window_start, n - W), n), and they always fill offsets [0, min(W, n - window_start)).

Invariants (`check_invariants`, with the manager's): a window is free or owned by exactly one live
sequence; used + free == total.
"""

from __future__ import annotations

DEFAULT_WINDOW_TOKENS = 16  # EngineConfig.recent_window's default (docs/engine.md: the KL knee)
WINDOWS_PER_SEQUENCE = 2  # windows allocated per max running sequence: beam search forks before
# it drops the parents nobody chose


def window_bytes(num_layers: int, num_kv_heads: int, head_dim: int, window_tokens: int) -> int:
    """Bytes of one window: K and V, fp16, all layers."""
    return window_tokens * num_layers * 2 * num_kv_heads * head_dim * 2


def exact_from(window_start: int, window_tokens: int, end: int) -> int:
    """First position read from the window when positions [0, end) are written."""
    return max(window_start, end - window_tokens)


def window_offset(position: int, window_start: int, window_tokens: int) -> int:
    return (position - window_start) % window_tokens


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
