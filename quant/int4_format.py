"""The runtime's quantized weight format: 2- to 8-bit integers with a per-group scale and offset.

    W[n, k] = scale[n, g] * q[n, k] + offset[n, g]      g = k // group_size

One format holds every 4-bit source exactly (no value changes, nothing goes through fp32 weights):
- AutoAWQ GEMM, W = s (q - z): scale s, offset -s z (fp32: s z needs up to 15 mantissa bits),
- GGUF Q4_0, W = d (q - 8): scale d, offset -8 d (fp16, exact),
- GGUF Q4_1, W = d q + m: scale d, offset m (fp16, the file's own values),
- GGUF Q4_K, W = (d sc) q - dmin mn: scale d x sc, offset -dmin x mn (two-level, below),
and, with 8-bit integers and no offset, GGUF Q8_0 (W = d q); quant/gguf_blocks.py maps every other
served GGUF type onto the same widths (docs/weights.md has the table). Exact means bit for
bit: `s * q + o` rounds as gguf's own dequantize does (tests compare with gguf.quants).

5-bit integers are unsigned (0..31: Q5_1, Q5_K) or signed (two's complement, -16..15: Q5_0's
q - 16 needs no offset then); the `signed` flag says which. Stored as the 4-bit form's nibbles plus
a plane of fifth bits, so a 5-bit weight costs 5 bits as in the file. 6-bit integers (Q6_K's
q - 32, signed -32..31, or 0..63) add a plane of sixth bits the same way. 2-bit integers (Q2_K's
0..3) are packed four to a byte, and 3-bit ones (Q3_K's q3, signed -4..3, or 0..7) 16 to 6 bytes,
so Q2_K / Q3_K weights cost their file's 2 / 3 bits.

Two-level parameters (the K types' form, as their files hold them): `scales` / `offsets` int8 codes
per group and `super_scales` / `super_offsets` fp16 per SUPER_K inputs, the parameter being
super * code computed in fp32: exact (an fp16's 11 significant bits times an 8-bit integer), so
the values are the single-level fp32 products' and a group costs 1 byte, not 4. Q2_K's codes
are 4-bit (0..15, its file packs a scale and a min code in one byte): `scales` / `offsets` uint8
codes, held two groups to a byte in the blocked form ("4-bit codes"), so a group costs half a byte.
A `codebook` (int8 [16], the IQ4 types') makes 4-bit integers indices: the value is codebook[q].

Two forms:
- `GroupedRows`: row-major [N, K] integers (uint8 0..15, 0..31 or 0..63, or int8), scales/offsets [N, K / G]. What
  sources convert into; rows concatenate (fused q/k/v) and permute (GGUF's rope order) exactly.
- `BlockedQuantWeight`: the layout kernels/csrc/linear_int4.c reads, blocks of 16 output rows as
  the fp32 kernel's (kernels/cpu_linear.py): 4-bit `data` uint8 [NB, K, 8], byte j of (b, k) holds
  row 16 b + j in its low nibble and row 16 b + j + 8 in its high one; 8-bit `data` int8
  [NB, K, 16]; 5-bit `data` uint8 [NB, K, 10]: the 4-bit form's 8 bytes, then a little-endian
  uint16 whose bit j is row 16 b + j's fifth bit (weighing +16, or -16 when signed); 6-bit
  `data` uint8 [NB, K, 12]: then a uint16 of sixth bits (+32, or -32 when signed); 2-bit `data`
  uint8 [NB, K, 4], a little-endian uint32 whose bits 2 j, 2 j + 1 are row 16 b + j's integer;
  3-bit `data` uint8 [NB, K, 6], a little-endian 48-bit value whose bits 3 j .. 3 j + 2 are row
  16 b + j's integer (two's complement when signed: the kernels sign-extend it by two shifts);
  `scales` / `offsets` [NB, K / G, 16] (fp16, fp32 or int8 codes; offsets None: zero), or uint8
  [NB, K / G / 2, 16] for 4-bit codes (group 2 i in the low nibble of byte i, 2 i + 1 in the high),
  `super_scales` / `super_offsets` [NB, K / SUPER_K, 16] fp16. Rows past N are zero (scale 0,
  offset 0).

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
SUPER_K = 256  # inputs per two-level super scale (a K-type super-block)
EXTRA_BITS = {2: 0, 3: 0, 4: 0, 5: 1, 6: 2, 8: 0}  # bit planes after the nibbles
BITS = tuple(EXTRA_BITS)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


@dataclass
class GroupedRows:
    q: torch.Tensor  # [N, K] uint8 in 0..2^bits - 1, or int8 -2^(bits-1)..2^(bits-1) - 1 (bits 3, 5, 6, 8)
    scales: torch.Tensor  # [N, K / G] float16 or float32, or int8 / uint8 (4-bit) codes
    offsets: torch.Tensor | None  # like scales, or None (zero)
    bits: int
    group_size: int
    super_scales: torch.Tensor | None = None  # [N, K / SUPER_K] float16: scales are int8 codes
    super_offsets: torch.Tensor | None = None  # likewise for offsets (None with offsets None)
    codebook: torch.Tensor | None = None  # int8 [16]: 4-bit q index it

    def __post_init__(self) -> None:
        n, k = self.q.shape
        assert self.bits in BITS, self.bits
        assert self.q.dtype in ((torch.uint8,) if self.bits in (2, 4) else (torch.int8,)
                                if self.bits == 8 else (torch.uint8, torch.int8)), (self.bits, self.q.dtype)
        assert self.group_size in GROUP_SIZES and k % self.group_size == 0, (k, self.group_size)
        assert self.scales.shape == (n, k // self.group_size), (self.scales.shape, n, k)
        assert self.offsets is None or (self.offsets.shape == self.scales.shape
                                        and self.offsets.dtype == self.scales.dtype)
        _check_params(self.scales, self.offsets, self.super_scales, self.super_offsets, k)
        assert self.codebook is None or (self.bits == 4 and self.codebook.dtype == torch.int8
                                         and self.codebook.shape == (16,)), self.codebook

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def signed(self) -> bool:
        """3-, 5- or 6-bit integers in two's complement (-4..3, -16..15, -32..31) rather than
        unsigned."""
        return self.bits in (3, 5, 6) and self.q.dtype == torch.int8

    def params(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scales, offsets) as one float32 value per group: two-level ones multiplied out."""
        return (_level(self.scales, self.super_scales, self.group_size),
                _level(self.offsets, self.super_offsets, self.group_size))

    def values(self) -> torch.Tensor:
        """The integers as float32 [N, K] (codebook values where there is one)."""
        return (self.q.float() if self.codebook is None
                else self.codebook.float()[self.q.long()])

    def dequantize(self) -> torch.Tensor:
        """Reference: float32 [N, K]."""
        scales, offsets = self.params()
        w = self.values() * scales.repeat_interleave(self.group_size, dim=1)
        if offsets is not None:
            w = w + offsets.repeat_interleave(self.group_size, dim=1)
        return w

    def _with(self, fn) -> "GroupedRows":
        """The same form with `fn` applied to every per-row tensor."""
        def opt(t):
            return None if t is None else fn(t)

        return GroupedRows(fn(self.q), fn(self.scales), opt(self.offsets), self.bits,
                           self.group_size, opt(self.super_scales), opt(self.super_offsets),
                           self.codebook)

    def permute_rows(self, order: torch.Tensor) -> "GroupedRows":
        return self._with(lambda t: _tensor(t.numpy()[order.numpy()]))

    @staticmethod
    def cat(parts: list["GroupedRows"]) -> "GroupedRows":
        """Rows of `parts` one after another (a fused q/k/v or gate/up weight)."""
        first = parts[0]
        assert all(compatible(first, p) for p in parts), [describe(p) for p in parts]
        def cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
            if tensors[0] is None:
                return None
            return _tensor(np.concatenate([t.numpy() for t in tensors]))

        return GroupedRows(cat([p.q for p in parts]), cat([p.scales for p in parts]),
                           cat([p.offsets for p in parts]), first.bits, first.group_size,
                           cat([p.super_scales for p in parts]),
                           cat([p.super_offsets for p in parts]), first.codebook)


def _check_params(scales, offsets, super_scales, super_offsets, k: int) -> None:
    """float16 / float32 parameters, or int8 (or 4-bit: uint8) codes with float16 super parameters
    per SUPER_K."""
    if super_scales is None:
        assert scales.dtype in (torch.float16, torch.float32), scales.dtype
        assert super_offsets is None
        return
    assert scales.dtype in (torch.int8, torch.uint8) and k % SUPER_K == 0, (scales.dtype, k)
    assert super_scales.dtype == torch.float16, super_scales.dtype
    assert super_scales.shape[-2] == scales.shape[-2] and super_scales.shape[1] == k // SUPER_K, (
        super_scales.shape, scales.shape, k)
    assert (offsets is None) == (super_offsets is None)
    assert super_offsets is None or super_offsets.shape == super_scales.shape


def _level(codes: torch.Tensor | None, supers: torch.Tensor | None, group_size: int):
    """Parameters [N, K / G] (or blocked [NB, K / G, 16]) as float32: codes times their super parameter (exact in fp32)."""
    if codes is None or supers is None:
        return None if codes is None else codes.float()
    return supers.float().repeat_interleave(SUPER_K // group_size, dim=1) * codes.float()


def blocked_nbytes(bits: int, rows: int, cols: int, group_size: int, param_bytes: float,
                   offsets: bool, codebook: bool = False) -> int:
    """Bytes of a BlockedQuantWeight of `rows` x `cols` (what from_rows makes), without making it.
    param_bytes 1: int8 codes with an fp16 super parameter per SUPER_K inputs; 0.5: 4-bit codes
    (two groups a byte) with them."""
    padded = -(-rows // BLOCK_N) * BLOCK_N
    two_level = param_bytes < 2
    per_group = (int(2 * param_bytes) * cols // (2 * group_size)
                 + (2 * cols // SUPER_K if two_level else 0))
    params = padded * per_group * (2 if offsets else 1)
    return padded * cols * bits // 8 + params + (16 if codebook else 0)


def _param_kind(r: GroupedRows) -> tuple:
    return (r.scales.dtype, r.offsets is None, r.super_scales is None)


def compatible(a: GroupedRows, b: GroupedRows) -> bool:
    """Rows of `a` and `b` can share one blocked weight (same K, bits, group, parameter types,
    codebook)."""
    same_book = (a.codebook is None and b.codebook is None) or (
        a.codebook is not None and b.codebook is not None and torch.equal(a.codebook, b.codebook))
    return (a.q.shape[1] == b.q.shape[1] and a.bits == b.bits and a.group_size == b.group_size
            and a.q.dtype == b.q.dtype and _param_kind(a) == _param_kind(b) and same_book)


def widened(parts: list[GroupedRows]) -> list[GroupedRows] | None:
    """`parts` as 8-bit rows when they differ only in their integers' width (2- to 8-bit,
    codebook indices or not, with the same group and parameter kinds: Q5_0 q / k next to a Q8_0
    v), so they can share one blocked weight; the same values (every 4-, 5- and 6-bit integer and
    every IQ4 codebook value is an int8). 2- and 3-bit two-level parts with other parameter kinds
    (Q2_K q / k next to a Q3_K v) become signed 3-bit rows with int8 codes and offsets instead
    (`as_signed3`). Else None."""
    first = parts[0]
    same = all(p.q.shape[1] == first.q.shape[1] and p.group_size == first.group_size
               for p in parts)
    if same and all(_signed3_fits(p) for p in parts) and not all(
            _param_kind(p) == _param_kind(first) for p in parts):
        return [as_signed3(p) for p in parts]
    if not same or not all(_param_kind(p) == _param_kind(first) for p in parts):
        return None
    return [p if p.bits == 8 else GroupedRows(
        p.values().to(torch.int8), p.scales, p.offsets, 8, p.group_size, p.super_scales,
        p.super_offsets) for p in parts]


def _signed3_fits(rows: GroupedRows) -> bool:
    """Two-level rows whose integers are signed 3-bit ones: 2-bit (0..3) or signed 3-bit."""
    return rows.super_scales is not None and (rows.bits == 2 or (rows.bits == 3 and rows.signed))


def as_signed3(rows: GroupedRows) -> GroupedRows:
    """Two-level 2- / 3-bit rows as signed 3-bit ones with int8 codes and offsets, the same
    values: 0..3 and -4..3 are signed 3-bit integers, 4-bit codes are int8 ones, and rows without
    an offset get zero codes and zero supers (s q + 0 is s q)."""
    assert _signed3_fits(rows), describe(rows)
    offsets, super_offsets = rows.offsets, rows.super_offsets
    if offsets is None:
        offsets, super_offsets = torch.zeros_like(rows.scales), torch.zeros_like(rows.super_scales)
    return GroupedRows(rows.q.to(torch.int8), rows.scales.to(torch.int8), offsets.to(torch.int8),
                       3, rows.group_size, rows.super_scales, super_offsets)


def _params_name(scales: torch.Tensor, super_scales) -> str:
    if super_scales is not None:
        return f"{'uint4' if scales.dtype == torch.uint8 else 'int8'} x fp16/256"
    return str(scales.dtype).removeprefix("torch.")


def describe(r: GroupedRows) -> str:
    kind = f"{'s' if r.signed else ''}int{r.bits}{' codebook' if r.codebook is not None else ''}"
    return (f"{kind} g{r.group_size} {_params_name(r.scales, r.super_scales)}"
            f"{'' if r.offsets is not None else ' no offset'}")


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
    data: torch.Tensor  # uint8 [NB, K, 2 * bits] (16 rows of `bits`-bit integers; int8 for 8-bit)
    scales: torch.Tensor  # [NB, K / G, 16] (4-bit codes: uint8 [NB, K / G / 2, 16])
    offsets: torch.Tensor | None
    bits: int
    group_size: int
    out_features: int
    in_features: int
    signed: bool = False  # 3- / 5- / 6-bit only: the top bit weighs -4 / -16 / -32
    super_scales: torch.Tensor | None = None  # [NB, K / SUPER_K, 16] float16 (scales int8 codes)
    super_offsets: torch.Tensor | None = None
    codebook: torch.Tensor | None = None  # int8 [16]

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
        if rows.bits == 3:  # row j at bits 3 j of a little-endian 48-bit value
            fields = (q.view(np.uint8) & 7).astype(np.uint64) << (3 * np.arange(16, dtype=np.uint64))
            q = np.bitwise_or.reduce(fields, axis=2).astype("<u8").view(np.uint8).reshape(
                *q.shape[:2], 8)[:, :, :6]
        elif rows.bits != 8:
            u = q.view(np.uint8)
            if rows.bits == 2:  # row j at bits 2 (j % 4) of byte j // 4
                shifts = np.array([0, 2, 4, 6], np.uint8)
                planes = [np.bitwise_or.reduce((u & 3).reshape(*u.shape[:2], 4, 4) << shifts, axis=3)]
            else:
                planes = [(u[:, :, :8] & 0xF) | ((u[:, :, 8:] & 0xF) << 4)]
            for bit in range(4, rows.bits):  # bit j of each uint16: row j's fifth / sixth bit
                planes.append(np.packbits((u >> bit) & 1, axis=2, bitorder="little"))
            q = np.concatenate(planes, axis=2) if len(planes) > 1 else planes[0]

        def params(t):
            if t is None:
                return None
            a = blocked(t)
            if a.dtype == np.uint8:  # 4-bit codes: groups 2 i and 2 i + 1 share byte i
                a = a[:, 0::2] | (a[:, 1::2] << 4)
            return _tensor(a)

        return cls(_tensor(q), params(rows.scales), params(rows.offsets), rows.bits,
                   rows.group_size, n, k, rows.signed, params(rows.super_scales),
                   params(rows.super_offsets), rows.codebook)

    def lanes(self) -> torch.Tensor:
        """The integers as [NB, K, 16] (uint8 values 0..2^bits - 1, or int8); codebook
        indices for a codebook weight."""
        if self.bits == 8:
            return self.data
        if self.bits == 2:
            q = (self.data[:, :, :, None] >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)) & 3
            return q.reshape(*self.data.shape[:2], 16)
        if self.bits == 3:
            value = sum(self.data[:, :, i].long() << (8 * i) for i in range(6))  # [NB, K]
            q = (value[:, :, None] >> (3 * torch.arange(16))) & 7
            q = q - 8 * (q >> 2) if self.signed else q
            return q.to(torch.int8 if self.signed else torch.uint8)
        q = torch.cat([self.data[:, :, :8] & 0xF, self.data[:, :, :8] >> 4], dim=2)
        if self.bits == 4:
            return q
        bit = torch.arange(16, dtype=torch.int32)
        q = q.int()
        for i in range(EXTRA_BITS[self.bits]):  # plane i: bit 4 + i, weighing 2^(4 + i)
            plane = self.data[:, :, 8 + 2 * i].int() | (self.data[:, :, 9 + 2 * i].int() << 8)
            top = self.signed and i == EXTRA_BITS[self.bits] - 1
            q = q + (plane[:, :, None] >> bit & 1) * (-(16 << i) if top else 16 << i)
        return q.to(torch.int8 if self.signed else torch.uint8)

    def dequantize(self) -> torch.Tensor:
        """Reference: float32 [N, K] (the transposes of the blocked form)."""
        g = self.group_size
        q = self.lanes()
        q = q.float() if self.codebook is None else self.codebook.float()[q.long()]
        w = q * _level(_codes4(self.scales, 1), self.super_scales, g).repeat_interleave(g, dim=1)
        if self.offsets is not None:
            w = w + _level(_codes4(self.offsets, 1), self.super_offsets, g).repeat_interleave(g, dim=1)
        return w.transpose(1, 2).reshape(-1, self.in_features)[: self.out_features]

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (long [M]) of W as float32 [M, K]: an embedding lookup on a tied head."""
        return lookup_rows(ids, self.data, self.scales, self.offsets, self.bits, self.group_size,
                           self.signed, self.super_scales, self.super_offsets, self.codebook)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the weight holds (what its bytes are)."""
        return [t for t in (self.data, self.scales, self.offsets, self.super_scales,
                            self.super_offsets, self.codebook) if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def describe(self) -> str:
        book = " codebook" if self.codebook is not None else ""
        return (f"{'s' if self.signed else ''}int{self.bits}{book} g{self.group_size} "
                f"{_params_name(self.scales, self.super_scales)}")


def _codes4(codes, axis: int):
    """Blocked parameters as one per group along `axis`: 4-bit codes (uint8, two groups a byte)
    unpacked, anything else as it is; torch tensors or numpy arrays."""
    if isinstance(codes, np.ndarray) and codes.dtype == np.uint8:
        both = np.stack([codes & 0xF, codes >> 4], axis=axis + 1)
    elif isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8:
        both = torch.stack([codes & 0xF, codes >> 4], dim=axis + 1)
    else:
        return codes
    shape = list(codes.shape)
    shape[axis] *= 2
    return both.reshape(shape)


def lookup_rows(ids, data, scales, offsets, bits: int, group_size: int, signed: bool = False,
                super_scales=None, super_offsets=None, codebook=None):
    """`BlockedQuantWeight.rows_of` on torch tensors or on numpy arrays (views of a CPU weight's
    bytes: a decode step's few rows cost several times less in numpy's small-array ops than in
    torch's, kernels/cpu_int4.py), with the same values either way: each group's scale (and
    offset; two-level ones multiplied out in fp32, exact) broadcasts over a [M, K / G, G] view,
    q * scale exact, + offset rounded once."""
    f32 = (lambda a: a.astype(np.float32)) if isinstance(ids, np.ndarray) else (lambda t: t.float())
    block, lane = ids // BLOCK_N, ids % BLOCK_N
    if bits == 8:
        q = data[block, :, lane]
    elif bits == 2:  # row 16 b + j: bits 2 (j % 4) of byte j // 4
        q = f32((data[block, :, lane // 4] >> (2 * (lane % 4))[:, None]) & 3)
    elif bits == 3:  # row 16 b + j: bits 3 j .. 3 j + 2 of the 48-bit line: byte 3 j // 8 (+ next)
        i64 = (lambda a: a.astype(np.int64)) if isinstance(ids, np.ndarray) else (lambda t: t.long())
        at = 3 * lane // 8
        after = np.minimum(at + 1, 5) if isinstance(ids, np.ndarray) else (at + 1).clamp(max=5)
        two = i64(data[block, :, at]) | (i64(data[block, :, after]) << 8)
        q = (two >> (3 * lane % 8)[:, None]) & 7
        q = f32(q - 8 * (q >> 2) if signed else q)
    else:  # row 16 b + j: byte j's low nibble, row 16 b + j + 8: its high one
        q = (data[block, :, lane % 8] >> ((lane >= 8) * 4)[:, None]) & 0xF  # [M, K]
        if codebook is not None:
            q = codebook[q.astype(np.int64) if isinstance(ids, np.ndarray) else q.long()]
        extra = EXTRA_BITS[bits]
        if extra:
            q = f32(q)
        for i in range(extra):  # byte 8 + 2 i + j // 8, bit j % 8: bit 4 + i (small integers: exact)
            bit = (data[block, :, 8 + 2 * i + lane // 8] >> (lane % 8)[:, None]) & 1
            q = q + f32(bit) * float(-(16 << i) if signed and i == extra - 1 else 16 << i)
    m = q.shape[0]

    def param(codes, supers):
        p = f32(_codes4(codes[block, :, lane], 1))  # [M, K / G]
        if supers is None:
            return p
        s = f32(supers[block, :, lane])  # [M, K / SUPER_K]
        return (s.reshape(m, -1, 1) * p.reshape(m, s.shape[1], -1)).reshape(m, -1)

    w = f32(q).reshape(m, -1, group_size) * param(scales, super_scales)[:, :, None]
    if offsets is not None:
        w = w + param(offsets, super_offsets)[:, :, None]
    return w.reshape(m, -1)
