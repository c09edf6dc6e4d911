"""GGUF quantized blocks -> `GroupedRows` (quant/int4_format.py), from the file's raw bytes.

gguf.GGUFReader gives a quantized tensor as uint8 [N, bytes per row] (each row a run of blocks);
the integers and the block parameters are taken out of those bytes as they are (no float weights
in between). Block layouts (ggml-common.h; gguf.quants is the reference the tests compare with),
each with the runtime form it becomes (bits, group, parameters):
- Q4_0, 18 bytes per 32 weights: fp16 d, then 16 bytes; weight j < 16 is byte j's low nibble,
  weight 16 + j its high nibble. W = d (q - 8): 4-bit, scale d, offset -8 d (fp16).
- Q4_1, 20 bytes: fp16 d, fp16 m, 16 bytes as Q4_0. W = d q + m: 4-bit, d, m (fp16).
- Q5_0, 22 bytes: fp16 d, 32 bits of fifth bits (bit j: weight j), 16 bytes as Q4_0.
  W = d (q - 16): signed 5-bit q - 16, scale d (fp16), no offset.
- Q5_1, 24 bytes: fp16 d, fp16 m, then as Q5_0. W = d q + m: unsigned 5-bit, d, m (fp16).
- Q8_0, 34 bytes per 32: fp16 d, 32 int8. W = d q (8-bit rows, no offset).
- Q2_K, 84 bytes per 256: 16 bytes of 4-bit (sc, mn) pairs (one per 16 weights), 64 bytes of
  2-bit q (bits 2 i of byte j of 32-byte half h: weight 128 h + 32 i + j), fp16 d, fp16 dmin.
  W = (d sc) q - dmin mn: 2-bit q, group 16, two-level parameters with 4-bit codes (sc and mn,
  two groups a byte when blocked; super d and -dmin): the file's 84 bytes.
- Q3_K, 110 bytes per 256: 32 bytes of high bits, 64 bytes of low 2-bit pairs, 12 bytes of 6-bit
  scales, fp16 d. W = d (sc - 32) q3 with q3 = low - 4 (1 - high) in -4..3: signed 3-bit q3,
  scale d x (sc - 32) (two-level, int8 codes), no offset, group 16: 114 bytes per 256.
- Q4_K, 144 bytes per 256: fp16 d, fp16 dmin, 12 bytes of 6-bit (sc, mn) pairs for 8 groups of
  32, then 128 bytes: byte j of 32-byte chunk c holds weight j of group 2c (low nibble) and of group
  2c + 1 (high). W = d sc q - dmin mn: 4-bit, scale d x sc, offset -dmin x mn (two-level: the
  file's fp16 d / dmin per 256, 8-bit codes per group; the products are exact in fp32).
- Q5_K, 176 bytes per 256: as Q4_K with 32 bytes of fifth bits (bit i of byte j: weight j of group
  i) before the nibbles. Unsigned 5-bit, two-level parameters as Q4_K.
- Q6_K, 210 bytes per 256: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales
  (one per 16 weights), fp16 d. Per half of 128: weight l < 32 and 64 + l take byte l's low / high
  nibble, 32 + l and 96 + l byte 32 + l's, with bits 0-1 / 4-5 and 2-3 / 6-7 of qh byte l on top.
  W = (d sc) (q - 32): signed 6-bit q - 32, scale d x sc (two-level), group 16, no offset.
- IQ4_NL, 18 bytes per 32: fp16 d, 16 bytes of 4-bit indices (as Q4_0) into a 16-entry int8
  codebook. W = d code[i]: 4-bit indices with the codebook, scale d (fp16), no offset.
- IQ4_XS, 136 bytes per 256: fp16 d, 2 + 4 bytes of 6-bit scales (one per 32), 128 bytes of
  indices (16 per group of 32, as Q4_0). W = d (ls - 32) code[i]: 4-bit indices with the
  codebook, scale d x (ls - 32) (two-level).
The K and IQ4 forms are held in at most 1.04x the file's bytes (docs/weights.md has the table).
Other quantized types (IQ1_*, IQ2_*, IQ3_*, TQ*, MXFP4, ...) are refused with their name and the
served list: `UnsupportedType`. F16 / BF16 / F32 are not blocks: model/gguf_int4.py serves them.
"""
from __future__ import annotations

import numpy as np
import torch

from edge_runtime.quant.int4_format import GroupedRows

SUPPORTED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
             "IQ4_NL", "IQ4_XS")
IQ4_CODEBOOK = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                        np.int8)  # ggml's kvalues_iq4nl


class UnsupportedType(ValueError):
    """A GGUF tensor type the runtime cannot serve quantized."""


def _f16(raw: np.ndarray) -> torch.Tensor:
    """[..., 2] uint8 -> float16 [...]."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].copy())


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: low nibbles then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[..., 4] bytes (a little-endian uint32) -> [..., 32] values 0 / 16: bit j for weight j."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << 4


def _f32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _codebook() -> torch.Tensor:
    """The IQ4 codebook, a tensor of its own per weight (its 16 bytes counted with the weight's)."""
    return torch.from_numpy(IQ4_CODEBOOK.copy())


def _codes(a: np.ndarray, n: int) -> torch.Tensor:
    """Group parameter codes [N, S, groups] (each in -128..127) -> int8 [N, S * groups]."""
    return torch.from_numpy(np.ascontiguousarray(a.astype(np.int8).reshape(n, -1)))


def _neg_f16(raw: np.ndarray) -> torch.Tensor:
    """-x of fp16 [..., 2] bytes (a sign flip: exact)."""
    return -_f16(raw)


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


def q5_0(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 22)
    q = (_nibbles_32(b[..., 6:]) | _fifth_bits(b[..., 2:6])).astype(np.int8) - np.int8(16)
    return GroupedRows(torch.from_numpy(q.reshape(b.shape[0], -1)), _f16(b[..., 0:2]), None, 5, 32)


def q5_1(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 24)
    q = _nibbles_32(b[..., 8:]) | _fifth_bits(b[..., 4:8])
    return GroupedRows(torch.from_numpy(q.reshape(b.shape[0], -1)), _f16(b[..., 0:2]),
                       _f16(b[..., 2:4]), 5, 32)


def iq4_nl(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 18)
    q = torch.from_numpy(_nibbles_32(b[..., 2:]).reshape(b.shape[0], -1))
    return GroupedRows(q, _f16(b[..., 0:2]), None, 4, 32, codebook=_codebook())


def iq4_xs(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 136)
    n, nsb = b.shape[:2]
    high = b[..., 2].astype(np.uint16) | (b[..., 3].astype(np.uint16) << 8)
    high = (high[..., None] >> (2 * np.arange(8, dtype=np.uint16))) & 3  # [N, S, 8]
    low = b[..., 4:8, None] >> np.array([0, 4], np.uint8)  # [N, S, 4, 2]: group 2 i + h
    ls = (low.reshape(n, nsb, 8) & 0x0F) | (high.astype(np.uint8) << 4)
    q = _nibbles_32(b[..., 8:].reshape(n, nsb, 8, 16))
    # scale d (ls - 32): 11 + 6 bits, exact in fp32
    return GroupedRows(torch.from_numpy(q.reshape(n, -1)), _codes(ls.astype(np.int16) - 32, n),
                       None, 4, 32, _f16(b[..., 0:2]), codebook=_codebook())


def _codes4(a: np.ndarray, n: int) -> torch.Tensor:
    """4-bit group codes [N, S, groups] (0..15) -> uint8 [N, S * groups]."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8).reshape(n, -1))


def q2_k(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 84)
    n, nsb = b.shape[:2]
    sc = b[..., 0:16]  # [N, S, 16]: scale d x (sc & 15), offset -dmin x (sc >> 4): 11 + 4 bits
    # 64 bytes as 2 x 32: shift 2 i of byte j of half h is weight 128 h + 32 i + j
    qs = b[..., 16:80].reshape(n, nsb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    q = (qs & 3).reshape(n, -1)
    return GroupedRows(torch.from_numpy(np.ascontiguousarray(q)), _codes4(sc & 0x0F, n),
                       _codes4(sc >> 4, n), 2, 16, _f16(b[..., 80:82]), _neg_f16(b[..., 82:84]))


def q3_k(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 110)
    n, nsb = b.shape[:2]
    hmask, qs, packed = b[..., 0:32], b[..., 32:96], b[..., 96:108]
    low = (packed[..., 0:8, None] >> np.array([0, 4], np.uint8)).transpose(0, 1, 3, 2)  # [N,S,2,8]
    high = (packed[..., 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)).transpose(0, 1, 3, 2)
    sc = ((low.reshape(n, nsb, 16) & 0x0F) | ((high.reshape(n, nsb, 16) & 3) << 4)).astype(np.int16) - 32
    ql = (qs.reshape(n, nsb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3
    qh = (hmask.reshape(n, nsb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    # q3 = ql - 4 (1 - h): signed 3-bit, its top bit (weighing -4) the missing high bit;
    # d (sc - 32): 11 + 6 bits, exact in fp32, and so is its product with q3
    q = ql.reshape(n, nsb, 8, 32).astype(np.int8) - (4 * (1 - qh)).astype(np.int8)
    return GroupedRows(torch.from_numpy(np.ascontiguousarray(q.reshape(n, -1))), _codes(sc, n),
                       None, 3, 16, _f16(b[..., 108:110]))


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
    sc, mn = _k_scale_min(b[..., 4:16])  # [N, S, 8]: d sc and dmin mn, 11 x 6 bits, exact in fp32
    chunks = b[..., 16:].reshape(n, nsb, 4, 32)
    q = np.stack([chunks & 0x0F, chunks >> 4], axis=3)  # [N, S, 4, 2, 32]: group 2c + h
    return GroupedRows(torch.from_numpy(q.reshape(n, -1)), _codes(sc, n), _codes(mn, n), 4, 32,
                       _f16(b[..., 0:2]), _neg_f16(b[..., 2:4]))


def q5_k(raw: np.ndarray) -> GroupedRows:
    b = _blocks(raw, 176)
    n, nsb = b.shape[:2]
    sc, mn = _k_scale_min(b[..., 4:16])
    chunks = b[..., 48:].reshape(n, nsb, 4, 32)
    low = np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(n, nsb, 8, 32)  # group 2c + h
    fifth = (b[..., 16:48].reshape(n, nsb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    q = low | (fifth << 4)
    return GroupedRows(torch.from_numpy(q.reshape(n, -1)), _codes(sc, n), _codes(mn, n), 5, 32,
                       _f16(b[..., 0:2]), _neg_f16(b[..., 2:4]))


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
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8)  # [N, S, 16]: d sc, 11 x 8 bits
    return GroupedRows(torch.from_numpy(q.reshape(n, -1)), _codes(sc, n), None, 6, 16,
                       _f16(b[..., 208:210]))


_CONVERTERS = {"Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q8_0": q8_0, "Q2_K": q2_k,
               "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k, "IQ4_NL": iq4_nl,
               "IQ4_XS": iq4_xs}
# GGUF type -> its runtime form: (bits, group size, parameter bytes, offsets, signed, codebook);
# parameter bytes 1: int8 codes with fp16 super parameters per 256 inputs (two-level), 0.5: 4-bit
# codes (two groups a byte) with them. What plan
# counts without converting (model/gguf_int4.planned_weight_bytes); tests check it on each converter
RUNTIME_FORM = {"Q4_0": (4, 32, 2, True, False, False), "Q4_1": (4, 32, 2, True, False, False),
                "Q5_0": (5, 32, 2, False, True, False), "Q5_1": (5, 32, 2, True, False, False),
                "Q8_0": (8, 32, 2, False, False, False), "Q2_K": (2, 16, 0.5, True, False, False),
                "Q3_K": (3, 16, 1, False, True, False), "Q4_K": (4, 32, 1, True, False, False),
                "Q5_K": (5, 32, 1, True, False, False), "Q6_K": (6, 16, 1, False, True, False),
                "IQ4_NL": (4, 32, 2, False, False, True), "IQ4_XS": (4, 32, 1, False, False, True)}
FLOAT_TYPES = ("F32", "F16", "BF16")  # served as floats (16-bit ones in 16 bits), not as blocks


def served_types() -> str:
    """The GGUF tensor types the runtime serves, for messages."""
    return ", ".join(SUPPORTED + FLOAT_TYPES)


def grouped_rows(raw: np.ndarray, type_name: str, name: str = "tensor") -> GroupedRows:
    """raw: uint8 [N, bytes per row] of a GGUF tensor of type `type_name` (GGMLQuantizationType
    name) -> its rows. Raises UnsupportedType naming the type for the others."""
    convert = _CONVERTERS.get(type_name)
    if convert is None:
        raise UnsupportedType(
            f"{name} is stored as GGUF type {type_name}, which the runtime cannot serve "
            f"(served: {served_types()}); use a file quantized to one of those (llama.cpp's "
            "Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, ... mixes are)")
    return convert(np.asarray(raw, dtype=np.uint8))
