"""W4A16 GEMM/GEMV on the AutoAWQ "GEMM" packing, read directly (no unpacked copy).

Packing (AutoAWQ GEMM): qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales fp16 [K/G, N].
Each int32 holds 8 columns; the nibble at bit 4*i holds column `AWQ_ORDER[i]` of its group of 8,
with AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7], so column c sits at bit 4*AWQ_REVERSE_ORDER[c].
Weights: W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n];  y = x @ W  (x [M, K] -> y [M, N]).

Output dtype is x's dtype; accumulation is float32 in both implementations.
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def check_awq_args(x, qweight, qzeros, scales, group_size) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K]; got shape {tuple(x.shape)}")
    k = x.shape[1]
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(f"qweight and qzeros must be int32; got {qweight.dtype} and {qzeros.dtype}")
    if qweight.dim() != 2 or qweight.shape[0] != k:
        raise ValueError(f"qweight must be [K={k}, N/8]; got {tuple(qweight.shape)}")
    n = qweight.shape[1] * 8
    if group_size <= 0 or k % group_size:
        raise ValueError(f"group_size {group_size} must be positive and divide K={k}")
    groups = k // group_size
    if tuple(qzeros.shape) != (groups, n // 8):
        raise ValueError(f"qzeros must be [K/G={groups}, N/8={n // 8}]; got {tuple(qzeros.shape)}")
    if tuple(scales.shape) != (groups, n):
        raise ValueError(f"scales must be [K/G={groups}, N={n}]; got {tuple(scales.shape)}")
    if not scales.is_floating_point():
        raise ValueError(f"scales must be floating point (fp16); got {scales.dtype}")


def unpack_awq_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] in AWQ order -> int32 [R, C] values in 0..15."""
    shifts = torch.tensor(AWQ_REVERSE_ORDER, dtype=torch.int32, device=packed.device) * 4  # [8]
    vals = (packed.unsqueeze(-1) >> shifts) & 0xF  # [R, C/8, 8]
    return vals.reshape(packed.shape[0], -1)


def dequantize_awq(qweight, qzeros, scales, group_size) -> torch.Tensor:
    """-> float32 W [K, N]."""
    q = unpack_awq_int4(qweight)  # [K, N]
    z = unpack_awq_int4(qzeros).repeat_interleave(group_size, dim=0)  # [K, N]
    s = scales.float().repeat_interleave(group_size, dim=0)  # [K, N]
    return (q - z).float() * s


def awq_gemm_ref(x, qweight, qzeros, scales, group_size) -> torch.Tensor:
    """Torch reference: dequantize then matmul in float32. x [M, K] -> [M, N] (x.dtype)."""
    check_awq_args(x, qweight, qzeros, scales, group_size)
    w = dequantize_awq(qweight, qzeros, scales, group_size)  # [K, N]
    return (x.float() @ w).to(x.dtype)
