"""Linears and embeddings over quantized weights: C kernels on the CPU (kernels/csrc/linear_int4.c),
the Triton W4A16 kernel on the CUDA back end (kernels/blocked_w4a16.py).

`QuantLinear` holds one `BlockedQuantWeight` (quant/int4_format.py: 2- to 8-bit integers
or 4-bit codebook indices, per-group scale and offset, one- or two-level, blocks of 16 output rows) and computes y = x W^T + b. On the CUDA back
end (a CUDA tensor, or CPU tensors inside dispatch.prefer_triton: the interpreter) every call runs
dispatch.blocked_gemm on the same bytes, in the activations' dtype (fp16 on the Orin budgets) with
fp32 accumulation. On the CPU back end (float32 activations):
- up to GEMM_MIN_ROWS rows (decode steps, short prefills): linear_int4.c's kernel reads the 4-bit
  weights directly, 12 (AVX-512) or 6 rows a pass, and applies a group's scale and offset to the
  group's sums (s sum q x + o sum x: the reference's value in another summation order). A row's
  output is the same bits whatever rows and threads compute it.
- more rows (prefill chunks): blocks are dequantized into an fp32 tile of at most TILE_FLOATS
  (dequant_blocks_q) and multiplied by BLAS, tile by tile; the dequantized values are exact, only the
  summation order is BLAS's.
- no C library: the plain-torch reference (`reference_forward`), dequantizing per call.
`QuantEmbedding` reads token rows from the same blocked weight (a tied LM head and its embedding
share it, as cpu_linear.BlockedEmbedding does for fp32), in the model's activation dtype.
`blocked_weight_struct(module)` is what decoder.c gets for a QuantLinear or a c-blocked PackedLinear.
`place_in_arena(modules)` moves CPU QuantLinears' bytes into one huge-page-backed allocation, as
the fp32 blocked weights live (kernels/huge_pages.py): decode streams them every step.

Invariant: the module's buffers are exactly the weight bytes it holds (loader.weight_bytes_of
counts them; nothing else is kept).
"""
from __future__ import annotations

import ctypes

import torch
from torch import nn

from edge_runtime.kernels import cpu_native, dispatch
from edge_runtime.kernels.huge_pages import HugePageArena
from edge_runtime.quant.int4_format import BLOCK_N, BlockedQuantWeight, lookup_rows

ARENA_ALIGN = 64  # bytes: each tensor in the arena starts on a cache line
GEMM_MIN_ROWS = 32  # as cpu_linear.GEMM_MIN_ROWS: from here on BLAS over dequantized tiles
TILE_FLOATS = 1 << 19  # 2 MiB of fp32 per dequantized tile
MAX_GROUPS = 8192  # groups per row: the C kernels keep a row's group sums on the stack (GROUP_SUMS)
# a BlockedQuantWeight's tensors, a QuantLinear's buffers under the same names
WEIGHT_TENSORS = ("data", "scales", "offsets", "super_scales", "super_offsets", "codebook")


class BlockedWeight(ctypes.Structure):
    """linear_int4.c's blocked_weight."""

    _fields_ = [("data", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("offsets", ctypes.c_void_p), ("bits", ctypes.c_int32), ("group", ctypes.c_int32),
                ("params_f32", ctypes.c_int32), ("signed5", ctypes.c_int32),
                ("super_scales", ctypes.c_void_p), ("super_offsets", ctypes.c_void_p),
                ("codebook", ctypes.c_void_p), ("codes4", ctypes.c_int32)]


def declare(lib) -> None:
    """The argument types of linear_int4.c's entry points (once per library)."""
    if lib.linear_blocked_q.argtypes is not None:
        return
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.linear_blocked_q.restype = ctypes.c_int
    lib.linear_blocked_q.argtypes = [ctypes.POINTER(BlockedWeight), ptr, ptr, i64, ptr, i64, i64,
                                     i64, i64, ctypes.c_int]
    lib.dequant_blocks_q.restype = ctypes.c_int
    lib.dequant_blocks_q.argtypes = [ctypes.POINTER(BlockedWeight), i64, i64, i64, ptr,
                                     ctypes.c_int]


def _library():
    lib = cpu_native.library()
    if lib is not None:
        declare(lib)
    return lib


def blocked_weight_struct(module: nn.Module) -> BlockedWeight:
    """The C view of a QuantLinear's or a c-blocked PackedLinear's weight."""
    if isinstance(module, QuantLinear):
        return module.c_weight()
    assert getattr(module, "kind", None) == "c-blocked", module
    return BlockedWeight(module.packed.data_ptr(), None, None, 32, 1, 0, 0)


class QuantLinear(nn.Module):
    """y = x @ W.T + b with W a BlockedQuantWeight; `out_splits`: the output sizes of the fused
    parts (q, k, v / gate, up), as PackedLinear."""

    def __init__(self, weight: BlockedQuantWeight, bias: torch.Tensor | None = None,
                 out_splits: tuple[int, ...] | None = None):
        super().__init__()
        if weight.in_features // weight.group_size > MAX_GROUPS:
            raise ValueError(f"a quantized linear with {weight.in_features} inputs in groups of "
                             f"{weight.group_size} has {weight.in_features // weight.group_size} "
                             f"groups per row; the CPU kernels take at most {MAX_GROUPS} "
                             "(quantize with a larger group size)")
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bits, self.group_size, self.signed = weight.bits, weight.group_size, weight.signed
        self.out_splits = out_splits or (self.out_features,)
        assert sum(self.out_splits) == self.out_features, (self.out_splits, self.out_features)
        for name in WEIGHT_TENSORS:
            self.register_buffer(name, getattr(weight, name), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous(),
                             persistent=False)
        self._lib = _library()

    @property
    def weight(self) -> BlockedQuantWeight:
        return BlockedQuantWeight(self.data, self.scales, self.offsets, self.bits, self.group_size,
                                  self.out_features, self.in_features, self.signed,
                                  self.super_scales, self.super_offsets, self.codebook)

    def c_weight(self) -> BlockedWeight:
        def ptr(t):
            return None if t is None else t.data_ptr()

        return BlockedWeight(ptr(self.data), ptr(self.scales), ptr(self.offsets), self.bits,
                             self.group_size, int(self.scales.dtype == torch.float32),
                             int(self.signed), ptr(self.super_scales), ptr(self.super_offsets),
                             ptr(self.codebook), int(self.scales.dtype == torch.uint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] -> [..., out_features] in x's dtype (float32 on the CPU back end)."""
        assert x.shape[-1] == self.in_features, (x.dtype, x.shape)
        rows = x.reshape(-1, self.in_features)
        if dispatch.device_kernels(rows):
            out = dispatch.blocked_gemm(rows if rows.stride(1) == 1 else rows.contiguous(), self.weight)
            if self.bias is not None:
                out = out + self.bias.to(out.dtype)
            return out.view(*x.shape[:-1], self.out_features)
        assert x.dtype == torch.float32, x.dtype
        if self._lib is None:
            out = self.reference_forward(rows)
        elif rows.shape[0] >= GEMM_MIN_ROWS:
            out = self._gemm(rows)
        else:
            out = self.c_kernel(rows)
        return out.view(*x.shape[:-1], self.out_features)

    def c_kernel(self, rows: torch.Tensor) -> torch.Tensor:
        """rows: [M, in_features] -> [M, out_features] through linear_int4.c whatever M."""
        k, n = self.in_features, self.out_features
        if rows.stride(1) != 1 or rows.stride(0) < k:
            rows = rows.contiguous()
        out = torch.empty(rows.shape[0], n, dtype=torch.float32)
        if rows.shape[0]:
            weight = self.c_weight()
            rc = self._lib.linear_blocked_q(
                ctypes.byref(weight), None if self.bias is None else self.bias.data_ptr(),
                rows.data_ptr(), rows.stride(0), out.data_ptr(), n, n, k, rows.shape[0],
                torch.get_num_threads())
            assert rc == 0, f"linear_blocked_q returned {rc}"
        return out

    def dequantized_blocks(self, b0: int, b1: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Blocks [b0, b1) as fp32 [b1 - b0, K, 16] (linear_int4.c's dequant_blocks_q)."""
        k = self.in_features
        tile = torch.empty(b1 - b0, k, BLOCK_N) if out is None else out[: (b1 - b0) * k * BLOCK_N]
        weight = self.c_weight()
        rc = self._lib.dequant_blocks_q(ctypes.byref(weight), k, b0, b1, tile.data_ptr(),
                                        torch.get_num_threads())
        assert rc == 0, f"dequant_blocks_q returned {rc}"
        return tile.view(b1 - b0, k, BLOCK_N)

    def _gemm(self, rows: torch.Tensor) -> torch.Tensor:
        """Many rows: dequantize tiles of blocks and multiply them by BLAS, [M, K] @ [nb, K, 16]."""
        m, k, n = rows.shape[0], self.in_features, self.out_features
        nb = self.data.shape[0]
        per_tile = max(1, TILE_FLOATS // (k * BLOCK_N))
        buffer = torch.empty(min(nb, per_tile) * k * BLOCK_N)
        out = torch.empty(m, nb * BLOCK_N)
        for b0 in range(0, nb, per_tile):
            b1 = min(nb, b0 + per_tile)
            tile = self.dequantized_blocks(b0, b1, buffer)
            out[:, b0 * BLOCK_N: b1 * BLOCK_N] = torch.matmul(rows, tile).permute(1, 0, 2).reshape(m, -1)
        out = out[:, :n]
        return out + self.bias if self.bias is not None else out.contiguous()

    def reference_forward(self, rows: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(rows, self.weight.dequantize(), self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_splits={self.out_splits}, "
                f"{self.weight.describe()} blocked x16")


def place_in_arena(modules: list[QuantLinear]) -> int:
    """Move the data and parameters (WEIGHT_TENSORS) of the CPU `modules` into one HugePageArena (same bytes,
    each tensor cache-line aligned), one module at a time so the old copy is freed as the next is
    made. With the bytes scattered over ordinary 4 KiB pages the int4 decode GEMV read them ~1.3x
    slower here (docs/cpu-backend.md, "CPU linears"). Returns the bytes moved."""
    places = [(m, n) for m in modules for n in WEIGHT_TENSORS
              if getattr(m, n) is not None and getattr(m, n).device.type == "cpu"]
    if not places:
        return 0
    arena = HugePageArena(sum(_aligned(getattr(m, n).nbytes) for m, n in places), torch.uint8)
    moved = 0
    for module, name in places:
        old = getattr(module, name)
        new = arena.take(_aligned(old.nbytes))[:old.nbytes].view(old.dtype).view(old.shape)
        new.copy_(old)
        setattr(module, name, new)  # a registered buffer: replaced, the old tensor freed
        moved += old.nbytes
    return moved


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN


class QuantEmbedding(nn.Module):
    """Token rows of a QuantLinear's (or a Float16Linear's) weight (a tied LM head): ids long [...] -> `dtype`
    [..., embedding_dim], the dequantized table's values (rounded to `dtype`, as a float
    embedding in that dtype would hold them)."""

    def __init__(self, head: QuantLinear, dtype: torch.dtype = torch.float32, owns: bool = False):
        """owns: the table is this embedding's own (an untied head), a submodule, so its bytes
        are counted and moved with the model; else the tied LM head owns it."""
        super().__init__()
        self.head = [head]  # a tied head owns the tensors; this only reads them
        if owns:
            self.table = head
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        head, flat = self.head[0], ids if ids.dim() == 1 else ids.reshape(-1)
        if not isinstance(head, QuantLinear):  # a 16-bit table (kernels/float16_linear.py)
            rows = head.rows_of(flat)
        elif dispatch.device_kernels(head.data):
            rows = head.weight.rows_of(flat)
        else:  # numpy views of the same bytes: the CPU back end's decode step looks up here
            def view(t):
                return None if t is None else t.numpy()

            rows = torch.from_numpy(lookup_rows(
                flat.numpy(), head.data.numpy(), head.scales.numpy(), view(head.offsets),
                head.bits, head.group_size, head.signed, view(head.super_scales),
                view(head.super_offsets), view(head.codebook)))
        if rows.dtype != self.dtype:  # no no-op .to / .view trips for a step's float32 rows
            rows = rows.to(self.dtype)
        return rows if ids.dim() == 1 else rows.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        shared = "" if hasattr(self, "table") else ", shared with the quantized LM head"
        return f"{self.num_embeddings}, {self.embedding_dim}{shared}"
