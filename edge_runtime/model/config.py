"""`ModelConfig`: the architecture facts our forward needs, read once from a HF config.json.

Invariants (checked in `__post_init__`):
- `architecture` is one of SUPPORTED_ARCHITECTURES; Llama, Qwen2, Mistral, Qwen3 and Gemma 3 (text)
  share one forward (edge_runtime/model/llama.py) and differ only in the fields recorded here.
  Families we know but do not carry are refused naming what is missing (REFUSED_ARCHITECTURES).
- `num_heads % num_kv_heads == 0` (grouped-query attention), `head_dim` is even (rotary).
- `rope_scaling` is None (plain RoPE) or a `RopeScaling` of type "llama3" or "linear"; anything
  else (dynamic NTK, YaRN, longrope...) is refused with a `ModelLoadError`.
- `max_position_embeddings` is the longest sequence the engine accepts. Gemma 3's local layers
  are listed in `layer_windows` and masked by the engine's step contexts (kv/layer_windows.py),
  so it runs to the model's own limit. A model-wide window (Mistral v0.1, Qwen2/Qwen3/SmolLM3 with
  use_sliding_window) has no `layer_windows` and is capped at the window, because within the
  window full causal attention equals sliding-window attention. `model_context` is the model's
  own limit: the reference path (ContiguousKVCache, which masks each local layer to
  `layer_windows`) runs to it.
- `layer_windows` is None (every layer global) or one entry per layer: the window of a local layer
  (a query at position i reads keys j with i - window < j <= i, as transformers), None for a global
  one. Local layers use `local_rope_theta` (no scaling), global ones `rope_theta` + `rope_scaling`.

Both config dialects are read: transformers < 5 (`rope_theta` + `rope_scaling`) and transformers 5
(`rope_parameters`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_runtime.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM",
                           "Qwen3ForCausalLM", "Gemma3ForCausalLM", "SmolLM3ForCausalLM")
_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
}
# families people run that the forward does not carry, and what each would need
REFUSED_ARCHITECTURES = {
    "Phi3ForCausalLM": "Phi-3/Phi-4-mini fuse q/k/v into one qkv_proj and gate/up into one "
                       "gate_up_proj in the checkpoint and rotate only part of each head "
                       "(partial_rotary_factor); neither is implemented",
    "Gemma3ForConditionalGeneration": "this is Gemma 3's vision-language checkpoint; only the "
                                      "text model (Gemma3ForCausalLM, model_type gemma3_text) "
                                      "is served",
    "Gemma2ForCausalLM": "Gemma 2 needs attention logit softcapping, which the attention "
                         "kernels do not implement",
    "Qwen3MoeForCausalLM": "mixture-of-experts MLPs are not implemented",
}
_MODEL_TYPE_REFUSED = {"phi3": "Phi3ForCausalLM",
                       "gemma3": "Gemma3ForConditionalGeneration", "gemma2": "Gemma2ForCausalLM",
                       "qwen3_moe": "Qwen3MoeForCausalLM"}
# GGUF `general.architecture` names of the refused families
GGUF_REFUSED = {"phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                "qwen3moe": "Qwen3MoeForCausalLM"}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str  # "llama3" | "linear"
    factor: float
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    o_proj_bias: bool = False  # Llama's attention_bias also puts a bias on o_proj
    mlp_bias: bool = False
    sliding_window: int | None = None  # model-wide: max_position_embeddings is capped to it
    qk_norm: bool = False  # RMSNorm over each head's q and k before rotary (Qwen3, Gemma 3)
    hidden_act: str = "silu"  # MLP gate: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU, Gemma)
    norm_unit_offset: bool = False  # RMSNorm scales by (1 + weight) (Gemma)
    sandwich_norms: bool = False  # Gemma 3: norms after attention and MLP, one before the MLP
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(hidden))
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    layer_windows: tuple[int | None, ...] | None = None  # per layer: local window, None global
    local_rope_theta: float | None = None  # rotary base of the local layers
    model_context: int = 0  # the model's own longest sequence (0: max_position_embeddings)
    rope_layers: tuple[bool, ...] | None = None  # per layer: rotary applied (SmolLM3's NoPE layers)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r}; supported: "
                + ", ".join(SUPPORTED_ARCHITECTURES)
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            if int(getattr(self, name)) <= 0:
                raise ModelLoadError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"config.json: head_dim must be even for rotary, got {self.head_dim}")
        if self.hidden_act not in ACTIVATIONS:
            raise ModelLoadError(f"config.json: hidden activation {self.hidden_act!r} is not "
                                 "supported; supported: " + ", ".join(ACTIVATIONS))
        assert self.layer_windows is None or len(self.layer_windows) == self.num_layers, (
            self.layer_windows, self.num_layers)
        if not self.model_context:
            object.__setattr__(self, "model_context", self.max_position_embeddings)

    @property
    def attention_scale(self) -> float:
        """The softmax scale of q k^T: head_dim ** -0.5, or Gemma's query_pre_attn_scalar ** -0.5."""
        scalar = self.query_pre_attn_scalar or self.head_dim
        return scalar ** -0.5

    @property
    def has_local_layers(self) -> bool:
        return self.layer_windows is not None and any(w is not None for w in self.layer_windows)

    @property
    def kv_bytes_per_token_fp32(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * 4

    @classmethod
    def from_hf(cls, cfg: dict, generation_config: dict | None = None) -> "ModelConfig":
        """Build from a parsed config.json (and optionally generation_config.json for EOS ids)."""
        for name, value in (("config.json", cfg), ("generation_config.json", generation_config)):
            if value is not None and not isinstance(value, dict):
                raise ModelLoadError(f"{name} must be a JSON object of fields, got a "
                                     f"{type(value).__name__}; re-export the model folder")
        try:
            return cls._from_hf(cfg, generation_config)
        except KeyError as exc:
            raise ModelLoadError(f"config.json has no {exc.args[0]!r} field") from exc
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"config.json has a malformed field: {exc}") from exc

    @classmethod
    def _from_hf(cls, cfg: dict, generation_config: dict | None) -> "ModelConfig":
        arch = _architecture(cfg)
        hidden = _positive_int(cfg, "hidden_size")
        heads = _positive_int(cfg, "num_attention_heads")
        head_dim = _positive_int(cfg, "head_dim") if cfg.get("head_dim") else hidden // heads
        act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
        act = "silu" if act == "swish" else act
        if act not in ACTIVATIONS:
            raise ModelLoadError(f"config.json: hidden activation {act!r} is not supported; "
                                 "supported: " + ", ".join(ACTIVATIONS))
        gemma = arch == "Gemma3ForCausalLM"
        if gemma:
            rope_theta, rope_scaling, local_theta = _gemma_rope(cfg)
        else:
            (rope_theta, rope_scaling), local_theta = _rope(cfg), None
        qkv_bias = arch == "Qwen2ForCausalLM" or _flag(cfg, "attention_bias")
        o_bias = arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM",
                          "SmolLM3ForCausalLM") and _flag(cfg, "attention_bias")
        window = _sliding_window(cfg, arch)
        layer_windows = _gemma_layer_windows(cfg, window) if gemma else None
        if gemma and not any(w is not None for w in layer_windows):
            window = None  # every layer global: nothing to cap
        model_context = int(cfg.get("max_position_embeddings", 2048))
        # Gemma's local layers are masked per layer (layer_windows); a model-wide window caps
        max_pos = model_context if window is None or gemma else min(model_context, window)
        if gemma and cfg.get("attn_logit_softcapping") is not None:
            raise ModelLoadError("config.json: attn_logit_softcapping is set; attention logit "
                                 "softcapping is not implemented by the attention kernels")
        if _flag(cfg, "use_bidirectional_attention"):
            raise ModelLoadError("config.json: use_bidirectional_attention is true; only causal "
                                 "(decoder) attention is served")
        softcap = cfg.get("final_logit_softcapping")
        return cls(
            architecture=arch,
            vocab_size=_positive_int(cfg, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive_int(cfg, "intermediate_size"),
            num_layers=_positive_int(cfg, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=_positive_int(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") else heads,
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            rms_norm_eps=_finite(cfg.get("rms_norm_eps", 1e-6), "rms_norm_eps", minimum=0.0),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=_flag(cfg, "tie_word_embeddings"),
            attention_bias=qkv_bias,
            eos_token_ids=_eos_ids(cfg, generation_config),
            bos_token_id=cfg.get("bos_token_id"),
            o_proj_bias=o_bias,
            mlp_bias=_flag(cfg, "mlp_bias"),
            sliding_window=window,
            qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"),
            hidden_act=act,
            norm_unit_offset=gemma,
            sandwich_norms=gemma,
            embed_scale=hidden ** 0.5 if gemma else None,
            query_pre_attn_scalar=(_finite(cfg.get("query_pre_attn_scalar", head_dim),
                                           "query_pre_attn_scalar", positive=True)
                                   if gemma else None),
            final_logit_softcapping=(None if softcap is None else
                                     _finite(softcap, "final_logit_softcapping", positive=True)),
            layer_windows=layer_windows,
            local_rope_theta=local_theta,
            model_context=model_context if gemma else max_pos,
            rope_layers=_rope_layers(cfg) if arch == "SmolLM3ForCausalLM" else None,
        )


def _positive_int(cfg: dict, key: str) -> int:
    """A shape field: a positive whole number (0 heads divided by zero, True read as 1)."""
    value = cfg[key]
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value <= 0:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return int(value)


def _flag(cfg: dict, key: str) -> bool:
    """A JSON boolean: the string "false" is truthy in Python, and transformers refuses it too."""
    value = cfg.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false (a JSON boolean), got {value!r}")
    return value


def _finite(value, key: str, minimum: float | None = None, positive: bool = False) -> float:
    """A number field; out-of-range values (theta 0, factor 0, eps < 0) load but give NaN logits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    number = float(value)
    too_small = (positive and number <= 0) or (minimum is not None and number < minimum)
    if not math.isfinite(number) or too_small:
        need = "a positive number" if positive else f"a finite number >= {minimum:g}"
        raise ValueError(f"{key} must be {need}, got {value!r}")
    return number


def _architecture(cfg: dict) -> str:
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"architectures must be a list of class names, got {archs!r}")
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    if not archs and cfg.get("model_type") in _MODEL_TYPE_TO_ARCH:
        return _MODEL_TYPE_TO_ARCH[cfg["model_type"]]
    refused = [a for a in archs if a in REFUSED_ARCHITECTURES] or (
        [_MODEL_TYPE_REFUSED[cfg["model_type"]]] if not archs and cfg.get("model_type")
        in _MODEL_TYPE_REFUSED else [])
    if refused:
        raise ModelLoadError(f"unsupported architecture {refused[0]}: "
                             f"{REFUSED_ARCHITECTURES[refused[0]]}; supported: "
                             + ", ".join(SUPPORTED_ARCHITECTURES))
    found = ", ".join(archs) or repr(cfg.get("model_type"))
    raise ModelLoadError(
        f"unsupported architecture {found}; supported: " + ", ".join(SUPPORTED_ARCHITECTURES)
    )


def _rope(cfg: dict) -> tuple[float, RopeScaling | None]:
    for key in ("rope_parameters", "rope_scaling"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise ValueError(f"{key} must be an object such as {{\"rope_type\": \"linear\", "
                             f"\"factor\": 2.0}}, got {cfg[key]!r}")
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    params = {**legacy, **params}
    section = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    if "rope_theta" in params:
        theta = _finite(params["rope_theta"], f"{section}.rope_theta", positive=True)
    else:
        theta = _finite(cfg.get("rope_theta", 10000.0), "rope_theta", positive=True)
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"config.json: rope scaling {rope_type!r} is not supported; supported: "
            + ", ".join(SUPPORTED_ROPE_TYPES)
        )
    if rope_type == "default":
        return theta, None
    if "factor" not in params:
        raise KeyError(f"{section}.factor")
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=_finite(params["factor"], f"{section}.factor", positive=True),
        low_freq_factor=_finite(params.get("low_freq_factor", 1.0), f"{section}.low_freq_factor",
                                positive=True),
        high_freq_factor=_finite(params.get("high_freq_factor", 4.0), f"{section}.high_freq_factor",
                                 positive=True),
        original_max_position_embeddings=_positive_int(
            {"original_max_position_embeddings": 8192, **params}, "original_max_position_embeddings"),
    )
    if rope_type == "llama3" and scaling.high_freq_factor <= scaling.low_freq_factor:
        raise ValueError(f"{section}.high_freq_factor ({scaling.high_freq_factor:g}) must be larger "
                         f"than low_freq_factor ({scaling.low_freq_factor:g}); llama3 rope divides by "
                         "their difference")
    return theta, scaling


def _sliding_window(cfg: dict, arch: str) -> int | None:
    window = cfg.get("sliding_window")
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "SmolLM3ForCausalLM") and not _flag(
            cfg, "use_sliding_window"):
        return None
    if window is None or (window == 0 and not isinstance(window, bool)):
        return None  # null or 0: no window
    return _positive_int(cfg, "sliding_window")


def _rope_layers(cfg: dict) -> tuple[bool, ...]:
    """SmolLM3: per layer whether rotary applies (no_rope_layers: 1 rope, 0 none), else every
    no_rope_layer_interval-th layer without (transformers' default)."""
    layers = _positive_int(cfg, "num_hidden_layers")
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = _positive_int({"no_rope_layer_interval": 4, **cfg}, "no_rope_layer_interval")
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) != layers or any(f not in (0, 1) for f in flags):
        raise ValueError(f"no_rope_layers must list 0 or 1 per layer ({layers}), got {flags!r}")
    return tuple(bool(f) for f in flags)


def _gemma_rope(cfg: dict) -> tuple[float, RopeScaling | None, float]:
    """(global theta, global scaling, local theta) from either dialect: transformers 5's
    rope_parameters per layer type, or rope_theta + rope_scaling + rope_local_base_freq."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        theta, scaling = _rope({"rope_parameters": params["full_attention"]})
        local = params.get("sliding_attention") or {"rope_theta": 10000.0}
        local_theta, local_scaling = _rope({"rope_parameters": local})
        if local_scaling is not None:
            raise ModelLoadError("config.json: rope scaling on the sliding-window layers "
                                 "(rope_parameters.sliding_attention) is not supported")
        return theta, scaling, local_theta
    theta, scaling = _rope(cfg)
    local = _finite(cfg.get("rope_local_base_freq", 10000.0), "rope_local_base_freq", positive=True)
    return theta, scaling, local


_LAYER_TYPES = ("sliding_attention", "full_attention")


def _gemma_layer_windows(cfg: dict, window: int | None) -> tuple[int | None, ...]:
    """Per layer the local window or None (global): from layer_types, else Gemma 3's pattern
    (every sliding_window_pattern-th layer global, the others local)."""
    layers = _positive_int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None:
        pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in _LAYER_TYPES
                                                                  for t in types):
        raise ValueError(f"layer_types must list one of {', '.join(_LAYER_TYPES)} per layer "
                         f"({layers}), got {types!r}")
    if window is None and "sliding_attention" in types:
        raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
    return tuple(window if t == "sliding_attention" else None for t in types)


def _eos_ids(cfg: dict, generation_config: dict | None) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (cfg, generation_config or {}):
        eos = source.get("eos_token_id")
        for i in eos if isinstance(eos, (list, tuple)) else [eos]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)
