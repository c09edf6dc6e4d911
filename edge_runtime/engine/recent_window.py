"""The recent-key window: int8 KV with each sequence's newest positions read exact.

Why: int8 KV's error does not spread evenly over a query's keys. A decode query puts much of its
attention on the last few tokens, so their int8 rounding moves its logits most. Measured through
the engine, every position scored as a decode step against fp32 KV (docs/engine.md, "The
recent-key window"): mean KL 3.5e-4 without a window, 1.3e-4 with 8 positions, 5.3e-5 with 16
(the default: 6.6x lower, where the curve bends; tools/kv_quant_probe.py shows the same).

How: every running sequence holds one window of `recent_window` (W) positions, fp16, allocated
once with the pool (KVStorage "window" store; bookkeeping in cache/recent_windows.py). Every new
token's K/V is written to its int8 page or slot as before and to the window, at offset
(position - window_start) % W. Attention reads positions [max(window_start, L - W), L) from the
window and the older ones from int8; a prefill chunk reads its own new tokens' K/V as computed
(so a prompt's last token, the first answer token's query, sees the prompt's end exact).
`window_start` is the first position the sequence computed itself: K/V that came from the prefix
cache were only ever stored as int8, so they are read as int8. A fork copies the parent's window;
finish, cancel and preemption give it back. Where every window is in use (beam forks at their
peak), a sequence runs without one and reads int8 only.

Cost: W x layers x 2 x kv heads x head_dim x 2 bytes per running sequence (W = 16: 360 KiB for
SmolLM2-135M, the int8 bytes of 31 tokens, 6% of one 512-token page), counted in the KV bytes
held; the decode kernels read W fp16 rows in place of W int8 rows (no measurable step time).

Readers: the CPU flat path (kernels/csrc/flat_kv.c and decoder.c in C, kernels/flat_kv_cpu.py in
torch) and the per-segment path of the GPU (engine/paged_kv.py: a "window" call over the fp16
window and a "fresh" call over the step's own K/V next to the int8 calls, through the same
paged-attention kernel; tested on the CPU with the torch reference kernels, not yet on a GPU).
"""

from __future__ import annotations

from edge_runtime.cache.recent_windows import WINDOWS_PER_SEQUENCE


def sizes(config) -> tuple[int, int]:
    """(number of windows, tokens per window) for an EngineConfig; (0, 0) where windows are off:
    recent_window 0, or float KV (already exact)."""
    if config.recent_window <= 0 or config.kv_dtype != "int8":
        return 0, 0
    return WINDOWS_PER_SEQUENCE * config.max_num_seqs, config.recent_window
