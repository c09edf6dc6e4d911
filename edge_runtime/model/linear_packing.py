"""Run-time conversion of a loaded fp32 CPU model's linears to oneDNN packed weights.

What changes (only when `kernels/cpu_linear.available()` and the model is fp32 on CPU):
- per layer, q/k/v_proj become one `self_attn.qkv_proj` and gate/up_proj one `mlp.gate_up_proj`
  (each a PackedLinear over the concatenated rows; the HF-named modules are removed), o_proj and
  down_proj are packed in place;
- lm_head is packed, except when tied to the embedding: a reordered copy would cost vocab x hidden
  x 4 more bytes (108 MiB for SmolLM2) for a ~20% faster LM head, so a tied head runs oneDNN on the
  embedding's dense weight itself (memory is the point of this runtime).
AWQ (AWQLinear) and non-fp32 linears are left alone. Loading and quantizing work on the HF names,
so this runs after loading, when an Engine takes the model (`Engine.__init__`), and only once.

Invariant: the packed model computes the same function (fp32, summation order aside: tests compare
logits against the unpacked model and transformers).
"""
from __future__ import annotations

from torch import nn

from edge_runtime.kernels import cpu_linear
from edge_runtime.kernels.cpu_linear import PackedLinear, packable


def pack_linears(model: nn.Module) -> int:
    """Pack `model` (a CausalLM) in place; returns the number of PackedLinear modules (0: unchanged)."""
    if getattr(model, "linears_packed", 0) or not cpu_linear.available():
        return getattr(model, "linears_packed", 0)
    count = 0
    for layer in model.model.layers:
        count += _pack_layer(layer)
    _own_storage(model)  # before the head: a tied head must share the embedding's final memory
    if packable(model.lm_head):
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        model.lm_head = PackedLinear([model.lm_head], reorder=not tied)
        count += 1
    model.linears_packed = count
    return count


def _own_storage(model: nn.Module) -> None:
    """Copy every remaining tensor into memory of its own. safetensors' tensors live in one
    private mapping of the file; while one of them (the embedding, a norm weight) lives, the
    mapping stays, with every page that packing read resident (+517 MiB RSS for SmolLM2, measured)."""
    for t in list(model.parameters()) + list(model.buffers()):
        t.data = t.data.clone()


def _fuse(owner: nn.Module, names: tuple[str, ...], fused_name: str) -> int:
    parts = [getattr(owner, n) for n in names]
    if not all(packable(m) for m in parts):
        return 0
    setattr(owner, fused_name, PackedLinear(parts))
    for n in names:
        delattr(owner, n)
    return 1


def _pack_layer(layer: nn.Module) -> int:
    attn, mlp = layer.self_attn, layer.mlp
    count = _fuse(attn, ("q_proj", "k_proj", "v_proj"), "qkv_proj")
    count += _fuse(mlp, ("gate_proj", "up_proj"), "gate_up_proj")
    for owner, name in ((attn, "o_proj"), (mlp, "down_proj")):
        if packable(getattr(owner, name)):
            setattr(owner, name, PackedLinear([getattr(owner, name)]))
            count += 1
    return count
