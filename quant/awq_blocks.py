"""Plain-torch forwards of one Llama decoder layer, for the AWQ searches.

The quantizer needs to run pieces of a layer (the attention block from its normed input, the MLP,
the whole layer) on cached calibration activations, and to see the input of every linear. Rather
than depend on the forward signature of whichever model class holds the weights (ours or
transformers'), it runs the math itself from the layer's submodules, which follow Hugging Face
names: `input_layernorm`, `self_attn.{q,k,v,o}_proj`, `post_attention_layernorm`,
`mlp.{gate,up,down}_proj`. The linears are called as modules, so a search can swap their weights.

Invariant: `decoder_layer` computes what a Hugging Face LlamaDecoderLayer computes (checked in
tests/test_awq_algo.py); only default RoPE (no rope_scaling) is supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class LayerArch:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float

    @classmethod
    def from_config(cls, cfg) -> "LayerArch":
        """From our ModelConfig or a transformers LlamaConfig."""
        num_heads = getattr(cfg, "num_heads", None) or cfg.num_attention_heads
        num_kv = getattr(cfg, "num_kv_heads", None) or getattr(cfg, "num_key_value_heads", None)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
        rope_type = _rope_scaling_type(getattr(cfg, "rope_scaling", None))
        if rope_type not in (None, "default"):
            raise NotImplementedError(f"the AWQ quantizer supports default RoPE only; this model has "
                                      f"{rope_type!r} rope scaling (config.json): give a model without it")
        theta = getattr(cfg, "rope_theta", None)
        if theta is None:  # transformers 5 keeps it in rope_parameters
            theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        return cls(cfg.hidden_size, num_heads, num_kv or num_heads, head_dim, float(theta),
                   float(cfg.rms_norm_eps))


def _rope_scaling_type(rope_scaling) -> str | None:
    """The RoPE type of our ModelConfig's RopeScaling or of a transformers rope_scaling dict."""
    if not rope_scaling:
        return None
    if isinstance(rope_scaling, dict):
        return rope_scaling.get("rope_type", rope_scaling.get("type"))
    return rope_scaling.rope_type


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight.float() * x32


def rope_tables(arch: LayerArch, seq_len: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [seq_len, head_dim] for positions 0..seq_len-1 (HF rotate-half convention)."""
    d = arch.head_dim
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [S, heads, L, D]; cos/sin: [L, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention_core(layer: nn.Module, x: torch.Tensor, arch: LayerArch, rope) -> torch.Tensor:
    """Normed input x [S, L, H] -> attention output before o_proj [S, L, num_heads * head_dim]."""
    attn = layer.self_attn
    s, l, _ = x.shape
    cos, sin = rope
    q = attn.q_proj(x).view(s, l, arch.num_heads, arch.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(s, l, arch.num_kv_heads, arch.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(s, l, arch.num_kv_heads, arch.head_dim).transpose(1, 2)
    q, k = _rotate(q, cos[:l], sin[:l]), _rotate(k, cos[:l], sin[:l])
    rep = arch.num_heads // arch.num_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [S, heads, L, D]
    return out.transpose(1, 2).reshape(s, l, arch.num_heads * arch.head_dim)


def attention_block(layer: nn.Module, x: torch.Tensor, arch: LayerArch, rope) -> torch.Tensor:
    """Normed input -> self-attention output (after o_proj): [S, L, H]."""
    return layer.self_attn.o_proj(attention_core(layer, x, arch, rope))


def mlp_block(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    mlp = layer.mlp
    return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))


def decoder_layer(layer: nn.Module, hidden: torch.Tensor, arch: LayerArch, rope,
                  collect: dict | None = None) -> torch.Tensor:
    """hidden [S, L, H] -> next hidden; fills `collect` with each linear's input (by HF name)."""
    x = rms_norm(hidden, layer.input_layernorm.weight, arch.rms_norm_eps)
    core = attention_core(layer, x, arch, rope)
    hidden = hidden + layer.self_attn.o_proj(core)
    y = rms_norm(hidden, layer.post_attention_layernorm.weight, arch.rms_norm_eps)
    mlp = layer.mlp
    act = F.silu(mlp.gate_proj(y)) * mlp.up_proj(y)
    hidden = hidden + mlp.down_proj(act)
    if collect is not None:
        collect.update({"self_attn.q_proj": x, "self_attn.o_proj": core,
                        "mlp.gate_proj": y, "mlp.down_proj": act})
    return hidden
