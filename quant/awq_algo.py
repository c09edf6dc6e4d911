"""AWQ on a Llama-family model, one decoder layer at a time (memory stays bounded by one layer's
activations on the calibration batch).

Per layer, as AutoAWQ 0.2.9 does:
1. run the float layer on the cached hidden states, keeping each linear's input;
2. search scales for four groups, all on the original weights: q/k/v (loss: attention block
   output, after o_proj), v->o (only when v_proj and o_proj have the same shape, i.e. no GQA),
   gate/up (loss: MLP output), up->down (loss: down_proj output); then fold them all;
3. search and apply the clipping range per linear except q/k (inputs divided by the folded scales);
4. round-to-nearest asymmetric int4 with group size G, packed into AutoAWQ GEMM tensors;
5. the next layer's input is this layer's output with the quantized weights (`quantized_inputs`,
   default). AutoAWQ uses the float output instead; on SmolLM2-135M g64 ours gives 20.45 ppl vs
   20.65 with the float output (docs/awq.md), as later layers are calibrated on what they will see.

The activation statistics (mean |x|) use every calibration token; the losses are measured on a
subset: token-wise blocks (MLP, single linears) on `loss_tokens` strided tokens, the attention block
on the first `loss_seqs` whole sequences. That cuts the search cost ~4x (SmolLM2-135M: ~0.4 TFLOP
per layer instead of ~1) so that quantizing stays within minutes on 2 CPU cores. The float weights of the model are modified in place (scaled, clipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from edge_runtime.quant import awq_blocks, awq_pack, awq_search

LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class AWQSettings:
    group_size: int = 64
    n_grid: int = 20
    duo_scaling: bool = True
    clip: bool = True
    clip_grid: int = 20
    clip_max_shrink: float = 0.5
    clip_tokens: int | None = None  # None: all calibration tokens (AutoAWQ samples 512)
    loss_tokens: int = 2048
    loss_seqs: int = 4
    scale: bool = True  # False: round-to-nearest only (the baseline)
    quantized_inputs: bool = True  # next layer sees this layer's quantized output

    def __post_init__(self):
        assert self.group_size in (32, 64, 128), self.group_size
        assert self.n_grid >= 1 and self.clip_grid >= 1, (self.n_grid, self.clip_grid)


def _subsample(x: torch.Tensor, max_tokens: int) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    return flat[:: max(1, flat.shape[0] // max_tokens)]


def _scale_groups(layer: nn.Module, feats: dict, arch, rope, st: AWQSettings) -> list[tuple]:
    """(prev_op, linears, input, block, loss_input) per scale group, AutoAWQ's Llama list."""
    attn, mlp = layer.self_attn, layer.mlp
    x = feats["self_attn.q_proj"]
    groups = [(layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj], x,
               lambda y: awq_blocks.attention_block(layer, y, arch, rope), x[: st.loss_seqs])]
    if attn.v_proj.weight.shape == attn.o_proj.weight.shape:
        x = feats["self_attn.o_proj"]
        groups.append((attn.v_proj, [attn.o_proj], x, attn.o_proj, _subsample(x, st.loss_tokens)))
    x = feats["mlp.gate_proj"]
    groups.append((layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj], x,
                   lambda y: awq_blocks.mlp_block(layer, y), _subsample(x, st.loss_tokens)))
    x = feats["mlp.down_proj"]
    groups.append((mlp.up_proj, [mlp.down_proj], x, mlp.down_proj, _subsample(x, st.loss_tokens)))
    return groups


def _input_name(layer: nn.Module, linear: nn.Module) -> str:
    for name in LINEAR_NAMES:
        if layer.get_submodule(name) is linear:
            return {"self_attn.k_proj": "self_attn.q_proj", "self_attn.v_proj": "self_attn.q_proj",
                    "mlp.up_proj": "mlp.gate_proj"}.get(name, name)
    raise AssertionError(f"linear {linear} is not one of the layer's")


def quantize_layer(layer: nn.Module, feats: dict, arch, rope, st: AWQSettings) -> dict:
    """Scale, clip and quantize one decoder layer -> {linear name: (qweight, qzeros, scales, bias)}."""
    if st.scale:
        groups = _scale_groups(layer, feats, arch, rope, st)
        found = [awq_search.search_scale(block, x, linears, st.group_size, st.n_grid,
                                         st.duo_scaling, x_loss)
                 for _prev, linears, x, block, x_loss in groups]
        for (prev, linears, _x, _b, _l), scales in zip(groups, found):
            awq_search.fold_scale(prev, linears, scales)
            feats[_input_name(layer, linears[0])] = feats[_input_name(layer, linears[0])] / scales
    out = {}
    for name in LINEAR_NAMES:
        linear = layer.get_submodule(name)
        if st.clip and name not in ("self_attn.q_proj", "self_attn.k_proj"):
            max_val = awq_search.search_clip(linear.weight.data, feats[_input_name(layer, linear)],
                                             st.group_size, st.clip_grid, st.clip_max_shrink,
                                             st.clip_tokens)
            awq_search.apply_clip(linear, max_val, st.group_size)
        qweight, qzeros, scales = awq_pack.pack_linear_weight(linear.weight.data, st.group_size)
        bias = None if linear.bias is None else linear.bias.data.clone()
        out[name] = (qweight, qzeros, scales, bias)
    return out


def check_group_size(model_layers, group_size: int) -> None:
    """Raise ValueError with a sentence when a linear's in_features is not a multiple of G."""
    for name in LINEAR_NAMES:
        linear = model_layers[0].get_submodule(name)
        if linear.in_features % group_size:
            raise ValueError(
                f"group size {group_size} does not divide {name}.in_features = "
                f"{linear.in_features}; choose a group size that divides it (e.g. 64)")
        if linear.out_features % 8:
            raise ValueError(f"{name}.out_features = {linear.out_features} is not a multiple of 8, "
                             "which the AWQ GEMM format requires")


@torch.no_grad()
def awq_quantize(model: nn.Module, arch: awq_blocks.LayerArch, calib_ids: torch.Tensor,
                 st: AWQSettings, on_layer: Callable[[int, int], None] | None = None) -> dict:
    """Quantize every decoder layer of `model` (HF module tree) on calib_ids [S, L].

    Returns {"model.layers.{i}.{linear}": (qweight, qzeros, scales, bias)}; the model's float
    weights are left scaled and clipped (norm weights carry the folded scales and must be saved).
    """
    layers = model.model.layers
    check_group_size(layers, st.group_size)
    hidden = model.model.embed_tokens(calib_ids).float()  # [S, L, H]
    rope = awq_blocks.rope_tables(arch, calib_ids.shape[1], hidden.device)
    result = {}
    for i, layer in enumerate(layers):
        feats: dict = {}
        next_hidden = awq_blocks.decoder_layer(layer, hidden, arch, rope, collect=feats)
        for name, tensors in quantize_layer(layer, feats, arch, rope, st).items():
            result[f"model.layers.{i}.{name}"] = tensors
            if st.quantized_inputs:
                qweight, qzeros, scales, _bias = tensors
                w = awq_pack.dequantize(qweight, qzeros, scales, st.group_size).t().contiguous()
                layer.get_submodule(name).weight.data = w.to(layer.get_submodule(name).weight.dtype)
        if st.quantized_inputs:
            next_hidden = awq_blocks.decoder_layer(layer, hidden, arch, rope)
        hidden = next_hidden
        if on_layer is not None:
            on_layer(i + 1, len(layers))
    return result
