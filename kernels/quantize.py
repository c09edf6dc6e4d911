"""Symmetric absmax int8 quantization of K/V, per token and head (the KV contract).

Invariants (docs/interfaces.md, "Quantization"):
- `scale = max|x| / 127`, rounded to fp16 for storage; a zero vector gets scale 1.
- `q = clamp(round(x / scale16), -127, 127)` where `scale16` is the stored (fp16-rounded) scale,
  so that dequantization `q * scale16` uses exactly the scale the division used. Rounding is
  half-to-even (torch.round), the same as the Triton kernel's `rint`.
"""
import torch

QMAX = 127.0


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., D] float -> (q int8 [..., D], scale fp16 [...])."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)  # [...]
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax)).to(torch.float16)
    q = torch.round(xf / scale.float().unsqueeze(-1)).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q: int8 [..., D], scale fp16 [...] -> float32 [..., D]."""
    return q.float() * scale.float().unsqueeze(-1)
