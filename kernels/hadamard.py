"""Per-head Hadamard rotation of K and V for the int8 KV cache.

Why: int8 KV is quantized per (token, head) with one absmax scale. Keys of Llama-family models
carry a few outlier channels (per rope frequency), so the scale is set by them and the other
channels keep only a few levels. Rotating each head vector by the normalized Hadamard matrix
H (orthonormal, symmetric, its own inverse) spreads every channel over all D (QuaRot, SpinQuant,
QuIP#): q.k = (Hq).(Hk), so attention scores are unchanged in exact math, and
softmax(...) . (Hv) = H (softmax(...) . v), so rotating the attention output back recovers it.
Measured on SmolLM2-135M (docs/engine.md, "int8 KV quality"): the int8-vs-fp32 perplexity excess
halves.

`rotate(x)` multiplies the last dimension (a power of two) by the matrix: one matmul, where a
butterfly transform in torch would be ~20 small ops per tensor and layer (kernels/csrc/decoder.c
uses the butterflies). Both agree to rounding; the C step's test bounds the int8 K/V differences.
Applied by engine/kv_context.py (both back ends' contexts) and the C decode step exactly when the
KV storage says `rotated` (int8 stores, power-of-two head_dim); float stores are not rotated.
"""
from __future__ import annotations

import torch


def applies(head_dim: int) -> bool:
    return head_dim >= 2 and head_dim & (head_dim - 1) == 0


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (D a power of two) -> x @ H, H the normalized Sylvester Hadamard matrix."""
    d = x.shape[-1]
    assert applies(d), f"Hadamard rotation needs a power-of-two head_dim, got {d}"
    key = (d, x.dtype, x.device)
    h = _MATRICES.get(key)
    if h is None:
        h = _MATRICES[key] = matrix(d, x.dtype).to(x.device)
    return x @ h


_MATRICES: dict = {}


def matrix(d: int, dtype=torch.float32) -> torch.Tensor:
    """The normalized Sylvester Hadamard matrix [d, d] (the reference `rotate` is tested against)."""
    m = torch.ones(1, 1, dtype=torch.float64)
    while m.shape[0] < d:
        m = torch.cat((torch.cat((m, m), 1), torch.cat((m, -m), 1)), 0)
    return (m / d ** 0.5).to(dtype)
