"""Random quantized rows in every form the kernels take (quant/int4_format.py), for the kernel
tests of both back ends."""
from __future__ import annotations

import numpy as np
import torch

from edge_runtime.quant import gguf_blocks
from edge_runtime.quant.int4_format import GroupedRows


def random_rows(n: int, k: int, bits: int | str = 4, group: int = 32, param_dtype=torch.float16,
                offsets: bool = True, seed: int = 0) -> GroupedRows:
    """bits -3 / -5 / -6: signed 3- / 5- / 6-bit integers (Q3_K's, Q5_0's, Q6_K's form); "iq4":
    4-bit indices into the IQ4 codebook. param_dtype torch.int8: two-level parameters (int8 codes,
    fp16 super parameters per 256 inputs of either sign, subnormals in one row: the K types'
    form); torch.uint8: two-level with 4-bit codes 0..15 (Q2_K's)."""
    g = torch.Generator().manual_seed(seed)
    codebook = None
    if bits in (4, "iq4"):
        q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        if bits == "iq4":
            codebook, bits = torch.from_numpy(gguf_blocks.IQ4_CODEBOOK), 4
    elif bits in (2, 3, 5, 6):
        q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
    elif bits in (-3, -5, -6):
        half = 1 << (-bits - 1)
        q, bits = torch.randint(-half, half, (n, k), generator=g, dtype=torch.int8), -bits
    else:
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    if param_dtype in (torch.int8, torch.uint8):
        def two_level(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
            if param_dtype == torch.uint8:
                lo, hi = 0, 16
            codes = torch.randint(lo, hi, (n, k // group), generator=g, dtype=param_dtype)
            supers = torch.rand(n, k // 256, generator=g) * 0.02 + 0.001
            supers = supers * (torch.randint(0, 2, supers.shape, generator=g) * 2 - 1)
            supers[0] *= 1e-3  # fp16 subnormals
            return codes, supers.half()

        scales, super_scales = two_level(-32, 64)
        off, super_offsets = two_level(-128, 128) if offsets else (None, None)
        return GroupedRows(q, scales, off, bits, group, super_scales, super_offsets, codebook)
    scales = (torch.rand(n, k // group, generator=g) * 0.02 + 0.001).half()
    if param_dtype == torch.float32:  # as the sources' (d sc, AWQ's s): s q exact in fp32
        scales = scales.float() * torch.randint(1, 64, scales.shape, generator=g)
    off = (torch.randn(n, k // group, generator=g) * 0.05).to(param_dtype) if offsets else None
    return GroupedRows(q, scales, off, bits, group, codebook=codebook)


def random_gguf_raw(qtype, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random blocks of GGUF type `qtype` (gguf.GGMLQuantizationType), uint8 [rows, bytes per
    row]: quantized from random floats where gguf can quantize, else random bytes with finite fp16
    parameters of either sign (subnormals in row 0)."""
    import gguf  # the kernel tests that import this module need no gguf

    qt = gguf.GGMLQuantizationType
    # types gguf cannot quantize: (byte offset, count) of their fp16 block parameters
    fp16_params = {qt.Q2_K: (80, 2), qt.Q3_K: (108, 1), qt.Q4_K: (0, 2), qt.Q5_K: (0, 2),
                   qt.Q6_K: (208, 1), qt.IQ4_NL: (0, 1), qt.IQ4_XS: (0, 1)}
    rng = np.random.default_rng(seed)
    if qtype in fp16_params:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        nb = cols // block_size
        raw = rng.integers(0, 256, (rows, nb, type_size), dtype=np.uint8)
        at, count = fp16_params[qtype]
        params = rng.uniform(0.001, 0.05, (rows, nb, count)) * rng.choice([-1, 1], (rows, nb, count))
        params[0] = rng.uniform(1e-7, 1e-5, (nb, count))  # fp16 subnormals in one row
        raw[..., at: at + 2 * count] = params.astype(np.float16).view(np.uint8).reshape(rows, nb, -1)
        return raw.reshape(rows, -1)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 1.0, (rows, 1))
    w[0, :] += 0.5  # rows of one sign: Q4_1's offset positive
    return gguf.quants.quantize(w.astype(np.float32), qtype)
