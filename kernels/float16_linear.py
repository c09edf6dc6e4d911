"""A linear over 16-bit weights as a GGUF stores them (F16 or BF16), held in those 16 bits.

`Float16Linear` keeps W [N, K] in float16 or bfloat16 (the file's own values: every one is exact in
float32) and computes y = x W^T + b. On the CPU back end (float32 activations) there is no C kernel
for it yet: the weight goes through BLAS in float32 tiles of at most TILE_ROWS output rows,
converted per call (exact: a 16-bit float widens to float32 without rounding), so the result is the
float32 reference's (nn.functional.linear over the widened weight) up to BLAS's summation order.
On the CUDA back end (a CUDA tensor, or CPU tensors inside dispatch.prefer_triton) the matmul runs
in the activations' dtype, as the back end's float linears do.

`rows_of(ids)` gives token rows as float32 (a 16-bit embedding, tied or not, reads them here).

Invariant: the module's only buffers are the 16-bit weight and the bias (loader.weight_bytes_of
counts them).
"""
from __future__ import annotations

import torch
from torch import nn

from edge_runtime.kernels import dispatch

TILE_ROWS = 1024  # output rows widened to float32 at a time on the CPU (K = 4096: 16 MiB)


class Float16Linear(nn.Module):
    """y = x @ W.T + b, W float16 / bfloat16 [N, K]; `out_splits` as QuantLinear's."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 out_splits: tuple[int, ...] | None = None):
        super().__init__()
        assert weight.dim() == 2 and weight.dtype in (torch.float16, torch.bfloat16), weight.dtype
        self.out_features, self.in_features = weight.shape
        self.out_splits = out_splits or (self.out_features,)
        assert sum(self.out_splits) == self.out_features, (self.out_splits, self.out_features)
        self.register_buffer("weight", weight.contiguous(), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-1] == self.in_features, (x.dtype, x.shape)
        rows = x.reshape(-1, self.in_features)
        if dispatch.device_kernels(rows) or x.dtype != torch.float32:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            out = nn.functional.linear(rows, self.weight.to(x.dtype), bias)
        else:
            out = torch.empty(rows.shape[0], self.out_features)
            for n0 in range(0, self.out_features, TILE_ROWS):
                n1 = min(self.out_features, n0 + TILE_ROWS)
                bias = None if self.bias is None else self.bias[n0:n1]
                out[:, n0:n1] = nn.functional.linear(rows, self.weight[n0:n1].float(), bias)
        return out.view(*x.shape[:-1], self.out_features)

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (long [M]) of W as float32 [M, K]."""
        return self.weight[ids].float()

    def extra_repr(self) -> str:
        dtype = str(self.weight.dtype).removeprefix("torch.")
        return f"in_features={self.in_features}, out_splits={self.out_splits}, {dtype}"
