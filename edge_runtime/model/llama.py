"""The decoder forward for Llama, Qwen2, Mistral, Qwen3, Gemma 3 and SmolLM3 in plain torch (one
code path, config fields: model/config.py).

What the families add to Llama's layer: Qwen3 and Gemma 3 an RMSNorm over each head's q and k
before rotary (`q_norm`, `k_norm`); Gemma 3 norms scaled by (1 + weight), a norm after attention
and around the MLP (`post_attention_layernorm` on the attention output, `pre_feedforward_layernorm`
/ `post_feedforward_layernorm`), GeGLU with tanh GELU, embeddings times sqrt(hidden), a softmax
scale from query_pre_attn_scalar (the KV context's `sm_scale`), local layers with their own rotary
base (`rotary_local`) whose attention the KV context masks to the window; SmolLM3 no rotary on
its NoPE layers (`config.rope_layers`).

Contract (docs/interfaces.md): `CausalLM.forward(input_ids[T], positions[T], kv, logits_indices[B])`
runs on a flattened varlen batch: the new tokens of every sequence concatenated. Nothing here knows
sequence boundaries; `kv.attend(layer, q, k, v)` stores K/V and does the per-sequence causal
attention. So prefill chunks and decode tokens of many sequences go through every matmul together,
and there is no Python loop over tokens.

Invariants:
- Module names follow Hugging Face (`model.embed_tokens`, `model.layers.{i}.self_attn.q_proj`, ...,
  `model.norm`, `lm_head`), so HF checkpoints load by name and quant/ swaps nn.Linear by path.
- Numerics follow transformers: RMSNorm in fp32 then cast back; rotary cos/sin computed in fp32 from
  `positions * inv_freq` (a table lookup of the same values), cast to the activation dtype.
- Returned logits are always float32.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from edge_runtime.model.config import ModelConfig
from edge_runtime.model.kv_interface import KVContext

# Contexts up to this many positions get their whole cos/sin table at load (8192 x head_dim x 8 bytes,
# 4 MiB for head_dim 64), so a forward never reads positions back from the device; longer contexts
# start with this many and double on demand (the engine passes the step's bound from the host; other
# callers pay one device sync per forward to check).
FULL_ROPE_TABLE = 8192


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.unit_offset = unit_offset  # Gemma: the stored weight w scales by (1 + w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.unit_offset:  # transformers' Gemma3RMSNorm: (x32 * rsqrt * (1 + w32)).to(dtype)
            scale = 1.0 + self.weight.float()
            if dtype == torch.float32:
                return nn.functional.rms_norm(x, self.weight.shape, scale, self.eps)
            x32 = x.float()
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return (normed * scale).to(dtype)
        if dtype == torch.float32 and self.weight.dtype == torch.float32:
            # one fused op (the same math in fp32): 61 norms per decode step, each 6 ops otherwise
            return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] (float32), with llama3 / linear scaling applied;
    local: the sliding-window layers' (their own base, no scaling)."""
    dim = config.head_dim
    # explicit CPU device: also when the model is being built under `torch.device("meta")`
    exps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    theta = config.local_rope_theta if local else config.rope_theta
    inv_freq = 1.0 / (theta ** exps)
    scaling = None if local else config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    assert scaling.rope_type == "llama3", scaling
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos/sin tables [num_positions, head_dim] (float32), grown by doubling when needed."""

    def __init__(self, config: ModelConfig, local: bool = False) -> None:
        super().__init__()
        self.max_positions = config.model_context
        self.register_buffer("inv_freq", rope_inv_freq(config, local), persistent=False)
        self.register_buffer("cos", torch.empty(0, device="cpu"), persistent=False)
        self.register_buffer("sin", torch.empty(0, device="cpu"), persistent=False)

    def build(self, num_positions: int) -> None:
        num_positions = min(max(num_positions, 1), self.max_positions)
        pos = torch.arange(num_positions, device=self.inv_freq.device).float()
        freqs = pos[:, None] * self.inv_freq[None, :]  # [P, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
        self.cos, self.sin = emb.cos(), emb.sin()

    def forward(self, positions: torch.Tensor, dtype: torch.dtype, num_positions: int | None = None):
        """num_positions: the caller's host-side bound (max position + 1); without it a table
        shorter than the context reads positions.max() back from the device."""
        if self.cos.shape[0] < self.max_positions:
            need = int(positions.max()) + 1 if num_positions is None else num_positions
            if need > self.cos.shape[0]:
                assert need <= self.max_positions, (need, self.max_positions)
                self.build(max(need, 2 * self.cos.shape[0], min(FULL_ROPE_TABLE, self.max_positions)))
        # index_select: a lighter kernel than advanced indexing for the same rows
        cos = torch.index_select(self.cos, 0, positions)
        sin = torch.index_select(self.sin, 0, positions)
        if cos.dtype != dtype:  # float32 activations keep the table's rows (no no-op .to trips)
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos[:, None, :], sin[:, None, :]  # [T, 1, D] to broadcast over heads


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos, sin: [T, 1, D] -> x rotated (transformers' rotate_half form)."""
    return x * cos + _rotate_half(x) * sin


def _no_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        h, d = config.hidden_size, config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=config.o_proj_bias)
        if config.qk_norm:  # Qwen3, Gemma 3: per-head RMSNorm of q and k before rotary
            self.q_norm = RMSNorm(d, config.rms_norm_eps, config.norm_unit_offset)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, config.norm_unit_offset)
        else:
            self.q_norm = self.k_norm = None
        windows = config.layer_windows
        self.window = None if windows is None else windows[layer]  # local layer: its window
        # SmolLM3's NoPE layers: q and k go to attention without rotary
        rotates = config.rope_layers is None or config.rope_layers[layer]
        self.rope = apply_rope if rotates else _no_rope
        # set by model/linear_packing.py: q, k, v rows in one packed weight (q/k/v_proj removed)
        self.qkv_proj: nn.Module | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVContext):
        t, h, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if self.q_norm is not None:
            return self._forward_qk_norm(x, cos, sin, kv)
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) * D]
            qk = self.rope(qkv[:, : (h + hkv) * d].view(t, h + hkv, d), cos, sin)  # one pass for q and k
            q, k = qk[:, :h], qk[:, h:]
            v = qkv[:, (h + hkv) * d:].view(t, hkv, d)
        else:
            q = self.rope(self.q_proj(x).view(t, h, d), cos, sin)  # [T, H, D]
            k = self.rope(self.k_proj(x).view(t, hkv, d), cos, sin)  # [T, Hkv, D]
            v = self.v_proj(x).view(t, hkv, d)  # [T, Hkv, D]
        out = kv.attend(self.layer, q, k, v)  # [T, H, D]
        return self.o_proj(out.reshape(t, h * d))

    def _forward_qk_norm(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         kv: KVContext) -> torch.Tensor:
        t, h, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) * D]
            q, k = qkv[:, : h * d], qkv[:, h * d: (h + hkv) * d]
            v = qkv[:, (h + hkv) * d:]
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = apply_rope(self.q_norm(q.reshape(t, h, d)), cos, sin)  # [T, H, D]
        k = apply_rope(self.k_norm(k.reshape(t, hkv, d)), cos, sin)  # [T, Hkv, D]
        out = kv.attend(self.layer, q, k, v.reshape(t, hkv, d))  # [T, H, D]
        return self.o_proj(out.reshape(t, h * d))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.gelu = config.hidden_act == "gelu_pytorch_tanh"  # GeGLU (Gemma), else SwiGLU
        # set by model/linear_packing.py: gate and up rows in one packed weight (gate/up_proj removed)
        self.gate_up_proj: nn.Module | None = None

    def _act(self, gate: torch.Tensor) -> torch.Tensor:
        if self.gelu:
            return nn.functional.gelu(gate, approximate="tanh")
        return nn.functional.silu(gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self._act(gate) * up)
        return self.down_proj(self._act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Llama's pre-norm layer; with `sandwich_norms` (Gemma 3) `post_attention_layernorm` normalizes
    the attention output and the MLP sits between `pre_feedforward_layernorm` and
    `post_feedforward_layernorm`."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        size, eps, offset = config.hidden_size, config.rms_norm_eps, config.norm_unit_offset
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(size, eps, offset)
        self.post_attention_layernorm = RMSNorm(size, eps, offset)
        self.sandwich = config.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(size, eps, offset)
            self.post_feedforward_layernorm = RMSNorm(size, eps, offset)

    def forward(self, x, cos, sin, kv):
        if self.sandwich:
            attn = self.self_attn(self.input_layernorm(x), cos, sin, kv)
            x = x + self.post_attention_layernorm(attn)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_unit_offset)
        self.rotary_emb = Rotary(config)
        # the local layers' rotary (Gemma 3: base 10k vs the global layers' 1M); None without them
        self.rotary_local = Rotary(config, local=True) if config.has_local_layers else None

    def build_rotary(self, config: ModelConfig, device, num_positions: int) -> None:
        """Fresh rope tables on `device` (a model built on the meta device has none)."""
        self.rotary_emb = Rotary(config).to(device)
        self.rotary_emb.build(num_positions)
        if self.rotary_local is not None:
            self.rotary_local = Rotary(config, local=True).to(device)
            self.rotary_local.build(num_positions)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.fused_decoder = None  # set by model/linear_packing.py (kernels/cpu_decoder.py)
        self.prepared_for = None  # the back end the weights were prepared for (engine/backend.py)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (the final norm's; embeddings may be stored differently, e.g. AWQ)."""
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv: KVContext,
        logits_indices: torch.Tensor | None = None,
        fused_args=None,
        num_positions: int | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: long [T]; logits_indices: long [B] or None -> float32 [B|T, vocab].
        fused_args: the CPU back end's arguments for `fused_decoder` (kv.native_decode_args), to
        run the layer stack in one C call; None runs the layers one by one. num_positions: max
        position + 1 known on the host (the engine's), so nothing is read back from the device."""
        assert input_ids.dim() == 1 and input_ids.shape == positions.shape, (
            input_ids.shape, positions.shape)
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        if self.config.embed_scale is not None:  # Gemma: times sqrt(hidden) in the weights' dtype
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype, device=x.device)
        cos, sin = self.model.rotary_emb(positions, x.dtype, num_positions)
        if fused_args is not None:  # the C layer stack for the CPU back end (cpu_decoder.py)
            x = self.fused_decoder(x, cos, sin, fused_args, kv.sm_scale)
        else:
            local = self.model.rotary_local
            cos_sin_local = None if local is None else local(positions, x.dtype, num_positions)
            for layer in self.model.layers:
                if layer.self_attn.window is not None:
                    x = layer(x, *cos_sin_local, kv)
                else:
                    x = layer(x, cos, sin, kv)
        if logits_indices is not None:
            x = x[logits_indices]  # [B, hidden]
        logits = self.lm_head(self.model.norm(x))  # [B, vocab]
        # already float32 on the CPU back end, where .float() is still a dispatcher trip
        logits = logits if logits.dtype == torch.float32 else logits.float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
