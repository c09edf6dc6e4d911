"""Per-head Hadamard rotation of K and V for the int8 KV cache.

Why: int8 KV is quantized per (token, head) with one absmax scale. Keys of Llama-family models
carry a few outlier channels (per rope frequency), so the scale is set by them and the other
channels keep only a few levels. Rotating each head vector by the normalized Hadamard matrix
H (orthonormal, symmetric, its own inverse) spreads every channel over all D (QuaRot, SpinQuant,
QuIP#): q.k = (Hq).(Hk), so attention scores are unchanged in exact math, and
softmax(...) . (Hv) = H (softmax(...) . v), so rotating the attention output back recovers it.
Measured on SmolLM2-135M (docs/engine.md, "int8 KV quality"): the int8-vs-fp32 perplexity excess
halves.

`rotate(x)` applies the matrix to the last dimension (a power of two) as the butterfly transform
(log2 D stages of a + b, a - b, then one scale), elementwise ops only, so each row's result is the
same bits however many rows the call holds. A matmul (`x @ H`) is not: BLAS and cuBLAS pick their
kernel and summation order by the row count (with head_dim 32 on the CPU, 1, 2 and 16 rows gave
three different roundings of one row), so a decode token's q/k/v differed alone and batched
(tests/test_determinism.py, the 2-head model). Cost: one op per stage (an addcmul a + b * (+-1),
bit-equal to a +- b) and the scale, 7 ops per tensor for head_dim 64 where the matmul was one;
on the CPU (torch, 1 thread, 9 heads of 64) ~80 us for one token against ~4 us; not measured on a
GPU. kernels/csrc/decoder.c uses its own butterflies; both agree to rounding, and the C step's
test bounds the int8 K/V differences.
Applied by kv/step_context.py (both back ends' contexts) and the C decode step exactly when the
KV storage says `rotated` (int8 stores, power-of-two head_dim); float stores are not rotated.
"""
from __future__ import annotations

import torch


def applies(head_dim: int) -> bool:
    return head_dim >= 2 and head_dim & (head_dim - 1) == 0


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (D a power of two) -> x @ H, H the normalized Sylvester Hadamard matrix, by the
    butterfly transform (half precision in float32): every row's bits independent of the others."""
    d = x.shape[-1]
    assert applies(d), f"Hadamard rotation needs a power-of-two head_dim, got {d}"
    y = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    key = (y.dtype, y.device)
    signs = _SIGNS.get(key)  # made once per device (first use, before any CUDA graph capture)
    if signs is None:
        signs = _SIGNS[key] = torch.tensor([[1.0], [-1.0]], dtype=y.dtype, device=y.device)
    lead, half = y.shape[:-1], 1
    while half < d:  # pairs (a, b) = (j, j + half) in each block of 2 * half -> (a + b, a - b)
        pairs = y.reshape(*lead, d // (2 * half), 2, half)
        y = torch.addcmul(pairs[..., :1, :], pairs[..., 1:, :], signs)  # a + b * (+-1): exact sign
        half *= 2
    return (y.reshape(x.shape) * d ** -0.5).to(x.dtype)


_SIGNS: dict = {}


def matrix(d: int, dtype=torch.float32) -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix [d, d] (the reference `rotate` is tested against)."""
    m = torch.ones(1, 1, dtype=torch.float64)
    while m.shape[0] < d:
        m = torch.cat((torch.cat((m, m), 1), torch.cat((m, -m), 1)), 0)
    return (m / d ** 0.5).to(dtype)
