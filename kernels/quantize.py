"""Symmetric absmax int8 quantization of K/V, per token and head (the KV contract).

Invariants (docs/interfaces.md, "KV storage layout"):
- `scale = max|x| / 127`, rounded to fp16 for storage; a zero vector gets scale 1.
- `q = clamp(round(x / scale16), -127, 127)` where `scale16` is the stored (fp16-rounded) scale,
  so that dequantization `q * scale16` uses exactly the scale the division used. Rounding is
  half-to-even (torch.round), the same as the Triton kernel's `rint`.

Centred keys (docs/engine.md, "Centred keys"): with a mean key `m` per layer and kv head, a key
row `x` whose absmax falls when centred (`max|x - m| < max|x|`, fp32) is stored as `x - m` with its
fp16 scale negated (a scale is never negative otherwise); every other row exactly as above. A
reader takes `|scale|` and adds `m` back to flagged rows (`q.m` to their scores), so every key
reads as `x` again and stores written without a mean read the same. Values are never centred.
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


def quantize_int8_keys(x: torch.Tensor, mean: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., Hkv, D] float keys, mean: [Hkv, D] float (or None: plain quantize_int8)
    -> (q int8 [..., Hkv, D], scale fp16 [..., Hkv], negative where the row was centred)."""
    if mean is None:
        return quantize_int8(x)
    xf = x.float()
    centred = xf - mean.float()
    pick = centred.abs().amax(dim=-1) < xf.abs().amax(dim=-1)  # [..., Hkv]
    q, scale = quantize_int8(torch.where(pick.unsqueeze(-1), centred, xf))
    return q, torch.where(pick, -scale, scale)


def dequantize_int8_keys(q: torch.Tensor, scale: torch.Tensor, mean: torch.Tensor | None) -> torch.Tensor:
    """q: int8 [..., Hkv, D], scale fp16 [..., Hkv] (negative: centred), mean [Hkv, D] or None
    -> float32 keys [..., Hkv, D]."""
    s = scale.float()
    x = q.float() * s.abs().unsqueeze(-1)
    if mean is None:
        return x
    return x + (s < 0).unsqueeze(-1).float() * mean.float()
