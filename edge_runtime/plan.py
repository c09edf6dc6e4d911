"""Memory plan: what a budget gives a model (weights, KV bytes per token, pages, streams that fit).

`make_plan(budget, model_config, weight_bytes, kv_dtype=None, page_tokens=None) -> MemoryPlan`.
`model_config` is anything with num_layers, num_kv_heads, head_dim (a ModelConfig or a
`ModelShape` below). `REFERENCE_MODELS` holds shapes of models we plan for without their weights
(`plan --model llama-2-7b-awq`); their weight bytes are estimated from the shape.

Arithmetic (docs/pool.md):
  kv bytes/token = num_layers * 2 (K and V) * num_kv_heads * (head_dim * elem + scale bytes)
                   int8: elem 1, one fp16 scale per token and head (2 bytes); fp16: 2; fp32: 4
  pool bytes     = device - os reserve - other reserve - activation reserve - weights - inline
                   arena (capped by kv.max_pool_bytes)
  pages          = pool bytes // (page_tokens * bytes/token)
Invariants: a MemoryPlan is frozen and only ever derived from a Budget; an impossible budget
raises ConfigError listing the numbers that do not add up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edge_runtime.budget import Budget, check_page_tokens
from edge_runtime.cache.recent_windows import WINDOWS_PER_SEQUENCE, window_bytes
from edge_runtime.errors import ConfigError

KV_ELEM_BYTES = {"int8": 1, "fp16": 2, "fp32": 4}
KV_SCALE_BYTES = {"int8": 2, "fp16": 0, "fp32": 0}
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
GiB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model config the plan needs (and weight estimation for reference models)."""

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    quantization: str = "none"  # "none" | "awq-g128" | "awq-g64"


REFERENCE_MODELS = {
    "llama-2-7b": ModelShape("llama-2-7b", 32, 32, 32, 128, 4096, 11008, 32000),
    "llama-2-7b-awq": ModelShape("llama-2-7b-awq", 32, 32, 32, 128, 4096, 11008, 32000,
                                 quantization="awq-g128"),
    "llama-3.1-8b-awq": ModelShape("llama-3.1-8b-awq", 32, 32, 8, 128, 4096, 14336, 128256,
                                   quantization="awq-g128"),
    "smollm2-135m-shape": ModelShape("smollm2-135m-shape", 30, 9, 3, 64, 576, 1536, 49152, True),
}


def estimate_weight_bytes(shape: ModelShape, dtype: str = "fp16") -> int:
    """Bytes of a Llama-style model's weights. AWQ: linear layers int4 + per-group fp16 scale
    and int4 zero (AutoAWQ GEMM); embeddings, lm_head and norms stay in `dtype`."""
    h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    q = shape.num_heads * shape.head_dim
    linear = shape.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * shape.intermediate_size)
    dense = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    dense += shape.num_layers * 2 * h + h  # RMSNorm weights
    elem = DTYPE_BYTES[dtype]
    if shape.quantization.startswith("awq-g"):
        group = int(shape.quantization[len("awq-g"):])
        linear_bytes = linear // 2 + (linear // group) * (2 + 0.5)
        return int(linear_bytes + dense * elem)
    return (linear + dense) * elem


def kv_bytes_per_token(model_config, kv_dtype: str) -> int:
    if kv_dtype not in KV_ELEM_BYTES:
        raise ConfigError(f"KV dtype must be one of {', '.join(KV_ELEM_BYTES)}, got {kv_dtype!r}")
    per_head = model_config.head_dim * KV_ELEM_BYTES[kv_dtype] + KV_SCALE_BYTES[kv_dtype]
    return model_config.num_layers * 2 * model_config.num_kv_heads * per_head


@dataclass(frozen=True)
class MemoryPlan:
    budget_name: str
    model_name: str
    kv_dtype: str
    page_tokens: int
    device_memory: int
    reserved: int  # os + other + activation
    weight_bytes: int
    kv_bytes_per_token: int
    bytes_per_page: int
    inline_slots: int
    inline_tokens: int
    inline_arena_bytes: int
    recent_window: int  # int8 KV: newest positions per sequence kept exact (engine/recent_window.py)
    recent_window_bytes: int  # all windows (2 per concurrent sequence), allocated once
    centred_keys: bool  # int8 KV: keys centred on their layer's mean key (docs/engine.md)
    pool_bytes: int  # num_pages * bytes_per_page (what is actually allocated)
    num_pages: int
    pool_tokens: int
    stream_context_tokens: int
    streams_that_fit: int  # streams of stream_context_tokens, nothing shared
    max_concurrent_sequences: int

    def as_dict(self) -> dict:
        return asdict(self)


def make_plan(budget: Budget, model_config, weight_bytes: int, kv_dtype: str | None = None,
              page_tokens: int | None = None, model_name: str = "") -> MemoryPlan:
    kv_dtype = kv_dtype or budget.kv_dtype
    page_tokens = page_tokens or budget.page_tokens
    check_page_tokens(page_tokens, "the page size")
    per_token = kv_bytes_per_token(model_config, kv_dtype)
    per_page = per_token * page_tokens
    arena = budget.inline_slots * budget.inline_tokens * per_token
    window = budget.recent_window if kv_dtype == "int8" else 0
    windows = WINDOWS_PER_SEQUENCE * budget.max_concurrent_sequences * window_bytes(
        model_config.num_layers, model_config.num_kv_heads, model_config.head_dim, window)
    reserved = budget.os_reserve + budget.other_reserve + budget.activation_reserve
    room = budget.device_memory - reserved - weight_bytes - arena - windows
    if budget.max_pool_bytes is not None:
        room = min(room, budget.max_pool_bytes)
    num_pages = max(0, room) // per_page
    if num_pages < 1:
        raise ConfigError(
            f"{budget.source}: the budget leaves no room for one KV page: device_memory "
            f"{_gib(budget.device_memory)} - reserve.os {_gib(budget.os_reserve)} - reserve.other "
            f"{_gib(budget.other_reserve)} - activation_reserve {_gib(budget.activation_reserve)} "
            f"- weights {_gib(weight_bytes)} - inline arena {_gib(arena)} - recent-key windows "
            f"{_gib(windows)} = {_gib(room)}, but one "
            f"page of {page_tokens} tokens needs {_gib(per_page)}; lower the reserves, the page "
            "size or the inline arena, or quantize the weights")
    pages_per_stream = -(-budget.stream_context_tokens // page_tokens)
    return MemoryPlan(
        budget.name, model_name, kv_dtype, page_tokens, budget.device_memory, reserved,
        weight_bytes, per_token, per_page, budget.inline_slots, budget.inline_tokens, arena,
        window, windows, kv_dtype == "int8" and budget.centred_keys, num_pages * per_page, num_pages, num_pages * page_tokens, budget.stream_context_tokens,
        num_pages // pages_per_stream, budget.max_concurrent_sequences)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"
