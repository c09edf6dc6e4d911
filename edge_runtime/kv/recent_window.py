"""The recent-key window: int8 KV with each query's own block of positions read exact; the read
rule, its sizes and the bookkeeping of which sequence holds which window (no torch).

Why: int8 KV's error does not spread evenly over a query's keys. A decode query puts much of its
attention on the last few tokens, so their int8 rounding moves its logits most
(tools/kv_quant_probe.py: 16 exact recent keys cut the KL vs fp32 KV 6.6x).

The read rule: a query at position i reads key j exact (fp16) iff
j >= i - i % W, i.e. j lies in i's aligned block of W positions, and dequantized from int8
otherwise. It is a function of (i, j) alone, so a greedy request's tokens do not depend on how
it was served: a prefill chunk reads what a decode step at the same position reads, and a prompt
whose prefix came from the prefix cache reads what a cold one reads. Before, the window slid (the
last W keys exact) and held only positions the sequence computed itself, while a prefill chunk
read its own new tokens exact: a cold prompt read its end exact where the same prompt from the
cache read int8, and a prompt chunked differently read other values.

How: every running sequence holds one window of W positions, fp16, allocated once with the pool
(KVStorage "window" store; the bookkeeping below, `RecentWindows`, driven by KVManager). Every new
token's K/V is written to its int8 page or slot and, when it is in its sequence's last block, to
the window at offset position % W. A sequence computes every position of the block it is in: a
prefix-cache hit is cut back to a multiple of W (KVManager.cached_prefix; up to W - 1 cached
tokens are recomputed), so the window never has to hold a position that came from the cache. A
decode token reads its block from the window; a prefill chunk reads, per query, its block from
the window's positions before the chunk and the chunk's own K/V rounded to fp16 (what the window
holds), and the older keys from int8 (the chunk's own included, written before attention). A
fork copies the parent's window; finish, cancel and preemption give it back (a preempted
sequence recomputes from an aligned prefix). Windows are allocated 2 per running sequence (beam
forks at their peak); a sequence that finds none (or whose parent had none) reads int8 only,
which breaks the rule for that sequence.

Quality: a query reads 1 to W keys exact (W/2 on average, against W with the sliding window).
Measured through the engine (docs/engine.md, "The recent-key window"; first 1,024 tokens of
GPL-3): with W = 16 the mean KL vs fp32 KV is 1.11e-4 and perplexity +0.071% (sliding window:
3.17e-5; no window: 3.5e-4), W = 32 gives 8.6e-5.

Cost: W x layers x 2 x kv heads x head_dim x 2 bytes per window (W = 16: 360 KiB for
SmolLM2-135M, the int8 bytes of 31 tokens, 6% of one 512-token page), counted in the KV bytes
held; the decode kernels read up to W fp16 rows in place of int8 rows; a prefix-cache hit
recomputes up to W - 1 more tokens.

Readers: the CPU back end (kv/flat_context.py, with kv/flat_index.py for the rows;
kernels/csrc/flat_kv.c and decoder.c in C, kernels/flat_kv_cpu.py in torch) and the CUDA back
end (kv/paged_context.py: one per-token launch over the step's exact blocks, the window's carried
positions and the step's own K/V in fp16, for decode and prefill tokens alike, merged after the
int8 keys read by position; tested on the CPU with the torch reference kernels and the Triton
interpreter, not on a GPU).

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


def sizes(config) -> tuple[int, int]:
    """(number of windows, tokens per window) for an EngineConfig; (0, 0) where windows are off:
    recent_window 0, or float KV (already exact)."""
    if config.recent_window <= 0 or config.kv_dtype != "int8":
        return 0, 0
    return WINDOWS_PER_SEQUENCE * config.max_num_seqs, config.recent_window


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
