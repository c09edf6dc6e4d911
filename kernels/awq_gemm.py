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


if triton is not None:

    @triton.jit
    def _unpack_tile(qw_ptr, qz_ptr, k, pid_n, grp, s_qwk, s_qzg, N,
                     BLOCK_N: tl.constexpr, UNPACK: tl.constexpr):
        # -> (q [BLOCK_K, BLOCK_N], z [BLOCK_N]) int32 nibbles for local columns j, whose global
        # column is _columns(pid_n, ...)[j]
        j = tl.arange(0, BLOCK_N)
        if UNPACK == 2:  # perm: column j holds packed nibble j % 8 of word j // 8; no repetition
            n8 = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
            m8 = n8 < N // 8
            qw = tl.load(qw_ptr + k[:, None] * s_qwk + n8[None, :], mask=m8[None, :], other=0)
            qz = tl.load(qz_ptr + grp * s_qzg + n8, mask=m8, other=0)
            sh = tl.arange(0, 8) * 4
            q = tl.reshape((qw[:, :, None] >> sh[None, None, :]) & 0xF, [qw.shape[0], BLOCK_N])
            z = tl.reshape((qz[:, None] >> sh[None, :]) & 0xF, [BLOCK_N])
            return q, z
        n = pid_n * BLOCK_N + j
        c = n % 8
        shifts = ((c % 2) * 4 + c // 2) * 4  # bit offset of column c: 4 * AWQ_REVERSE_ORDER[c]
        nmask = n < N
        if UNPACK == 1:  # interleave: load each word once, repeat it 8x along N in registers
            n8 = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
            qw = tl.load(qw_ptr + k[:, None] * s_qwk + n8[None, :], mask=(n8 < N // 8)[None, :], other=0)
            qw = tl.interleave(qw, qw)
            qw = tl.interleave(qw, qw)
            qw = tl.interleave(qw, qw)
        else:  # gather: the 8 columns of a word each load it (served by L1)
            qw = tl.load(qw_ptr + k[:, None] * s_qwk + (n // 8)[None, :], mask=nmask[None, :], other=0)
        qz = tl.load(qz_ptr + grp * s_qzg + n // 8, mask=nmask, other=0)
        return (qw >> shifts[None, :]) & 0xF, (qz >> shifts) & 0xF

    @triton.jit
    def _columns(pid_n, BLOCK_N: tl.constexpr, UNPACK: tl.constexpr):
        j = tl.arange(0, BLOCK_N)
        if UNPACK == 2:  # packed position i holds column AWQ_ORDER[i] = (i % 4) * 2 + i // 4
            return pid_n * BLOCK_N + (j // 8) * 8 + ((j % 8) % 4) * 2 + (j % 8) // 4
        return pid_n * BLOCK_N + j

    @triton.jit
    def _awq_gemm_kernel(x_ptr, qw_ptr, qz_ptr, sc_ptr, y_ptr, M, N, K, group_size,
                         s_xm, s_qwk, s_qzg, s_scg, s_ys, s_ym,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr, UNPACK: tl.constexpr, FMA: tl.constexpr):
        # y[split, m, n] = sum over this split's k tiles of x[m, k] * W[k, n]; BLOCK_K divides G
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n = _columns(pid_n, BLOCK_N, UNPACK)  # [BLOCK_N] global column of each local column
        mmask = m < M
        nmask = n < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kt in range(pid_k, K // BLOCK_K, SPLIT_K):
            k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            grp = (kt * BLOCK_K) // group_size
            x = tl.load(x_ptr + m[:, None] * s_xm + k[None, :], mask=mmask[:, None], other=0.0)
            q, z = _unpack_tile(qw_ptr, qz_ptr, k, pid_n, grp, s_qwk, s_qzg, N, BLOCK_N, UNPACK)
            sc = tl.load(sc_ptr + grp * s_scg + n, mask=nmask, other=0.0)
            if FMA:  # CUDA cores: no dot-operand shuffles, for the smallest M
                w = (q - z[None, :]).to(tl.float32) * sc.to(tl.float32)[None, :]
                acc += tl.sum(x.to(tl.float32)[:, :, None] * w[None, :, :], axis=1)
            else:
                w = (q - z[None, :]).to(tl.float16) * sc.to(tl.float16)[None, :]
                acc += tl.dot(x.to(tl.float16), w)
        ptrs = y_ptr + pid_k * s_ys + m[:, None] * s_ym + n[None, :]
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])

    @triton.jit
    def _sum_splits_kernel(p_ptr, y_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
        # y[i] = sum_s p[s, i] (p: [SPLIT_K, M*N] fp32 contiguous), cast to y's dtype
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        acc = tl.zeros([BLOCK], tl.float32)
        for s in range(SPLIT_K):
            acc += tl.load(p_ptr + s * numel + i, mask=mask, other=0.0)
        tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=mask)


    @triton.jit
    def _awq_dequant_kernel(qw_ptr, qz_ptr, sc_ptr, w_ptr, N, group_size, s_qwk, s_qzg, s_scg, s_wk,
                            BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, UNPACK: tl.constexpr):
        # W[k, n] = (q - z) * s as fp16 [K, N], one [BLOCK_K, BLOCK_N] tile per program
        pid_k = tl.program_id(0)
        pid_n = tl.program_id(1)
        k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        n = _columns(pid_n, BLOCK_N, UNPACK)
        nmask = n < N
        grp = (pid_k * BLOCK_K) // group_size
        q, z = _unpack_tile(qw_ptr, qz_ptr, k, pid_n, grp, s_qwk, s_qzg, N, BLOCK_N, UNPACK)
        sc = tl.load(sc_ptr + grp * s_scg + n, mask=nmask, other=0.0)
        w = (q - z[None, :]).to(tl.float32) * sc.to(tl.float32)[None, :]
        tl.store(w_ptr + k[:, None] * s_wk + n[None, :], w.to(tl.float16), mask=nmask[None, :])

# Launch defaults per M class: "gemv1" (M = 1), "gemv" (M = 2..16), "gemm" (M > 16). gemv1 and gemv
# are the best configs of an H200 sweep (docs/perf-gpu.md, "Launch defaults: the H200 sweep");
# gemm is unswept.
# unpack: "gather" | "interleave" | "perm" (see _unpack_tile); fma: CUDA-core inner product.
TUNE = {"gemv1": {"block_n": 256, "block_k": 64, "programs_per_sm": 2, "num_warps": 4, "num_stages": 3,
                  "unpack": "interleave", "fma": True},
        "gemv": {"block_n": 64, "block_k": 64, "programs_per_sm": 4, "num_warps": 4, "num_stages": 3,
                 "unpack": "perm", "fma": False},
        "gemm": {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3,
                 "unpack": "interleave", "fma": False, "mode": "tiled"}}
# gemm "mode": "tiled" (the kernel above) or "dequant" (awq_dequantize_triton to a transient fp16
# [K, N], then torch's fp16 matmul; K*N*2 bytes of scratch per call). Not yet timed on a GPU.
UNPACK_MODES = {"gather": 0, "interleave": 1, "perm": 2}


def _config(m, n, k, group_size, device, tune) -> dict:
    """Block sizes, SPLIT_K and launch options; GEMV-like M splits K to give every SM work."""
    kind = "gemv1" if m == 1 else ("gemv" if m <= 16 else "gemm")
    cfg = {**TUNE[kind], **(tune or {})}
    block_k = min(group_size, cfg["block_k"])
    while group_size % block_k or block_k & (block_k - 1):
        block_k //= 2
    cfg["block_k"] = block_k
    if kind == "gemm":
        cfg["split_k"] = cfg.get("split_k") or 1
        return cfg
    cfg["block_m"] = max(1, triton.next_power_of_2(m)) if cfg["fma"] else 16
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    tiles = -(-n // cfg["block_n"])
    want = -(-cfg["programs_per_sm"] * sms // tiles)
    cfg["split_k"] = cfg.get("split_k") or max(1, min(k // block_k, want, 32))
    return cfg


def awq_gemm_triton(x, qweight, qzeros, scales, group_size, *, split_k=None, tune=None):
    """Triton W4A16 GEMM with the reference's signature; `split_k` overrides the K split and `tune`
    (keys of TUNE[...]) the launch configuration."""
    check_awq_args(x, qweight, qzeros, scales, group_size)
    assert triton is not None, "triton is not installed"
    if group_size < 16:
        raise ValueError(f"group_size {group_size} is below the kernel's minimum of 16")
    for name, t in (("x", x), ("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dimension; call .contiguous() first")
    m, k = x.shape
    n = qweight.shape[1] * 8
    cfg = _config(m, n, k, group_size, x.device, dict(tune or {}, split_k=split_k))
    bm, bn, bk, split = cfg["block_m"], cfg["block_n"], cfg["block_k"], cfg["split_k"]
    if cfg.get("mode") == "dequant" and m > 0:
        w = awq_dequantize_triton(qweight, qzeros, scales, group_size)  # [K, N] fp16
        return (x.to(torch.float16) @ w).to(x.dtype)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    part = y.unsqueeze(0) if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    _awq_gemm_kernel[grid](x, qweight, qzeros, scales, part, m, n, k, group_size,
                           x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0),
                           part.stride(0), part.stride(1),
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                           UNPACK=UNPACK_MODES[cfg["unpack"]], FMA=bool(cfg["fma"]) and bm <= 16,
                           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if split > 1:
        numel = m * n
        _sum_splits_kernel[(triton.cdiv(numel, 1024),)](part, y, numel, SPLIT_K=split, BLOCK=1024)
    return y


def awq_dequantize_triton(qweight, qzeros, scales, group_size, *, block_k=32, block_n=128,
                          unpack="interleave"):
    """AutoAWQ GEMM tensors -> fp16 W [K, N] on the GPU (the reference is dequantize_awq)."""
    k, n = qweight.shape[0], qweight.shape[1] * 8
    check_awq_args(torch.empty(0, k, device=qweight.device), qweight, qzeros, scales, group_size)
    assert triton is not None, "triton is not installed"
    block_k = min(block_k, group_size)
    if group_size % block_k:
        raise ValueError(f"group_size {group_size} must be a multiple of block_k {block_k}")
    w = torch.empty(k, n, dtype=torch.float16, device=qweight.device)
    grid = (triton.cdiv(k, block_k), triton.cdiv(n, block_n))
    _awq_dequant_kernel[grid](qweight, qzeros, scales, w, n, group_size, qweight.stride(0), qzeros.stride(0),
                              scales.stride(0), w.stride(0), BLOCK_K=block_k, BLOCK_N=block_n,
                              UNPACK=UNPACK_MODES[unpack])
    return w
