"""GGUF quantized blocks -> `GroupedRows` (quant/int4_format.py), from the file's raw bytes.

gguf.GGUFReader gives a quantized tensor as uint8 [N, bytes per row] (each row a run of blocks);
the integers and the block parameters are taken out of those bytes as they are (no float weights
in between). Block layouts (ggml-common.h; gguf.quants is the reference the tests compare with):
- Q4_0, 18 bytes per 32 weights: fp16 d, then 16 bytes; weight j < 16 is byte j's low nibble,
  weight 16 + j its high nibble. W = d (q - 8).
- Q4_1, 20 bytes: fp16 d, fp16 m, 16 bytes as Q4_0. W = d q + m.
- Q4_K, 144 bytes per 256: fp16 d, fp16 dmin, 12 bytes of 6-bit (sc, mn) pairs for 8 groups of
  32, then 128 bytes: byte j of 32-byte chunk c holds weight j of group 2c (low nibble) and of group
  2c + 1 (high). W = d sc q - dmin mn.
- Q8_0, 34 bytes per 32: fp16 d, 32 int8. W = d q (8-bit rows, no offset).
- Q6_K, 210 bytes per 256: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales
  (one per 16 weights), fp16 d. Per half of 128: weight l < 32 and 64 + l take byte l's low / high
  nibble, 32 + l and 96 + l byte 32 + l's, with bits 0-1 / 4-5 and 2-3 / 6-7 of qh byte l on top.
  W = (d sc) (q - 32): 8-bit rows holding q - 32, scale d sc (exact in fp32), group 16, no offset.
Other quantized types (Q5_*, Q2_K, Q3_K, IQ*) are refused with their name: `UnsupportedType`.
"""
from __future__ import annotations

import numpy as np
import torch

from edge_runtime.quant.int4_format import GroupedRows

SUPPORTED = ("Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q8_0")


class UnsupportedType(ValueError):
    """A GGUF tensor type the runtime cannot serve quantized."""


def _f16(raw: np.ndarray) -> torch.Tensor:
    """[..., 2] uint8 -> float16 [...]."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].copy())


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: low nibbles then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    n, row_bytes = raw.shape
    assert row_bytes % block_bytes == 0, (row_bytes, block_bytes)
    return raw.reshape(n, row_bytes // block_bytes, block_bytes)


def q4_0(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 18)
    d = _f16(b[..., 0:2])
    q = torch.from_numpy(_nibbles_32(b[..., 2:]).reshape(b.shape[0], -1))
    offsets = d * -8.0  # exact in fp16 unless -8 d overflows: then fp32
    if not torch.isfinite(offsets).all():
        d, offsets = d.float(), d.float() * -8.0
    return GroupedRows(q, d, offsets, 4, 32)


def q4_1(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 20)
    q = torch.from_numpy(_nibbles_32(b[..., 4:]).reshape(b.shape[0], -1))
    return GroupedRows(q, _f16(b[..., 0:2]), _f16(b[..., 2:4]), 4, 32)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte 6-bit (sc, mn) pairs of Q4_K -> two [..., 8] uint8 arrays (ggml's
    get_scale_min_k4)."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def q4_k(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 144)
    n, nsb = b.shape[:2]
    d, dmin = _f16(b[..., 0:2]).float(), _f16(b[..., 2:4]).float()  # [N, S]
    sc, mn = _k_scale_min(b[..., 4:16])  # [N, S, 8]
    # d sc and dmin mn: 11 x 6 significant bits, exact in fp32
    scales = (d[..., None] * torch.from_numpy(sc.astype(np.float32))).reshape(n, nsb * 8)
    offsets = -(dmin[..., None] * torch.from_numpy(mn.astype(np.float32))).reshape(n, nsb * 8)
    chunks = b[..., 16:].reshape(n, nsb, 4, 32)
    q = np.stack([chunks & 0x0F, chunks >> 4], axis=3)  # [N, S, 4, 2, 32]: group 2c + h
    return GroupedRows(torch.from_numpy(q.reshape(n, -1)), scales, offsets, 4, 32)


def q8_0(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 34)
    q = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(b.shape[0], -1))
    return GroupedRows(q, _f16(b[..., 0:2]), None, 8, 32)


def q6_k(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 210)
    n, nsb = b.shape[:2]
    ql = b[..., 0:128].reshape(n, nsb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)
    ql = (ql & 0x0F).reshape(n, nsb, 2, 4, 32)  # per half: bytes 0-31, 32-63 low, then high
    qh = b[..., 128:192].reshape(n, nsb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    q = (ql | ((qh & 0x03) << 4)).astype(np.int8) - np.int8(32)  # [N, S, 2, 4, 32]
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)  # [N, S, 16]
    d = _f16(b[..., 208:210]).float()  # [N, S]
    scales = (d[..., None] * torch.from_numpy(sc)).reshape(n, nsb * 16)  # d sc: 11 x 8 bits, exact
    return GroupedRows(torch.from_numpy(q.reshape(n, -1)), scales, None, 8, 16)


_CONVERTERS = {"Q4_0": q4_0, "Q4_1": q4_1, "Q4_K": q4_k, "Q6_K": q6_k, "Q8_0": q8_0}


def grouped_rows(raw: np.ndarray, type_name: str, name: str = "tensor") -> GroupedRows:
    """raw: uint8 [N, bytes per row] of a GGUF tensor of type `type_name` (GGMLQuantizationType
    name) -> its rows. Raises UnsupportedType naming the type for the others."""
    convert = _CONVERTERS.get(type_name)
    if convert is None:
        raise UnsupportedType(
            f"{name} is stored as GGUF type {type_name}, which the runtime cannot serve quantized "
            f"(supported: {', '.join(SUPPORTED)}); run with --weights fp32, or use a "
            "Q4_0/Q4_1/Q4_K_S/Q4_K_M/Q8_0 file")
    return convert(np.asarray(raw, dtype=np.uint8))
