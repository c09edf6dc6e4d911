"""fp32 linear on CPU through oneDNN with weights reordered once into its blocked layout.

Why: torch's `F.linear` on fp32 CPU tensors goes to MKL, whose GEMV on this AMD EPYC reads weights at
~12 GB/s with 2 threads (a third of the machine's 36 GB/s read bandwidth) and gets slower at 2-5 rows;
oneDNN's inner-product primitive on weights reordered for it reads them at 23-29 GB/s for 1-16 rows
(measured in docs/perf.md, "CPU linears"). Decode is weight-bound, so this is the decode speed.

`PackedLinear` replaces one nn.Linear, or several that read the same input (q/k/v, gate/up), whose
rows it concatenates: one call instead of three reads the same bytes with fewer, larger GEMVs. Its
reference is `F.linear` with the concatenated weight (`reference_forward`), which tests compare to.

Invariants:
- Only plain fp32 nn.Linear weights on CPU are packed; the packed tensor is opaque (oneDNN layout),
  so the original weight is dropped by the caller when nothing else shares it (memory is the point).
- `available()` is False where torch has no oneDNN or the two private ops (then nothing is packed).
- The output is bit-for-bit what oneDNN computes in fp32 (no reduced-precision math mode), which
  differs from MKL's summation order at the 1e-6 relative level.
"""
from __future__ import annotations

import os

import torch
from torch import nn

# Rows the reordered layout is tuned for: decode batches of 1-16 are within 10% of their best here.
BATCH_HINT = 16
ENV_SWITCH = "EDGE_RUNTIME_CPU_LINEAR"  # "dense" keeps MKL's F.linear (A/B measurements)


def available() -> bool:
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
            and hasattr(ops, "_reorder_linear_weight") and os.environ.get(ENV_SWITCH, "") != "dense")


def packable(linear: nn.Module) -> bool:
    return (type(linear) is nn.Linear and linear.weight.dtype == torch.float32
            and linear.weight.device.type == "cpu")


class PackedLinear(nn.Module):
    """y = x @ cat(W_i).T + cat(b_i) with the weights in oneDNN's layout; `out_splits` are the
    parts' output sizes so the caller can split y."""

    def __init__(self, linears: list[nn.Linear], batch_hint: int = BATCH_HINT, reorder: bool = True):
        """reorder=False (one linear only): oneDNN on the dense weight itself, no copy; for a weight
        that stays in use elsewhere (a tied embedding), ~20% slower than the reordered layout."""
        super().__init__()
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
            self.reordered = reorder
            self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), batch_hint)
                           if reorder else weight)
            has_bias = any(m.bias is not None for m in linears)
            self.bias = torch.cat([m.bias.detach() if m.bias is not None
                                   else torch.zeros(m.out_features) for m in linears]) if has_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] float32 -> [..., out_features]."""
        assert x.dtype == torch.float32 and x.shape[-1] == self.in_features, (x.dtype, x.shape)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def reference_forward(self, x: torch.Tensor, linears: list[nn.Linear]) -> torch.Tensor:
        weight = torch.cat([m.weight for m in linears])
        bias = (torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features)
                           for m in linears]) if self.bias is not None else None)
        return nn.functional.linear(x, weight, bias)

    def extra_repr(self) -> str:
        layout = "reordered" if self.reordered else "dense (shared)"
        return f"in_features={self.in_features}, out_splits={self.out_splits}, backend=onednn {layout}"
