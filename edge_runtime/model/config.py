"""`ModelConfig`: the architecture facts our forward needs, read once from a HF config.json.

Invariants (checked in `__post_init__`):
- `architecture` is one of SUPPORTED_ARCHITECTURES; Llama, Qwen2 and Mistral share one forward
  (edge_runtime/model/llama.py) and differ only in the flags recorded here.
- `num_heads % num_kv_heads == 0` (grouped-query attention), `head_dim` is even (rotary).
- `rope_scaling` is None (plain RoPE) or a `RopeScaling` of type "llama3" or "linear"; anything
  else (dynamic NTK, YaRN, longrope...) is refused with a `ModelLoadError`.
- `max_position_embeddings` is the longest sequence we accept. For models with a sliding window
  (Mistral v0.1, Qwen2 with use_sliding_window) it is capped at the window, because within the window
  full causal attention equals sliding-window attention and we implement only the former.

Both config dialects are read: transformers < 5 (`rope_theta` + `rope_scaling`) and transformers 5
(`rope_parameters`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_runtime.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
_MODEL_TYPE_TO_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
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
    sliding_window: int | None = None  # informational: max_position_embeddings is capped to it

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
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(f"config.json: hidden_act {act!r} is not supported (only silu)")
        rope_theta, rope_scaling = _rope(cfg)
        qkv_bias = arch == "Qwen2ForCausalLM" or _flag(cfg, "attention_bias")
        o_bias = arch == "LlamaForCausalLM" and _flag(cfg, "attention_bias")
        window = _sliding_window(cfg, arch)
        max_pos = int(cfg.get("max_position_embeddings", 2048))
        if window is not None:
            max_pos = min(max_pos, window)
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
    if arch == "Qwen2ForCausalLM" and not _flag(cfg, "use_sliding_window"):
        return None
    if window is None or (window == 0 and not isinstance(window, bool)):
        return None  # null or 0: no window
    return _positive_int(cfg, "sliding_window")


def _eos_ids(cfg: dict, generation_config: dict | None) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (cfg, generation_config or {}):
        eos = source.get("eos_token_id")
        for i in eos if isinstance(eos, (list, tuple)) else [eos]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)
