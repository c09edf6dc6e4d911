"""fp32 linear on CPU with weights converted once to a layout made for decode.

Why: torch's `F.linear` on fp32 CPU tensors goes to MKL, whose GEMV on this AMD EPYC reads weights
at a quarter to a third of the machine's read bandwidth; oneDNN's inner product on weights reordered
for it reaches about half. Decode reads every weight once per step, so this is the decode speed.
Two backends, chosen once per process (`backend()`):
- "c-blocked" (default where kernels/csrc builds): kernels/csrc/linear_f32.c over weights blocked
  as [ceil(N/16)][K][16]; one row reads the weights at the machine's read bandwidth (docs/cpu-backend.md,
  "CPU linears"). A tied LM head and its embedding share the blocked tensor (`BlockedEmbedding`).
- "onednn": oneDNN's inner product on weights reordered for it (`_reorder_linear_weight`); used
  where no C compiler is found, or with EDGE_RUNTIME_CPU_LINEAR=onednn. A tied head there runs on
  the embedding's dense weight (no copy).
EDGE_RUNTIME_CPU_LINEAR=dense keeps MKL's F.linear (nothing is packed).

`PackedLinear` replaces one nn.Linear, or several that read the same input (q/k/v, gate/up), whose
rows it concatenates: one call instead of three reads the same bytes with fewer, larger GEMVs. Its
reference is `F.linear` with the concatenated weight (`reference_forward`), which tests compare to.

Invariants:
- Only plain fp32 nn.Linear weights on CPU are packed; the original weight is dropped by the caller
  when nothing else shares it (memory is the point).
- Outputs are fp32 sums in a different order than MKL's (1e-6 relative); no reduced precision.
"""
from __future__ import annotations

import torch
from torch import nn

from edge_runtime import env
from edge_runtime.kernels import cpu_native

# Rows oneDNN's reordered layout is tuned for: decode batches of 1-16 are within 10% of their best.
BATCH_HINT = 16
ENV_SWITCH = env.CPU_LINEAR  # auto (default) | c-blocked | onednn | dense (A/B runs)
BLOCK_N = 16  # output rows per block of kernels/csrc/linear_f32.c
# c-blocked: from this many rows on (prefill chunks), a batched matmul over the blocked weights
# instead of the C kernel. On an Intel Xeon VM, weights cold, 576 x 3,072
# (`edge-runtime bench linear-rows --rows 8,32,128,512 --copies 20`, after the T0 prefetch of
# linear_f32.c): 8 rows C 0.41 / matmul 0.49 ms, 32 rows 0.92 / 0.89, 128 rows 3.1 / 2.5, 512
# rows 11.7 / 9.2: about even below ~32 rows, BLAS ahead above (docs/perf.md, "bench linear").
# With 12-row passes on AVX-512 the C kernel is ahead up to ~32-48 rows, so
# the switch moved from 8 to 32 rows: short prefills mixed into decode steps stay in C.
GEMM_MIN_ROWS = 32


def onednn_available() -> bool:
    """torch has oneDNN with the prepacked linear ops this module's "onednn" kind calls."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
            and hasattr(ops, "_reorder_linear_weight"))


def backend() -> str | None:
    """"c-blocked", "onednn", or None (F.linear), from EDGE_RUNTIME_CPU_LINEAR and what exists."""
    choice = env.cpu_linear()
    if choice == "dense":
        return None
    if choice in ("auto", "c-blocked"):
        if cpu_native.library() is not None:
            return "c-blocked"
    if choice in ("auto", "onednn", "c-blocked") and onednn_available():
        return "onednn"
    return None


def available() -> bool:
    return backend() is not None


def blocked_numel(out_features: int, in_features: int) -> int:
    return -(-out_features // BLOCK_N) * BLOCK_N * in_features


def block_weight(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, K] -> [ceil(N/16), K, 16]: each block of 16 output rows stored column by column (rows
    past N zero). out: 1-D storage of `blocked_numel(N, K)` elements to fill (e.g. from a
    HugePageArena), else new memory."""
    n, k = weight.shape
    nb = -(-n // BLOCK_N)
    blocked = (torch.empty(nb, k, BLOCK_N, dtype=weight.dtype) if out is None
               else out.view(nb, k, BLOCK_N))
    full = n // BLOCK_N
    if full:
        blocked[:full].copy_(weight[:full * BLOCK_N].view(full, BLOCK_N, k).transpose(1, 2))
    if nb > full:
        blocked[full:].zero_()
        blocked[full, :, : n - full * BLOCK_N].copy_(weight[full * BLOCK_N:].t())
    return blocked


def packable(linear: nn.Module) -> bool:
    return (type(linear) is nn.Linear and linear.weight.dtype == torch.float32
            and linear.weight.device.type == "cpu")


class PackedLinear(nn.Module):
    """y = x @ cat(W_i).T + cat(b_i) with the weights in the backend's layout (`packed`: blocked
    [ceil(N/16), K, 16] for c-blocked, opaque for oneDNN); `out_splits` are the parts' output
    sizes so the caller can split y."""

    def __init__(self, linears: list[nn.Linear], batch_hint: int = BATCH_HINT, reorder: bool = True,
                 kind: str | None = None, arena=None):
        """kind: "c-blocked" | "onednn" (default: `backend()`). reorder=False (oneDNN, one linear
        only): oneDNN on the dense weight itself, no copy, for a weight that stays in use elsewhere
        (a tied embedding), ~20% slower than the reordered layout. arena: a HugePageArena
        (kernels/huge_pages.py) the c-blocked weight is stored in."""
        super().__init__()
        self.kind = kind or backend()
        assert self.kind in ("c-blocked", "onednn"), f"no packed linear backend ({self.kind})"
        assert reorder or len(linears) == 1, "fusing needs a reordered copy"
        assert linears and all(packable(m) for m in linears), [type(m).__name__ for m in linears]
        in_features = {m.in_features for m in linears}
        assert len(in_features) == 1, f"fused linears must share the input size, got {in_features}"
        self.in_features = in_features.pop()
        self.out_splits = tuple(m.out_features for m in linears)
        self.out_features = sum(self.out_splits)
        with torch.no_grad():
            weight = torch.cat([m.weight.detach() for m in linears]) if len(linears) > 1 \
                else linears[0].weight.detach()
            self.reordered = reorder or self.kind == "c-blocked"
            if self.kind == "c-blocked":
                self._lib = cpu_native.library()
                n, k = weight.shape
                self.packed = block_weight(weight, None if arena is None
                                           else arena.take(blocked_numel(n, k)))
            else:
                self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), batch_hint)
                               if reorder else weight)
            has_bias = any(m.bias is not None for m in linears)
            self.bias = torch.cat([m.bias.detach() if m.bias is not None
                                   else torch.zeros(m.out_features) for m in linears]) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] float32 -> [..., out_features]."""
        assert x.dtype == torch.float32 and x.shape[-1] == self.in_features, (x.dtype, x.shape)
        if self.kind == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        k, n = self.in_features, self.out_features
        rows = x.reshape(-1, k)
        if rows.shape[0] >= GEMM_MIN_ROWS:
            return self._gemm(rows).view(*x.shape[:-1], n)
        return self.c_kernel(rows).view(*x.shape[:-1], n)

    def c_kernel(self, rows: torch.Tensor) -> torch.Tensor:
        """rows: [M, in_features] float32 -> [M, out_features] through kernels/csrc/linear_f32.c
        whatever M (forward hands GEMM_MIN_ROWS+ rows to BLAS; probes and tests call this)."""
        k, n = self.in_features, self.out_features
        if rows.stride(1) != 1 or rows.stride(0) < k:
            rows = rows.contiguous()
        out = torch.empty(rows.shape[0], n, dtype=torch.float32)
        if rows.shape[0]:
            rc = self._lib.linear_blocked_f32(
                self.packed.data_ptr(), None if self.bias is None else self.bias.data_ptr(),
                rows.data_ptr(), rows.stride(0), out.data_ptr(), n, n, k, rows.shape[0],
                torch.get_num_threads())
            assert rc == 0, f"linear_blocked_f32 returned {rc}"
        return out

    def _gemm(self, rows: torch.Tensor) -> torch.Tensor:
        """Many rows (a prefill chunk): one batched matmul over the blocks, [M, K] @ [nb, K, 16]
        -> [nb, M, 16], read back as [M, N]. Compute-bound here, where BLAS's blocking beats the
        C kernel's six-row passes (made for streaming weights at decode)."""
        m, n = rows.shape[0], self.out_features
        out = torch.matmul(rows, self.packed).permute(1, 0, 2).reshape(m, -1)[:, :n]
        return out + self.bias if self.bias is not None else out.contiguous()

    def reference_forward(self, x: torch.Tensor, linears: list[nn.Linear]) -> torch.Tensor:
        weight = torch.cat([m.weight for m in linears])
        bias = (torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features)
                           for m in linears]) if self.bias is not None else None)
        return nn.functional.linear(x, weight, bias)

    def extra_repr(self) -> str:
        layout = "reordered" if self.reordered else "dense (shared)"
        if self.kind == "c-blocked":
            layout = "blocked x16"
        return f"in_features={self.in_features}, out_splits={self.out_splits}, backend={self.kind} {layout}"


class BlockedEmbedding(nn.Module):
    """The token embedding read from a tied LM head's blocked weight (c-blocked), so the matrix is
    stored once: row t is column t % 16 of block t // 16. Same values as nn.Embedding."""

    def __init__(self, head: PackedLinear):
        super().__init__()
        assert head.kind == "c-blocked" and len(head.out_splits) == 1, head
        self.head = [head]  # not a submodule: the head owns the tensor, this only reads it
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    @property
    def blocked(self) -> torch.Tensor:
        return self.head[0].packed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: long [...] -> float32 [..., embedding_dim]."""
        flat = ids.reshape(-1)
        return self.blocked[flat // BLOCK_N, :, flat % BLOCK_N].view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, shared with the blocked LM head"
