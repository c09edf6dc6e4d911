"""The runtime's quantized weight format: 4-, 5- or 8-bit integers with a per-group scale and offset.

    W[n, k] = scale[n, g] * q[n, k] + offset[n, g]      g = k // group_size

One format holds every 4-bit source exactly (no value changes, nothing goes through fp32 weights):
- AutoAWQ GEMM, W = s (q - z): scale s, offset -s z (fp32: s z needs up to 15 mantissa bits),
- GGUF Q4_0, W = d (q - 8): scale d, offset -8 d (fp16, exact),
- GGUF Q4_1, W = d q + m: scale d, offset m (fp16, the file's own values),
- GGUF Q4_K, W = (d sc) q - dmin mn: scale d sc, offset -dmin mn (fp32: 17 mantissa bits),
and, with 8-bit integers and no offset, GGUF Q8_0 (W = d q); quant/gguf_blocks.py maps every other
served GGUF type onto the same three widths (docs/weights.md has the table). Exact means bit for
bit: `s * q + o` rounds as gguf's own dequantize does (tests compare with gguf.quants).

5-bit integers are unsigned (0..31: Q5_1, Q5_K) or signed (two's complement, -16..15: Q5_0's
q - 16 needs no offset then); the `signed` flag says which. Stored as the 4-bit form's nibbles plus
a plane of fifth bits, so a 5-bit weight costs 5 bits as in the file.

Two forms:
- `GroupedRows`: row-major [N, K] integers (uint8 0..15 or 0..31, or int8), scales/offsets [N, K / G]. What
  sources convert into; rows concatenate (fused q/k/v) and permute (GGUF's rope order) exactly.
- `BlockedQuantWeight`: the layout kernels/csrc/linear_int4.c reads, blocks of 16 output rows as
  the fp32 kernel's (kernels/cpu_linear.py): 4-bit `data` uint8 [NB, K, 8], byte j of (b, k) holds
  row 16 b + j in its low nibble and row 16 b + j + 8 in its high one; 8-bit `data` int8
  [NB, K, 16]; 5-bit `data` uint8 [NB, K, 10]: the 4-bit form's 8 bytes, then a little-endian
  uint16 whose bit j is row 16 b + j's fifth bit (weighing +16, or -16 when signed);
  `scales` / `offsets` [NB, K / G, 16] (fp16 or fp32, offsets None: zero). Rows past N
  are zero (scale 0, offset 0).

Invariants: `dequantize()` of either form is the plain-torch reference the kernels are tested
against; `BlockedQuantWeight.from_rows(r).dequantize()` equals `r.dequantize()` bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edge_runtime.quant.awq_pack import unpack_int4

BLOCK_N = 16  # output rows per block, as kernels/csrc/linear_f32.c
GROUP_SIZES = (16, 32, 64, 128, 256)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


@dataclass
class GroupedRows:
    q: torch.Tensor  # [N, K] uint8 in 0..15 (bits 4), uint8 0..31 or int8 -16..15 (bits 5), int8 (bits 8)
    scales: torch.Tensor  # [N, K / G] float16 or float32
    offsets: torch.Tensor | None  # like scales, or None (zero)
    bits: int
    group_size: int

    def __post_init__(self) -> None:
        n, k = self.q.shape
        assert self.bits in (4, 5, 8), self.bits
        assert self.q.dtype in ((torch.uint8,) if self.bits == 4 else (torch.int8,) if self.bits == 8
                                else (torch.uint8, torch.int8)), (self.bits, self.q.dtype)
        assert self.group_size in GROUP_SIZES and k % self.group_size == 0, (k, self.group_size)
        assert self.scales.shape == (n, k // self.group_size), (self.scales.shape, n, k)
        assert self.scales.dtype in (torch.float16, torch.float32), self.scales.dtype
        assert self.offsets is None or (self.offsets.shape == self.scales.shape
                                        and self.offsets.dtype == self.scales.dtype)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def signed(self) -> bool:
        """5-bit integers in two's complement (-16..15) rather than 0..31."""
        return self.bits == 5 and self.q.dtype == torch.int8

    def dequantize(self) -> torch.Tensor:
        """Reference: float32 [N, K]."""
        s = self.scales.float().repeat_interleave(self.group_size, dim=1)
        w = self.q.float() * s
        if self.offsets is not None:
            w = w + self.offsets.float().repeat_interleave(self.group_size, dim=1)
        return w

    def permute_rows(self, order: torch.Tensor) -> "GroupedRows":
        def take(t: torch.Tensor) -> torch.Tensor:
            return _tensor(t.numpy()[order.numpy()])

        offsets = None if self.offsets is None else take(self.offsets)
        return GroupedRows(take(self.q), take(self.scales), offsets, self.bits, self.group_size)

    @staticmethod
    def cat(parts: list["GroupedRows"]) -> "GroupedRows":
        """Rows of `parts` one after another (a fused q/k/v or gate/up weight)."""
        first = parts[0]
        assert all(compatible(first, p) for p in parts), [describe(p) for p in parts]
        def cat(tensors: list[torch.Tensor]) -> torch.Tensor:
            return _tensor(np.concatenate([t.numpy() for t in tensors]))

        offsets = None if first.offsets is None else cat([p.offsets for p in parts])
        return GroupedRows(cat([p.q for p in parts]), cat([p.scales for p in parts]), offsets,
                           first.bits, first.group_size)


def blocked_nbytes(bits: int, rows: int, cols: int, group_size: int, param_bytes: int,
                   offsets: bool) -> int:
    """Bytes of a BlockedQuantWeight of `rows` x `cols` (what from_rows makes), without making it."""
    padded = -(-rows // BLOCK_N) * BLOCK_N
    params = padded * (cols // group_size) * param_bytes * (2 if offsets else 1)
    return padded * cols * bits // 8 + params


def compatible(a: GroupedRows, b: GroupedRows) -> bool:
    """Rows of `a` and `b` can share one blocked weight (same K, bits, group, parameter types)."""
    return (a.q.shape[1] == b.q.shape[1] and a.bits == b.bits and a.group_size == b.group_size
            and a.q.dtype == b.q.dtype and a.scales.dtype == b.scales.dtype
            and (a.offsets is None) == (b.offsets is None))


def widened(parts: list[GroupedRows]) -> list[GroupedRows] | None:
    """`parts` as 8-bit rows when they differ only in their integers' width (4-, 5- or 8-bit with
    the same group, parameter dtype and offsets: Q5_0 q / k next to a Q8_0 v), so they can share
    one blocked weight; the same values (every 4- and 5-bit integer is an int8). Else None."""
    first = parts[0]
    same = all(p.q.shape[1] == first.q.shape[1] and p.group_size == first.group_size
               and p.scales.dtype == first.scales.dtype
               and (p.offsets is None) == (first.offsets is None) for p in parts)
    if not same:
        return None
    return [p if p.bits == 8 else GroupedRows(p.q.to(torch.int8), p.scales, p.offsets, 8,
                                              p.group_size) for p in parts]


def describe(r: GroupedRows) -> str:
    dtype = str(r.scales.dtype).removeprefix("torch.")
    kind = f"{'s' if r.signed else ''}int{r.bits}"
    return f"{kind} g{r.group_size} {dtype}{'' if r.offsets is not None else ' no offset'}"


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             group_size: int) -> GroupedRows:
    """AutoAWQ GEMM tensors (qweight [K, N/8], qzeros [K/G, N/8], scales fp16 [K/G, N]) -> rows.
    W = s (q - z) = s q + (-s z); s z is exact in fp32, not always in fp16."""
    q = unpack_int4(qweight).t().to(torch.uint8).contiguous()  # [N, K]
    z = unpack_int4(qzeros).t().float()  # [N, K/G]
    s = scales.t().float().contiguous()
    return GroupedRows(q, s, (-(s * z)).contiguous(), 4, group_size)


@dataclass
class BlockedQuantWeight:
    data: torch.Tensor  # uint8 [NB, K, 8] (4-bit), uint8 [NB, K, 10] (5-bit), int8 [NB, K, 16] (8-bit)
    scales: torch.Tensor  # [NB, K / G, 16]
    offsets: torch.Tensor | None
    bits: int
    group_size: int
    out_features: int
    in_features: int
    signed: bool = False  # 5-bit only: the fifth bit weighs -16

    @classmethod
    def from_rows(cls, rows: GroupedRows) -> "BlockedQuantWeight":
        n, k = rows.shape
        nb = -(-n // BLOCK_N)

        # numpy: torch's thread pool made these byte shuffles 5-15x slower on a busy 2-core machine
        def blocked(t: torch.Tensor) -> np.ndarray:  # [N, C] -> [NB, C, 16], rows past N zero
            a = t.numpy()
            if n % BLOCK_N:
                a = np.concatenate([a, np.zeros((nb * BLOCK_N - n, a.shape[1]), a.dtype)])
            return a.reshape(nb, BLOCK_N, a.shape[1]).transpose(0, 2, 1)

        q = blocked(rows.q)  # [NB, K, 16]
        if rows.bits in (4, 5):
            u = q.view(np.uint8)
            nibbles = (u[:, :, :8] & 0xF) | ((u[:, :, 8:] & 0xF) << 4)
            if rows.bits == 5:  # bit j of the uint16: row j's fifth bit
                fifth = np.packbits((u >> 4) & 1, axis=2, bitorder="little")  # [NB, K, 2]
                nibbles = np.concatenate([nibbles, fifth], axis=2)
            q = nibbles
        offsets = None if rows.offsets is None else _tensor(blocked(rows.offsets))
        return cls(_tensor(q), _tensor(blocked(rows.scales)), offsets, rows.bits, rows.group_size,
                   n, k, rows.signed)

    def lanes(self) -> torch.Tensor:
        """The integers as [NB, K, 16] (uint8 values 0..15, 0..31, or int8)."""
        if self.bits == 8:
            return self.data
        q = torch.cat([self.data[:, :, :8] & 0xF, self.data[:, :, :8] >> 4], dim=2)
        if self.bits == 4:
            return q
        bit = torch.arange(16, dtype=torch.int32)
        fifth = (self.data[:, :, 8].int() | (self.data[:, :, 9].int() << 8))[:, :, None] >> bit & 1
        return q.to(torch.int8) - (fifth * 16).to(torch.int8) if self.signed else q | (fifth * 16).to(torch.uint8)

    def dequantize(self) -> torch.Tensor:
        """Reference: float32 [N, K] (the transposes of the blocked form)."""
        g = self.group_size
        w = self.lanes().float() * self.scales.float().repeat_interleave(g, dim=1)
        if self.offsets is not None:
            w = w + self.offsets.float().repeat_interleave(g, dim=1)
        return w.transpose(1, 2).reshape(-1, self.in_features)[: self.out_features]

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (long [M]) of W as float32 [M, K]: an embedding lookup on a tied head."""
        return lookup_rows(ids, self.data, self.scales, self.offsets, self.bits, self.group_size,
                           self.signed)

    @property
    def nbytes(self) -> int:
        tensors = [self.data, self.scales] + ([self.offsets] if self.offsets is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def describe(self) -> str:
        dtype = str(self.scales.dtype).removeprefix("torch.")
        return f"{'s' if self.signed else ''}int{self.bits} g{self.group_size} {dtype}"


def lookup_rows(ids, data, scales, offsets, bits: int, group_size: int, signed: bool = False):
    """`BlockedQuantWeight.rows_of` on torch tensors or on numpy arrays (views of a CPU weight's
    bytes: a decode step's few rows cost several times less in numpy's small-array ops than in
    torch's, kernels/cpu_int4.py), with the same values either way: each group's scale (and
    offset) broadcasts over a [M, K / G, G] view, q * scale exact, + offset rounded once."""
    f32 = (lambda a: a.astype(np.float32)) if isinstance(ids, np.ndarray) else (lambda t: t.float())
    block, lane = ids // BLOCK_N, ids % BLOCK_N
    if bits == 8:
        q = data[block, :, lane]
    else:  # row 16 b + j: byte j's low nibble, row 16 b + j + 8: its high one
        q = (data[block, :, lane % 8] >> ((lane >= 8) * 4)[:, None]) & 0xF  # [M, K]
        if bits == 5:  # byte 8 + j // 8, bit j % 8: the fifth bit
            fifth = (data[block, :, 8 + lane // 8] >> (lane % 8)[:, None]) & 1
            q = f32(q) + f32(fifth) * (-16.0 if signed else 16.0)  # small integers: exact
    m = q.shape[0]
    w = f32(q).reshape(m, -1, group_size) * f32(scales[block, :, lane])[:, :, None]
    if offsets is not None:
        w = w + f32(offsets[block, :, lane])[:, :, None]
    return w.reshape(m, -1)
