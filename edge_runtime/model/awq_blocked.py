"""AutoAWQ GEMM linears served as the runtime's blocked format (quant/int4_format.py): QuantLinear.

At load (model/awq_model.py, the default "blocked" AWQ backend) each checkpoint linear's
qweight / qzeros / scales become a `BlockedQuantWeight` (`int4_format.from_awq`: W = s q + (-s z),
fp32 parameters, exact) in a `QuantLinear` (kernels/cpu_int4.py): the C kernels on the CPU back end,
the blocked W4A16 Triton kernel on the CUDA back end, the same bytes for both, as for a GGUF. Then
`fuse_layers` puts each layer's q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj`
(blocked rows concatenate when every part but the last fills whole 16-row blocks), which is what
the CPU back end's one-call layer stack (kernels/cpu_decoder.py) takes.

Invariants: every weight dequantizes to exactly AutoAWQ's (q - z) s (s q and s z are exact in fp32,
so their sum is the exact, representable product; tests/test_awq_model.py compares bit for bit);
the model's modules and parameters otherwise stay as the loader made them.
"""
from __future__ import annotations

import torch
from torch import nn

from edge_runtime.kernels.cpu_int4 import QuantLinear
from edge_runtime.quant.int4_format import BLOCK_N, BlockedQuantWeight, from_awq

_FUSED = (("self_attn", ("q_proj", "k_proj", "v_proj"), "qkv_proj"),
          ("mlp", ("gate_proj", "up_proj"), "gate_up_proj"))


def awq_quant_linear(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                     group_size: int, bias: torch.Tensor | None) -> QuantLinear:
    """One checkpoint linear as a QuantLinear on the checkpoint tensors' device."""
    device = qweight.device
    rows = from_awq(qweight.cpu(), qzeros.cpu(), scales.cpu(), group_size)
    linear = QuantLinear(BlockedQuantWeight.from_rows(rows), None if bias is None else bias.cpu())
    return linear.to(device)


def concat_blocked(parts: list[BlockedQuantWeight]) -> BlockedQuantWeight | None:
    """The rows of `parts` one after another in one blocked weight, or None when they cannot
    share one (a part other than the last with a partial block, or different forms)."""
    first = parts[0]
    same = all(p.bits == first.bits and p.group_size == first.group_size
               and p.in_features == first.in_features and p.scales.dtype == first.scales.dtype
               and (p.offsets is None) == (first.offsets is None) for p in parts)
    if not same or any(p.out_features % BLOCK_N for p in parts[:-1]):
        return None
    offsets = None if first.offsets is None else torch.cat([p.offsets for p in parts])
    return BlockedQuantWeight(torch.cat([p.data for p in parts]), torch.cat([p.scales for p in parts]),
                              offsets, first.bits, first.group_size,
                              sum(p.out_features for p in parts), first.in_features)


def _fused(mods: list[QuantLinear]) -> QuantLinear | None:
    weight = concat_blocked([m.weight for m in mods])
    if weight is None:
        return None
    biases = [m.bias for m in mods]
    if any(b is not None for b in biases):
        biases = [torch.zeros(m.out_features, device=m.data.device) if b is None else b
                  for m, b in zip(mods, biases)]
        bias = torch.cat(biases)
    else:
        bias = None
    return QuantLinear(weight, bias, tuple(m.out_features for m in mods))


def fuse_layers(model: nn.Module) -> int:
    """Per decoder layer, q/k/v and gate/up QuantLinears -> one each (the HF-named ones removed);
    returns how many fused modules were made (parts that cannot fuse stay as they are)."""
    count = 0
    for layer in model.model.layers:
        for owner_name, names, fused_name in _FUSED:
            owner = getattr(layer, owner_name)
            mods = [getattr(owner, n, None) for n in names]
            if not all(isinstance(m, QuantLinear) for m in mods):
                continue
            fused = _fused(mods)
            if fused is None:
                continue
            setattr(owner, fused_name, fused)
            for n in names:
                delattr(owner, n)
            count += 1
    return count
