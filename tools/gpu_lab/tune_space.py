"""Launch-configuration search spaces that tools/gpu_check.py sweeps on a GPU.

Each entry is a `tune=` dict for the matching Triton wrapper (keys of its module's TUNE:
paged_attention, paged_decode, awq_gemm[...], awq_prepared[...]). Configs that only change the
grid (programs_per_sm) reuse one compiled kernel; the others each cost one compile. The FMA
variants keep the 3-D product tile (rows x BLOCK_K x BLOCK_N, or rows x BLOCK_N x head_dim) small
enough to stay in registers.
"""
from itertools import product


def attention_decode_space() -> list[dict]:
    """kernels/paged_attention.py's decode: tl.dot or FMA x tile rows x warps x programs per SM x
    stages."""
    space = []
    for fma, block_n, warps, pps, stages in product((False, True), (16, 32, 64, 128), (2, 4, 8), (4, 8, 16, 32),
                                                    (2, 3)):
        if fma and block_n > 64 or not fma and block_n < 32 or stages == 3 and pps in (4, 32):
            continue
        space.append(dict(fma=fma, block_n=block_n, num_warps=warps, programs_per_sm=pps, num_stages=stages))
    return space


def prefill_space() -> list[dict]:
    return [dict(prefill_rows=r, prefill_block_n=b, prefill_warps=w, num_stages=s)
            for r, b, w, s in product((32, 64, 128), (32, 64), (4, 8), (2, 3))]


def gemv_space(m: int) -> list[dict]:
    """W4A16 configs for an M-row GEMV. The dot path pads M to 16 rows; FMA uses next_pow2(M)."""
    fma_rows = 1 << max(0, (m - 1).bit_length())
    space = []
    for unpack, fma, block_n, block_k, pps in product(("interleave", "perm"), (False, True), (64, 128, 256),
                                                      (32, 64, 128), (1, 2, 4, 8)):
        tile = (fma_rows if fma else 1) * block_k * block_n
        if tile > 16384:
            continue
        space.append(dict(unpack=unpack, fma=fma, block_n=block_n, block_k=block_k, programs_per_sm=pps,
                          num_warps=4, num_stages=3))
    return space


def paged_decode_space() -> list[dict]:
    """gpu_lab/paged_decode.py: int8 tensor cores or FMA x tile rows x warps x programs per SM (the
    split count) x stages."""
    return [dict(idot=i, block_n=b, num_warps=w, programs_per_sm=p, num_stages=s)
            for i, b, w, p, s in product((True, False), (16, 32, 64, 128), (2, 4, 8), (8, 16, 32), (1, 2))
            if not (b == 16 and (i or w == 8)) and not (b == 128 and w == 2 and not i)]


def prepared_space(m: int) -> list[dict]:
    """kernels/awq_prepared.py for an M-row GEMV: FMA (M <= 8) and dot paths."""
    space = []
    for dot, block_n, block_k, pps, warps in product((False, True), (32, 64, 128), (64, 128), (4, 8, 16), (4, 8)):
        if not dot and (m > 8 or block_n * max(1, m) > 128 * 2) or dot and block_n < 64:
            continue
        space.append(dict(dot=dot, block_n=block_n, block_k=block_k, programs_per_sm=pps, num_warps=warps,
                          num_stages=3))
    return space
