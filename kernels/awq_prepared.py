"""W4A16 on a kernel-friendly layout made ONCE at load time from the AutoAWQ GEMM packing.

`prepare_awq_weight(qweight, qzeros, scales, group_size)` -> PreparedAWQ:
  qweight8 int32 [K/8, N]: word (j, n) holds q[8j + i, n] at bits 4i..4i+3 (8 consecutive k of one
            column, so one 32-bit load feeds 8 multiply-adds; a row of columns is contiguous, so a
            thread holding several columns reuses each x value from registers);
  zeros     uint8 [K/G, N] (0..15);  scales fp16 [K/G, N] (unchanged);
  counters  int32 [N/8 + 1] zeros: the split-K semaphores (see below).
Same bytes per weight as AutoAWQ (plus 1 byte per group per column for the zeros).

`awq_gemm_prepared(x, packed)` = x @ W with W[k, n] = (q - z) * s, x [M, K] -> [M, N] (x.dtype),
fp32 accumulation. FMA path (M <= 8): nibble -> fp32 with the magic number ((nib | 0x4B000000)
read as float is 2^23 + nib; subtracting 2^23 + z is exact), so q - z costs a shift, one logic op
and one float add; products accumulate elementwise in [M, BLOCK_N, BLOCK_K/8] registers and are
reduced across threads once, after the K loop. Every tile lies in one quantization group (BLOCK_K
divides G), so the scale multiplies the tile's partial products, not every weight. Dot path (larger
M): fp16 magic (0x6400 | nib = 1024 + nib), tl.dot with fp32 accumulation.

Split-K without a second launch: each split stores its fp32 partial [M, BLOCK_N], then increments
the column tile's counter (acq_rel, after a CTA barrier); the split that sees SPLIT_K - 1 sums all
partials, writes y and resets the counter to 0. Invariant: counters are 0 between calls, so calls
on ONE PreparedAWQ must not run concurrently on two CUDA streams.
"""
from typing import NamedTuple

import torch

from edge_runtime.kernels.awq_gemm import check_awq_args, unpack_awq_int4

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


class PreparedAWQ(NamedTuple):
    qweight8: torch.Tensor  # int32 [K/8, N]
    zeros: torch.Tensor  # uint8 [K/G, N]
    scales: torch.Tensor  # fp16 [K/G, N]
    counters: torch.Tensor  # int32 [N/8 + 1], zeros between calls
    group_size: int

    @property
    def shape(self):  # (K, N)
        return self.qweight8.shape[0] * 8, self.qweight8.shape[1]


def prepare_awq_weight(qweight, qzeros, scales, group_size) -> PreparedAWQ:
    """AutoAWQ GEMM tensors -> PreparedAWQ on the same device (transient int64 [K/8, N] memory)."""
    k = qweight.shape[0]
    check_awq_args(torch.empty(0, k, device=qweight.device), qweight, qzeros, scales, group_size)
    if k % 8:
        raise ValueError(f"K={k} must be a multiple of 8")
    q = unpack_awq_int4(qweight)  # int32 [K, N]
    n = q.shape[1]
    words = torch.zeros(k // 8, n, dtype=torch.int64, device=q.device)
    for i in range(8):
        words |= q[i::8].to(torch.int64) << (4 * i)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # two's complement
    zeros = unpack_awq_int4(qzeros).to(torch.uint8)  # [K/G, N]
    counters = torch.zeros(n // 8 + 1, dtype=torch.int32, device=q.device)
    return PreparedAWQ(words, zeros.contiguous(), scales.contiguous(), counters,
                       int(group_size))


def dequantize_prepared(packed: PreparedAWQ) -> torch.Tensor:
    """-> float32 W [K, N] (the reference's view of the prepared layout)."""
    w = packed.qweight8  # [K/8, N]
    shifts = torch.arange(8, device=w.device, dtype=torch.int32) * 4
    q = ((w.unsqueeze(1) >> shifts[None, :, None]) & 0xF).reshape(-1, w.shape[1])  # [K, N]
    g = packed.group_size
    z = packed.zeros.to(torch.int32).repeat_interleave(g, dim=0)
    return (q - z).float() * packed.scales.float().repeat_interleave(g, dim=0)


def awq_gemm_prepared_ref(x, packed: PreparedAWQ) -> torch.Tensor:
    """Torch reference: dequantize the prepared layout, matmul in fp32. x [M, K] -> [M, N] x.dtype."""
    k, _ = packed.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [M, K={k}]; got shape {tuple(x.shape)}")
    return (x.float() @ dequantize_prepared(packed)).to(x.dtype)


if triton is not None:

    @triton.jit
    def _tile_w16(w_ptr, z_ptr, n, nmask, kt, grp, s_wk, s_zg, BLOCK_K: tl.constexpr):
        # -> (q - z) fp16 [BLOCK_K, BLOCK_N] (exact): 0x6400 | nib is the fp16 1024 + nib
        j = kt * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        words = tl.load(w_ptr + j[:, None] * s_wk + n[None, :], mask=nmask[None, :], other=0)
        words = words.to(tl.uint32, bitcast=True)  # logical shifts
        nib = (words[:, None, :] >> (tl.arange(0, 8) * 4).to(tl.uint32)[None, :, None]) & 0xF  # [BK/8, 8, BN]
        z = tl.load(z_ptr + grp * s_zg + n, mask=nmask, other=0).to(tl.int32)  # [BN]
        h = (nib | 0x6400).to(tl.uint16).to(tl.float16, bitcast=True)
        return tl.reshape(h, [BLOCK_K, n.shape[0]]) - (z + 1024).to(tl.float16)[None, :]

    @triton.jit
    def _nib_fma(t3, words, xi, zf, I: tl.constexpr):
        # t3 [BM, BK/8, BN] += x[m, 8j + I] * (q_I - z): magic float, exact q - z
        f = (((words >> (4 * I)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - zf[None, :]
        return t3 + xi[:, :, None] * f[None, :, :]

    @triton.jit
    def _fma_tile(x_ptr, w_ptr, z_ptr, m, mmask, n, nmask, kt, grp, s_xm, s_wk, s_zg,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # -> [BLOCK_M, BLOCK_K/8, BLOCK_N] fp32 partial products, unscaled; no cross-thread
        # reduction here. x is loaded once as [BM, BK/8, 8] (one 16-byte load per row of 8) and
        # split in registers into the 8 nibble positions.
        j = kt * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        words = tl.load(w_ptr + j[:, None] * s_wk + n[None, :], mask=nmask[None, :], other=0)  # [BK/8, BN]
        words = words.to(tl.uint32, bitcast=True)  # logical shifts: no sign handling
        zf = tl.load(z_ptr + grp * s_zg + n, mask=nmask, other=0).to(tl.float32) + 8388608.0  # [BN]
        i8 = tl.arange(0, 8)
        x3 = tl.load(x_ptr + m[:, None, None] * s_xm + (j * 8)[None, :, None] + i8[None, None, :],
                     mask=mmask[:, None, None], other=0.0).to(tl.float32)  # [BM, BK/8, 8]
        x_even, x_odd = tl.split(tl.reshape(x3, [BLOCK_M, BLOCK_K // 8, 4, 2]))  # i % 2
        x0, x2, x4, x6 = _split4(x_even)
        x1, x3_, x5, x7 = _split4(x_odd)
        t3 = tl.zeros([BLOCK_M, BLOCK_K // 8, BLOCK_N], tl.float32)
        t3 = _nib_fma(t3, words, x0, zf, 0)
        t3 = _nib_fma(t3, words, x1, zf, 1)
        t3 = _nib_fma(t3, words, x2, zf, 2)
        t3 = _nib_fma(t3, words, x3_, zf, 3)
        t3 = _nib_fma(t3, words, x4, zf, 4)
        t3 = _nib_fma(t3, words, x5, zf, 5)
        t3 = _nib_fma(t3, words, x6, zf, 6)
        t3 = _nib_fma(t3, words, x7, zf, 7)
        return t3

    @triton.jit
    def _split4(x):
        # x [BM, BK/8, 4] holding positions (p0, p1, p2, p3) -> the four [BM, BK/8] slices
        a, b = tl.split(tl.reshape(x, [x.shape[0], x.shape[1], 2, 2]))  # a: p0, p2; b: p1, p3
        p0, p2 = tl.split(a)
        p1, p3 = tl.split(b)
        return p0, p1, p2, p3


    @triton.jit
    def _prepared_kernel(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, y_ptr, cnt_ptr, M, N, K,
                         s_xm, s_wk, s_zg, s_sg, s_ps, s_pm, s_ym,
                         G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, DOT: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < N
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = m < M
        tiles = K // BLOCK_K
        per = tl.cdiv(tiles, SPLIT_K)  # each split takes a contiguous run of k tiles
        if DOT:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        else:
            acc3 = tl.zeros([BLOCK_M, BLOCK_K // 8, BLOCK_N], tl.float32)
        for kt in range(pid_k * per, tl.minimum(tiles, pid_k * per + per)):
            grp = (kt * BLOCK_K) // G
            sc = tl.load(s_ptr + grp * s_sg + n, mask=nmask, other=0.0).to(tl.float32)  # [BN]
            if DOT:
                w = _tile_w16(w_ptr, z_ptr, n, nmask, kt, grp, s_wk, s_zg, BLOCK_K)  # [BK, BN]
                k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
                x = tl.load(x_ptr + m[:, None] * s_xm + k[None, :], mask=mmask[:, None], other=0.0)
                acc += tl.dot(x.to(tl.float16), w) * sc[None, :]  # [BM, BN]
            else:
                t3 = _fma_tile(x_ptr, w_ptr, z_ptr, m, mmask, n, nmask, kt, grp, s_xm, s_wk, s_zg,
                               BLOCK_M, BLOCK_N, BLOCK_K)
                acc3 += t3 * sc[None, None, :]
        if not DOT:
            acc = tl.sum(acc3, axis=1)  # [BM, BN]: the only cross-thread reduction
        omask = mmask[:, None] & nmask[None, :]
        if SPLIT_K == 1:
            tl.store(y_ptr + m[:, None] * s_ym + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=omask)
        else:
            tl.store(part_ptr + pid_k * s_ps + m[:, None] * s_pm + n[None, :], acc, mask=omask)
            tl.debug_barrier()  # every thread's partial is issued before the release below
            cnt_at = cnt_ptr + pid_m * tl.num_programs(0) + pid_n
            done = tl.atomic_add(cnt_at, 1, sem="acq_rel")
            if done == SPLIT_K - 1:  # the last split of this tile: reduce and reset
                tot = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for s in range(SPLIT_K):
                    tot += tl.load(part_ptr + s * s_ps + m[:, None] * s_pm + n[None, :], mask=omask,
                                   other=0.0, cache_modifier=".cg")
                tl.store(y_ptr + m[:, None] * s_ym + n[None, :], tot.to(y_ptr.dtype.element_ty), mask=omask)
                tl.atomic_xchg(cnt_at, 0)


    @triton.jit
    def _prepared_dequant_kernel(w_ptr, z_ptr, s_ptr, out_ptr, N, s_wk, s_zg, s_sg, s_ok,
                                 G: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
        # W[k, n] = (q - z) * s as fp16 [K, N], one [BLOCK_K, BLOCK_N] tile (inside one group) per program
        pid_k = tl.program_id(0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        nmask = n < N
        grp = (pid_k * BLOCK_K) // G
        w = _tile_w16(w_ptr, z_ptr, n, nmask, pid_k, grp, s_wk, s_zg, BLOCK_K)  # [BK, BN] fp16, exact
        sc = tl.load(s_ptr + grp * s_sg + n, mask=nmask, other=0.0).to(tl.float32)
        k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        tl.store(out_ptr + k[:, None] * s_ok + n[None, :], (w.to(tl.float32) * sc[None, :]).to(tl.float16),
                 mask=nmask[None, :])


def dequantize_prepared_triton(packed: PreparedAWQ, *, block_k=32, block_n=128) -> torch.Tensor:
    """PreparedAWQ -> fp16 W [K, N] on the GPU (reference: dequantize_prepared)."""
    assert triton is not None, "triton is not installed"
    k, n = packed.shape
    g = packed.group_size
    block_k = min(block_k, g)
    assert g % block_k == 0 and block_k % 8 == 0, "block_k must divide the group and be a multiple of 8"
    out = torch.empty(k, n, dtype=torch.float16, device=packed.qweight8.device)
    _prepared_dequant_kernel[(k // block_k, triton.cdiv(n, block_n))](
        packed.qweight8, packed.zeros, packed.scales, out, n, packed.qweight8.stride(0), packed.zeros.stride(0),
        packed.scales.stride(0), out.stride(0), G=g, BLOCK_K=block_k, BLOCK_N=block_n)
    return out


# Launch defaults per M class: the configs with the least total time over 4096x4096 and 4096x11008
# in the H200 sweep (docs/perf-gpu.md, "Launch defaults: the H200 sweep"). "gemv1" (M = 1) the
# FMA path; "gemv" (M = 2..16) the dot path, whose cost does not grow with M; "gemm" (M > 16) unswept.
TUNE = {"gemv1": {"block_n": 128, "block_k": 64, "programs_per_sm": 4, "num_warps": 8, "num_stages": 3,
                  "dot": False, "max_split": 32},
        "gemv": {"block_n": 64, "block_k": 128, "programs_per_sm": 8, "num_warps": 4, "num_stages": 3,
                 "dot": True, "max_split": 32},
        "gemm": {"block_m": 64, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3,
                 "dot": True, "programs_per_sm": 8, "max_split": 32, "dequant_above": 64}}
# "dequant_above": larger M dequantizes to a transient fp16 W [K, N] (K*N*2 bytes of scratch) and
# uses torch's matmul: at M=512 the tiled kernel took 95 / 251 us, dequant + matmul (the same mode of
# awq_gemm.py) 40 / 103 us on the H200; at M=16 the tiled kernel's 16.5 us beats the ~15 us dequant
# alone. The crossover (64) lies between these measured points and was not itself measured.


def launch_plan(m, n, k, g, device, tune) -> dict:
    """The launch configuration for x [M=m, K=k] @ W [K, N=n] in groups of g on `device`:
    TUNE's entry for the row count with `tune` on top, block_k fitted to the group, block_m to the
    rows, split_k chosen to fill the device's SMs unless given."""
    kind = "gemv1" if m == 1 else ("gemv" if m <= 16 else "gemm")
    cfg = {**TUNE[kind], **{key: v for key, v in (tune or {}).items() if v is not None}}
    bk = min(cfg["block_k"], g)
    while g % bk or bk & (bk - 1):
        bk //= 2
    cfg["block_k"] = bk
    if cfg["dot"] or m > 8:  # the FMA path keeps [M, BK/8, BN] in registers: M <= 8
        cfg["dot"] = True
        cfg["block_m"] = max(16, min(cfg.get("block_m", 16), triton.next_power_of_2(m)))
    else:
        cfg["block_m"] = triton.next_power_of_2(m)
    if -(-m // cfg["block_m"]) > 1:
        cfg["split_k"] = 1  # the semaphores cover one row of column tiles
    if not cfg.get("split_k"):
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        tiles = -(-n // cfg["block_n"]) * -(-m // cfg["block_m"])
        cfg["split_k"] = max(1, min(k // bk, -(-cfg["programs_per_sm"] * sms // tiles), cfg["max_split"]))
    return cfg


def awq_gemm_prepared_triton(x, packed: PreparedAWQ, *, tune=None):
    """Triton W4A16 on a PreparedAWQ; `tune` overrides keys of TUNE[...] (split_k among them)."""
    assert triton is not None, "triton is not installed"
    k, n = packed.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [M, K={k}]; got shape {tuple(x.shape)}")
    if x.stride(-1) != 1:
        raise ValueError("x needs a contiguous last dimension; call .contiguous() first")
    g = packed.group_size
    if g < 16:
        raise ValueError(f"group_size {g} is below the kernel's minimum of 16")
    m = x.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    cfg = launch_plan(m, n, k, g, x.device, tune)
    if m > cfg.get("dequant_above", m):
        return (x.to(torch.float16) @ dequantize_prepared_triton(packed)).to(x.dtype)
    bm, bn, split = cfg["block_m"], cfg["block_n"], cfg["split_k"]
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    assert split == 1 or (grid[2] == 1 and grid[0] <= packed.counters.numel()), "block_n >= 8, one M tile"
    part = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    _prepared_kernel[grid](x, packed.qweight8, packed.zeros, packed.scales, part, y, packed.counters,
                           m, n, k, x.stride(0), packed.qweight8.stride(0), packed.zeros.stride(0),
                           packed.scales.stride(0), part.stride(0) if split > 1 else 0,
                           part.stride(1) if split > 1 else 0, y.stride(0),
                           G=g, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg["block_k"], SPLIT_K=split,
                           DOT=bool(cfg["dot"]), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y
