"""`AWQLinear`: an nn.Linear replacement that holds AutoAWQ GEMM int4 weights.

Backends, chosen once in `prepare()` from the device of the checkpoint tensors:

- "cpu-int4pack": the checkpoint tensors are repacked once into torch's CPU int4 weight-only
  layout (`_convert_weight_to_int4pack_for_cpu`) and dropped; a call runs
  `_weight_int4pack_mm_for_cpu` with bf16 activations and bf16 (scale, zero) pairs, fp32 in and
  out around it. torch's format dequantizes as `(q - 8) * scale + zero`, so an AWQ group
  (q - z) * s maps to zero = (8 - z) * s. bf16 costs ~0.2% relative error per matmul (measured in
  tests/test_awq_linear.py); the exact fp32 variant of the same op is ~100x slower on CPU.
- "awq-gemm": CUDA; the checkpoint tensors are converted once into the kernels' prepared layout
  (`dispatch.prepare_awq`, same weight bytes) and dropped; a call runs
  `dispatch.awq_gemm_prepared` (Triton W4A16; 1.26-1.45x faster than `awq_gemm` on the raw
  AutoAWQ packing at M = 1..16 on an H200, docs/perf-gpu.md). On a CPU tensor the same backend runs
  the prepared layout's torch reference (how the tests exercise it without a GPU).
- "reference": dequantize per call with the plain-torch reference (exact; slow; any device);
  "auto" falls back to it on CPU when out_features % 16 != 0 (torch's int4 layout needs that).

Invariant: after `prepare()`, `weight_bytes()` is the number of bytes this module really holds.
"""

from __future__ import annotations

import torch
from torch import nn

from edge_runtime.quant import awq_pack
from edge_runtime.kernels import dispatch
from edge_runtime.kernels.awq_prepared import PreparedAWQ

BACKENDS = ("auto", "cpu-int4pack", "awq-gemm", "reference")
_PREPARED_FIELDS = ("qweight8", "zeros", "scales", "counters")  # PreparedAWQ's tensors, in order


def _has_cpu_int4pack() -> bool:
    ops = torch.ops.aten
    return hasattr(ops, "_convert_weight_to_int4pack_for_cpu") and hasattr(
        ops, "_weight_int4pack_mm_for_cpu"
    )


class AWQLinear(nn.Module):
    """y = x @ W + b with W [in, out] stored as AutoAWQ GEMM int4 (see awq_pack)."""

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool = False):
        super().__init__()
        assert in_features % group_size == 0, (in_features, group_size)
        assert out_features % 8 == 0, out_features
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = group_size
        groups = in_features // group_size
        # non-persistent: checkpoints are read and written by model/awq_model.py, not state_dict()
        self.register_buffer("qweight", torch.zeros(in_features, out_features // 8, dtype=torch.int32),
                             persistent=False)
        self.register_buffer("qzeros", torch.zeros(groups, out_features // 8, dtype=torch.int32),
                             persistent=False)
        self.register_buffer("scales", torch.zeros(groups, out_features, dtype=torch.float16),
                             persistent=False)
        self.register_buffer("bias", torch.zeros(out_features) if bias else None, persistent=False)
        self.backend = "unprepared"

    @classmethod
    def from_tensors(cls, qweight, qzeros, scales, group_size: int, bias=None,
                     backend: str = "auto") -> "AWQLinear":
        """Build from checkpoint tensors (qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N])."""
        in_features, out_features = qweight.shape[0], qweight.shape[1] * 8
        mod = cls(in_features, out_features, group_size, bias=bias is not None)
        assert qzeros.shape == mod.qzeros.shape, (tuple(qzeros.shape), tuple(mod.qzeros.shape))
        assert scales.shape == mod.scales.shape, (tuple(scales.shape), tuple(mod.scales.shape))
        mod.qweight = qweight.to(torch.int32)
        mod.qzeros = qzeros.to(torch.int32)
        mod.scales = scales.to(torch.float16)
        if bias is not None:
            mod.bias = bias.float()
        return mod.prepare(backend)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int, backend: str = "auto") -> "AWQLinear":
        """Round-to-nearest quantization of a float linear (the AWQ search happens before this)."""
        qweight, qzeros, scales = awq_pack.pack_linear_weight(linear.weight.data, group_size)
        bias = None if linear.bias is None else linear.bias.data
        return cls.from_tensors(qweight, qzeros, scales, group_size, bias, backend)

    def prepare(self, backend: str = "auto") -> "AWQLinear":
        """Pick the backend and convert the weights for it (once)."""
        assert backend in BACKENDS, backend
        if backend == "auto":
            if self.qweight.is_cuda:
                backend = "awq-gemm"
            elif _has_cpu_int4pack() and self.out_features % 16 == 0:
                backend = "cpu-int4pack"
            else:
                backend = "reference"
        if backend == "cpu-int4pack":
            # torch's CPU int4 layout packs output channels in 16s
            assert self.out_features % 16 == 0, ("cpu-int4pack needs out_features % 16 == 0",
                                                 self.out_features)
            self._repack_cpu()
        if backend == "awq-gemm":
            self._prepare_w4a16()
        self.backend = backend
        return self

    def _prepare_w4a16(self) -> None:
        prepared = dispatch.prepare_awq(self.qweight, self.qzeros, self.scales, self.group_size)
        # buffers, so weight_bytes_of counts them and .to(device) moves them; `prepared` rebuilds the tuple
        for name in _PREPARED_FIELDS:
            self.register_buffer(f"prepared_{name}", getattr(prepared, name), persistent=False)
        self.qweight = None
        self.qzeros = None
        self.scales = None

    def _repack_cpu(self) -> None:
        q = awq_pack.unpack_int4(self.qweight)  # [K, N]
        z = awq_pack.unpack_int4(self.qzeros).float()  # [K/G, N]
        s = self.scales.float()
        # int4pack wants [N, K] int32 values in [0, 15]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.t().contiguous(), 1)
        self.register_buffer("int4_weight", packed, persistent=False)  # uint8 [N, K/2]
        # scales_and_zeros: [K/G, N, 2] bf16, dequant (q - 8) * scale + zero
        sz = torch.stack([s, (8.0 - z) * s], dim=-1).to(torch.bfloat16)
        self.register_buffer("int4_scales_zeros", sz, persistent=False)
        # the checkpoint tensors are not needed any more: free them (memory is the point)
        self.qweight = None
        self.qzeros = None
        self.scales = None

    @property
    def prepared(self):
        """The PreparedAWQ of the "awq-gemm" backend (None before / for other backends)."""
        if getattr(self, "prepared_qweight8", None) is None:
            return None

        return PreparedAWQ(*(getattr(self, f"prepared_{n}") for n in _PREPARED_FIELDS), self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if self.backend == "cpu-int4pack":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16), self.int4_weight, self.group_size, self.int4_scales_zeros
            ).to(x.dtype)
        elif self.backend == "awq-gemm":
            y = dispatch.awq_gemm_prepared(x2.contiguous(), self.prepared).to(x.dtype)
        else:
            assert self.backend == "reference", self.backend
            w = awq_pack.dequantize(self.qweight, self.qzeros, self.scales, self.group_size)
            y = (x2.float() @ w.to(x2.device)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def weight_bytes(self) -> int:
        tensors = [getattr(self, n, None) for n in
                   ("qweight", "qzeros", "scales", "bias", "int4_weight", "int4_scales_zeros")]
        tensors += [getattr(self, f"prepared_{n}", None) for n in _PREPARED_FIELDS]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, backend={self.backend}")
