"""AutoAWQ "GEMM" int4 format: packing, unpacking, group quantization and the dequant reference.

Format (bit-exact with AutoAWQ 0.2.x `WQLinear_GEMM`), for a linear with `in_features` K,
`out_features` N and group size G (K % G == 0, N % 8 == 0):

- `qweight`: int32 [K, N / 8]; word `qweight[k, c]` holds the eight 4-bit values
  `q[k, 8c + AWQ_ORDER[i]]` in bits `4i .. 4i + 3` (i = 0 is the least significant nibble).
- `qzeros`: int32 [K / G, N / 8], zero points packed the same way.
- `scales`: float16 [K / G, N].
- `W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]`, where W is the transpose of
  `nn.Linear.weight` (i.e. [in, out]).

Invariants: unpack(pack(q)) == q exactly for every int4 matrix; packing never depends on the
sign bit (a nibble >= 8 in position 7 makes the int32 negative, as in AutoAWQ).
"""

from __future__ import annotations

import torch

PACK_NUM = 8  # int4 values per int32 word
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # packed position i holds logical column AWQ_ORDER[i]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # logical column j sits at packed position [j]
_SHIFTS = tuple(4 * i for i in range(PACK_NUM))


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Pack an int matrix [R, N] with entries in [0, 15] into AWQ int32 words [R, N / 8]."""
    assert values.dim() == 2 and values.shape[1] % PACK_NUM == 0, tuple(values.shape)
    v = values.to(torch.int64)
    assert int(v.min()) >= 0 and int(v.max()) <= 15, (int(v.min()), int(v.max()))
    rows, cols = v.shape
    # v: [R, N/8, 8] in logical order -> packed order
    v = v.view(rows, cols // PACK_NUM, PACK_NUM)[:, :, list(AWQ_ORDER)]
    shifts = torch.tensor(_SHIFTS, dtype=torch.int64, device=v.device)
    words = (v << shifts).sum(dim=-1)  # disjoint bits: sum == bitwise or; in [0, 2**32)
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement wrap
    return words.to(torch.int32)


def unpack_int4(words: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: int32 [R, N / 8] -> int32 [R, N] with entries in [0, 15]."""
    assert words.dim() == 2 and words.dtype == torch.int32, (words.dim(), words.dtype)
    shifts = torch.tensor(_SHIFTS, dtype=torch.int32, device=words.device)
    # nibbles: [R, N/8, 8] in packed order; arithmetic shift then mask is sign-safe
    nibbles = torch.bitwise_and(torch.bitwise_right_shift(words[:, :, None], shifts), 0xF)
    logical = nibbles[:, :, list(AWQ_REVERSE_ORDER)]
    return logical.reshape(words.shape[0], -1)


def dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Plain-torch reference: AWQ GEMM tensors -> float32 W [in, out] (transpose of Linear.weight)."""
    q = unpack_int4(qweight)  # [K, N]
    z = unpack_int4(qzeros)  # [K/G, N]
    assert q.shape[0] == z.shape[0] * group_size, (tuple(q.shape), tuple(z.shape), group_size)
    assert scales.shape == z.shape, (tuple(scales.shape), tuple(z.shape))
    z = z.repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return (q - z).float() * s


def group_scales_zeros(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit range per group of `group_size` input channels (AutoAWQ's rule).

    weight: float [N, K] (nn.Linear layout). Returns scales float16 [K/G, N] and zeros int32
    [K/G, N]. Scales are rounded to float16 here so that quantization uses exactly the values
    that will be stored.
    """
    out_f, in_f = weight.shape
    assert in_f % group_size == 0, (in_f, group_size)
    w = weight.float().reshape(out_f, in_f // group_size, group_size)
    max_val = w.amax(dim=-1)
    min_val = w.amin(dim=-1)
    scales = ((max_val - min_val).clamp(min=1e-5) / 15).half().float()
    zeros = (-torch.round(min_val / scales)).clamp(0, 15)
    return scales.t().contiguous().half(), zeros.t().contiguous().to(torch.int32)


def quantize_to_int(
    weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """weight float [N, K], scales/zeros [K/G, N] -> int32 q [K, N] in [0, 15]."""
    s = scales.float().repeat_interleave(group_size, dim=0)  # [K, N]
    z = zeros.float().repeat_interleave(group_size, dim=0)
    q = torch.clamp(torch.round(weight.float().t() / s) + z, 0, 15)
    return q.to(torch.int32)


def pack_linear_weight(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest group quantization of an nn.Linear weight [N, K] into AWQ GEMM tensors.

    Returns (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales float16 [K/G, N]).
    """
    scales, zeros = group_scales_zeros(weight, group_size)
    q = quantize_to_int(weight, scales, zeros, group_size)
    return pack_int4(q), pack_int4(zeros), scales


def fake_quantize(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Quantize-dequantize a weight [N, K] with RTN (used by the AWQ searches); float32 [N, K].

    Same numbers as dequantize(pack_linear_weight(w)).t(); written with in-place ops because
    the searches call it hundreds of times per layer.
    """
    out_f, in_f = weight.shape
    w = weight.float().reshape(-1, group_size)
    min_val, max_val = torch.aminmax(w, dim=-1, keepdim=True)
    scales = ((max_val - min_val).clamp_(min=1e-5) / 15).half().float()
    zeros = (-min_val / scales).round_().clamp_(0, 15)
    q = (w / scales).round_().add_(zeros).clamp_(0, 15).sub_(zeros).mul_(scales)
    return q.reshape(out_f, in_f)
