"""Run-time conversion of a loaded fp32 CPU model's linears to packed weights (kernels/cpu_linear.py).

What changes (only when `kernels/cpu_linear.available()` and the model is fp32 on CPU):
- per layer, q/k/v_proj become one `self_attn.qkv_proj` and gate/up_proj one `mlp.gate_up_proj`
  (each a PackedLinear over the concatenated rows; the HF-named modules are removed), o_proj and
  down_proj are packed in place;
- lm_head is packed. A head tied to the embedding must not cost a second vocab x hidden x 4 bytes
  (108 MiB for SmolLM2; memory is the point of this runtime): with the c-blocked backend the
  embedding becomes a `BlockedEmbedding` reading the head's blocked tensor, with oneDNN the head
  runs on the embedding's dense weight (~20% slower than reordered).
When every layer got the c-blocked backend, `model.fused_decoder` runs all-decode CPU steps in one
C call (kernels/cpu_decoder.py). Quantized (QuantLinear: a GGUF's blocks, AWQ layers fused at
load; AWQLinear) and non-fp32 linears keep their form; QuantLinears' bytes move into a huge-page
arena of their own (cpu_int4.place_in_arena). Loading and quantizing work on the HF names,
so this runs after loading, when an Engine takes the model (`Engine.__init__`), and only once.

Invariant: the packed model computes the same function (fp32, summation order aside: tests compare
logits against the unpacked model and transformers).
"""
from __future__ import annotations

from torch import nn

from edge_runtime.kernels import cpu_linear
from edge_runtime.kernels.cpu_decoder import FusedDecoder
from edge_runtime.kernels.cpu_int4 import QuantLinear, place_in_arena
from edge_runtime.kernels.cpu_linear import BlockedEmbedding, PackedLinear, blocked_numel, packable
from edge_runtime.kernels.huge_pages import HugePageArena


def pack_linears(model: nn.Module) -> int:
    """Pack `model` (a CausalLM) in place; returns the number of PackedLinear modules (0: unchanged).
    A model with quantized linears (built packed, model/gguf_int4.py) gets its bytes moved into a
    huge-page arena and its fused decoder rebuilt over them."""
    if not cpu_linear.available():
        return getattr(model, "linears_packed", 0)
    packed_now = not getattr(model, "linears_packed", 0)
    if packed_now:
        model.linears_packed = _pack_float_linears(model)
    moved = place_in_arena([m for m in model.modules() if isinstance(m, QuantLinear)])
    if packed_now or moved:  # the fused decoder holds the weights' addresses
        model.fused_decoder = FusedDecoder.for_model(model)
    return model.linears_packed


def _pack_float_linears(model: nn.Module) -> int:
    kind = cpu_linear.backend()
    groups = linear_groups(model)
    arena = blocked_arena(groups) if kind == "c-blocked" else None
    count = 0
    for owner, (names, new_name), parts in groups:
        if owner is model:
            continue  # the head goes last, see below
        setattr(owner, new_name, PackedLinear(parts, kind=kind, arena=arena))
        for n in names:
            if n != new_name:
                delattr(owner, n)
        count += 1
    _own_storage(model)  # before the head: a tied head must share the embedding's final memory
    if packable(model.lm_head):
        tied = model.lm_head.weight is model.model.embed_tokens.weight
        model.lm_head = PackedLinear([model.lm_head], reorder=not tied or kind == "c-blocked",
                                     kind=kind, arena=arena)
        if tied and kind == "c-blocked":
            model.model.embed_tokens = BlockedEmbedding(model.lm_head)
        count += 1
    return count


def blocked_arena(groups: list) -> HugePageArena:
    """One huge-page-backed allocation that holds the c-blocked weights of all `groups`."""
    return HugePageArena(sum(blocked_numel(sum(m.out_features for m in parts), parts[0].in_features)
                             for _, _, parts in groups))


def linear_groups(model: nn.Module) -> list:
    """(owner, (HF names, packed name), modules) of every linear (group) to pack, the head last."""
    out = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for owner, names, new_name in ((attn, ("q_proj", "k_proj", "v_proj"), "qkv_proj"),
                                       (attn, ("o_proj",), "o_proj"),
                                       (mlp, ("gate_proj", "up_proj"), "gate_up_proj"),
                                       (mlp, ("down_proj",), "down_proj")):
            parts = [getattr(owner, n, None) for n in names]  # fused already (AWQ): gone
            if all(m is not None and packable(m) for m in parts):
                out.append((owner, (names, new_name), parts))
    if packable(model.lm_head):
        out.append((model, (("lm_head",), "lm_head"), [model.lm_head]))
    return out


def _own_storage(model: nn.Module) -> None:
    """Copy every remaining tensor into memory of its own. safetensors' tensors live in one
    private mapping of the file; while one of them (the embedding, a norm weight) lives, the
    mapping stays, with every page that packing read resident (+517 MiB RSS for SmolLM2, measured)."""
    for t in list(model.parameters()) + list(model.buffers()):
        t.data = t.data.clone()
