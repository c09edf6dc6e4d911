"""The recent-key window: int8 KV with each query's own block of positions read exact.

Why: int8 KV's error does not spread evenly over a query's keys. A decode query puts much of its
attention on the last few tokens, so their int8 rounding moves its logits most
(tools/kv_quant_probe.py: 16 exact recent keys cut the KL vs fp32 KV 6.6x).

The read rule (cache/recent_windows.py): a query at position i reads key j exact (fp16) iff
j >= i - i % W, i.e. j lies in i's aligned block of W positions, and dequantized from int8
otherwise. It is a function of (i, j) alone, so a greedy request's tokens do not depend on how
it was served: a prefill chunk reads what a decode step at the same position reads, and a prompt
whose prefix came from the prefix cache reads what a cold one reads. Before, the window slid (the
last W keys exact) and held only positions the sequence computed itself, while a prefill chunk
read its own new tokens exact: a cold prompt read its end exact where the same prompt from the
cache read int8, and a prompt chunked differently read other values.

How: every running sequence holds one window of W positions, fp16, allocated once with the pool
(KVStorage "window" store; bookkeeping in cache/recent_windows.py, driven by KVManager). Every new
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

Readers: the CPU back end (engine/flat_kv.py, with engine/flat_kv_index.py for the rows;
kernels/csrc/flat_kv.c and decoder.c in C, kernels/flat_kv_cpu.py in torch) and the CUDA back
end (engine/paged_kv.py: one per-token launch over the step's exact blocks, the window's carried
positions and the step's own K/V in fp16, for decode and prefill tokens alike, merged after the
int8 keys read by position; tested on the CPU with the torch reference kernels and the Triton
interpreter, not on a GPU).
"""

from __future__ import annotations

from edge_runtime.cache.recent_windows import WINDOWS_PER_SEQUENCE


def sizes(config) -> tuple[int, int]:
    """(number of windows, tokens per window) for an EngineConfig; (0, 0) where windows are off:
    recent_window 0, or float KV (already exact)."""
    if config.recent_window <= 0 or config.kv_dtype != "int8":
        return 0, 0
    return WINDOWS_PER_SEQUENCE * config.max_num_seqs, config.recent_window
