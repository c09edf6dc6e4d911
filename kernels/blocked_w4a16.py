"""W4A16 (and W8A16) GEMM on the runtime's blocked quantized format, read directly.

The format is quant/int4_format.py's `BlockedQuantWeight`, the one the CPU kernels read
(kernels/csrc/linear_int4.c): blocks of 16 output rows; 4-bit data uint8 [NB, K, 8], byte j of
(b, k) = row 16 b + j (low nibble) | row 16 b + j + 8 (high); 5-bit data uint8 [NB, K, 10], the
4-bit form's 8 bytes then 2 bytes of fifth bits (bit j: row 16 b + j, weighing 16, or -16 when
signed); 6-bit data [NB, K, 12], then 2 bytes of sixth bits (32, or -32); 2-bit data
[NB, K, 4], row 16 b + j at bits 2 (j % 4) of byte j // 4; 3-bit data [NB, K, 6], a 48-bit
little-endian value, row 16 b + j at bits 3 j (two's complement when signed); 8-bit data int8 [NB, K, 16]; 4-bit codebook indices (IQ4: the value is
codebook[q], a 16-entry lookup); scales / offsets [NB, K / G, 16] fp16 or fp32, or int8 codes
(4-bit codes: uint8 [NB, K / G / 2, 16], group 2 i in byte i's low nibble, 2 i + 1 in its high
one) times fp16 super parameters [NB, K / 256, 16] (the K types' two levels, multiplied in fp32:
exact); offsets None: zero.
W[n, k] = s q + o.
So a GGUF model (every served block type, quant/gguf_blocks.py) or an AutoAWQ one converted once
serves both back ends from the same bytes. y = x @ W^T, x [M, K] -> y [M, N] in x's dtype, fp32 accumulation.

`blocked_gemm_ref` is the plain-torch reference (dequantize, matmul in fp32); `blocked_gemm_triton`
the kernel: a tile of BLOCK_M rows x BLOCK_N outputs (a whole number of 16-row blocks) walks K in
steps of BLOCK_K, expands each weight tile from its bytes (each byte is read for its two nibbles),
applies the tile's group parameters (BLOCK_K divides the group size) and multiplies with tl.dot.
`tile_plan(m, group_size)` picks the tile: 16 rows for decode steps (up to 16 sequences), 64 for
prefill chunks, so the weights are read once per 64 prompt tokens; outputs in tiles of 64
(4 blocks). The CUDA back end runs every QuantLinear through it (kernels/cpu_int4.py,
kernels/dispatch.py `blocked_gemm`); kernels/launch_variants.py lists the variants it launches.
Status: tested under TRITON_INTERPRET=1 against the reference on tiny shapes and through the CUDA
back end on a tiny model; not tuned or timed on a GPU yet (docs/perf-gpu.md holds the
GPU figures).
"""
from __future__ import annotations

import torch

from edge_runtime.quant.int4_format import BLOCK_N, BlockedQuantWeight

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def blocked_gemm_ref(x: torch.Tensor, weight: BlockedQuantWeight) -> torch.Tensor:
    """x [M, K] -> [M, N] (x's dtype): the dequantized weight, matmul in fp32."""
    assert x.dim() == 2 and x.shape[1] == weight.in_features, (tuple(x.shape), weight.in_features)
    w = weight.dequantize().to(x.device)  # [N, K]
    return (x.float() @ w.t()).to(x.dtype)


if triton is not None:
    @triton.jit
    def _blocked_gemm_kernel(x_ptr, data_ptr, sc_ptr, off_ptr, ssc_ptr, soff_ptr, book_ptr, y_ptr,
                             M, N, K, group_size, s_xm, s_ym, BITS: tl.constexpr,
                             SIGNED: tl.constexpr, HAS_OFFSETS: tl.constexpr,
                             TWO_LEVEL: tl.constexpr, CODES4: tl.constexpr, HAS_BOOK: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_NT: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        NB, KG = (N + 15) // 16, K // group_size  # derived here: fewer arguments to specialise on
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        cols = pid_n * BLOCK_NT + tl.arange(0, BLOCK_NT)  # [BN]: output rows of W
        block, lane = cols // 16, cols % 16
        in_blocks = block < NB  # the last tile may reach past the last block: read nothing there
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_NT), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks  # [BK]
            x = tl.load(x_ptr + rows[:, None] * s_xm + k[None, :],
                        mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
            if BITS == 4:  # [BK, BN] bytes, each holding two rows' nibbles
                byte = tl.load(data_ptr + block[None, :] * K * 8 + k[:, None] * 8 + lane[None, :] % 8,
                               mask=(k[:, None] < K) & in_blocks[None, :], other=0)
                q = (byte.to(tl.int32) >> ((lane[None, :] // 8) * 4)) & 0xF
                if HAS_BOOK:  # the index's codebook value (a 16-entry int8 table, cached)
                    q = tl.load(book_ptr + q)
                q = q.to(tl.float32)
            elif BITS == 2:  # bits 2 (j % 4) of byte j // 4
                byte = tl.load(data_ptr + block[None, :] * K * 4 + k[:, None] * 4 + lane[None, :] // 4,
                               mask=(k[:, None] < K) & in_blocks[None, :], other=0).to(tl.int32)
                q = ((byte >> ((lane[None, :] % 4) * 2)) & 3).to(tl.float32)
            elif BITS == 3:  # bits 3 j .. 3 j + 2 of the 48-bit line: byte 3 j // 8 and the next
                line = data_ptr + block[None, :] * K * 6 + k[:, None] * 6
                inside = (k[:, None] < K) & in_blocks[None, :]
                at = (3 * lane[None, :]) // 8
                two = tl.load(line + at, mask=inside, other=0).to(tl.int32)
                two = two | (tl.load(line + at + 1, mask=inside & (at < 5), other=0).to(tl.int32) << 8)
                q = (two >> ((3 * lane[None, :]) % 8)) & 7
                if SIGNED:
                    q = q - 8 * (q >> 2)
                q = q.to(tl.float32)
            elif BITS == 5 or BITS == 6:  # the nibble, then bit 4 (+ 5) from byte 8 (+ 2) + j // 8
                line = data_ptr + block[None, :] * K * (2 * BITS) + k[:, None] * (2 * BITS)
                inside = (k[:, None] < K) & in_blocks[None, :]
                byte = tl.load(line + lane[None, :] % 8, mask=inside, other=0).to(tl.int32)
                high = tl.load(line + 8 + lane[None, :] // 8, mask=inside, other=0).to(tl.int32)
                fifth = (high >> (lane[None, :] % 8)) & 1
                q = (byte >> ((lane[None, :] // 8) * 4)) & 0xF
                if BITS == 5:
                    q = q + fifth * (-16 if SIGNED else 16)
                else:
                    top = tl.load(line + 10 + lane[None, :] // 8, mask=inside, other=0).to(tl.int32)
                    sixth = (top >> (lane[None, :] % 8)) & 1
                    q = q + fifth * 16 + sixth * (-32 if SIGNED else 32)
                q = q.to(tl.float32)
            else:
                q = tl.load(data_ptr + block[None, :] * K * 16 + k[:, None] * 16 + lane[None, :],
                            mask=(k[:, None] < K) & in_blocks[None, :], other=0).to(tl.float32)
            g = k0 // group_size  # BLOCK_K divides the group size: one group per step
            if CODES4:  # two groups a byte: g's code in byte g // 2's low (even g) or high nibble
                param = block * (KG // 2) * 16 + (g // 2) * 16 + lane
            else:
                param = block * KG * 16 + g * 16 + lane  # [BN]
            scale = tl.load(sc_ptr + param, mask=in_blocks, other=0)
            if CODES4:
                scale = (scale.to(tl.int32) >> ((g % 2) * 4)) & 0xF
            scale = scale.to(tl.float32)
            if TWO_LEVEL:  # code x fp16 super (per 256 inputs): exact in fp32
                sup = block * (K // 256) * 16 + (k0 // 256) * 16 + lane
                scale = scale * tl.load(ssc_ptr + sup, mask=in_blocks, other=0).to(tl.float32)
            w = q * scale[None, :]
            if HAS_OFFSETS:
                offset = tl.load(off_ptr + param, mask=in_blocks, other=0)
                if CODES4:
                    offset = (offset.to(tl.int32) >> ((g % 2) * 4)) & 0xF
                offset = offset.to(tl.float32)
                if TWO_LEVEL:
                    offset = offset * tl.load(soff_ptr + sup, mask=in_blocks, other=0).to(tl.float32)
                w = w + offset[None, :]
            if x.dtype == tl.float32:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w.to(x.dtype))
        tl.store(y_ptr + rows[:, None] * s_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


def tile_plan(m: int, group_size: int) -> dict:
    """Tile sizes for `m` rows of x: BLOCK_M 16 (decode) or 64 (prefill), BLOCK_N 64, BLOCK_K the
    largest of 32 / 16 that divides the group size."""
    block_k = 32 if group_size % 32 == 0 else 16
    assert group_size % block_k == 0, group_size
    return {"block_m": 16 if m <= 16 else 64, "block_n": 64, "block_k": block_k}


def blocked_gemm_triton(x: torch.Tensor, weight: BlockedQuantWeight, *, block_m: int | None = None,
                        block_n: int | None = None, block_k: int | None = None) -> torch.Tensor:
    """x [M, K] (fp16 / bf16 / fp32, contiguous rows) -> [M, N] in x's dtype; tiles from
    `tile_plan` unless given."""
    m, k = x.shape
    g = weight.group_size
    plan = tile_plan(m, g)
    block_m, block_n, block_k = block_m or plan["block_m"], block_n or plan["block_n"], block_k or plan["block_k"]
    assert k == weight.in_features and x.stride(1) == 1, (tuple(x.shape), weight.in_features)
    assert block_n % BLOCK_N == 0 and g % block_k == 0, (block_n, block_k, g)
    n, nb = weight.out_features, weight.data.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    def given(t: torch.Tensor | None) -> torch.Tensor:
        return t if t is not None else weight.scales  # unread then

    grid = (triton.cdiv(m, block_m), triton.cdiv(nb * BLOCK_N, block_n))
    _blocked_gemm_kernel[grid](x, weight.data, weight.scales, given(weight.offsets),
                               given(weight.super_scales), given(weight.super_offsets),
                               given(weight.codebook), y, m, n, k, g, x.stride(0), y.stride(0),
                               BITS=weight.bits, SIGNED=weight.signed,
                               HAS_OFFSETS=weight.offsets is not None,
                               TWO_LEVEL=weight.super_scales is not None,
                               CODES4=weight.scales.dtype == torch.uint8,
                               HAS_BOOK=weight.codebook is not None, BLOCK_M=block_m,
                               BLOCK_NT=block_n, BLOCK_K=block_k)
    return y
