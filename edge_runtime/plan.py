"""Memory plan: what a budget gives a model (weights, KV bytes per token, pages, streams that fit).

`make_plan(budget, model_config, weight_bytes, kv_dtype=None, page_tokens=None) -> MemoryPlan`.
`model_config` is anything with num_layers, num_kv_heads, head_dim (a ModelConfig or a
`ModelShape` below). `REFERENCE_MODELS` holds shapes of models we plan for without their weights
(`plan --model llama-2-7b-awq`); their weight bytes are estimated from the shape.
`model_for_plan(name, weight_dtype, weights, device)`: what the plan needs of a model (its config
or shape and its weight bytes, model/weight_bytes.py), for `edge-runtime plan`, `simulate` and the
service unit's limit check (service/unit_limits.py).

Arithmetic (docs/pool.md):
  kv bytes/token = num_layers * 2 (K and V) * num_kv_heads * (head_dim * elem + scale bytes)
                   int8: elem 1, one fp16 scale per token and head (2 bytes); fp16: 2; fp32: 4
  pool bytes     = device - os reserve - other reserve - activation reserve - weights - inline
                   arena - recent-key windows (capped by kv.max_pool_bytes)
  pages          = pool bytes // (page_tokens * bytes/token)
Invariants: a MemoryPlan is frozen and only ever derived from a Budget; an impossible budget
raises ConfigError naming what binds (the cap, or the numbers that do not add up and the largest
of them) and the key to change. A page size passed in obeys the budget's rules for kv.page_tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edge_runtime.budget import TORCH_DTYPES, WINDOW_COST, Budget, check_page_tokens
from edge_runtime.kv.page_math import pages_for_tokens
from edge_runtime.kv.recent_window import WINDOWS_PER_SEQUENCE, window_bytes
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
    layer_windows: tuple[int | None, ...] | None = None  # per layer: local window, None global


REFERENCE_MODELS = {
    "llama-2-7b": ModelShape("llama-2-7b", 32, 32, 32, 128, 4096, 11008, 32000),
    "llama-2-7b-awq": ModelShape("llama-2-7b-awq", 32, 32, 32, 128, 4096, 11008, 32000,
                                 quantization="awq-g128"),
    "llama-3.1-8b-awq": ModelShape("llama-3.1-8b-awq", 32, 32, 8, 128, 4096, 14336, 128256,
                                   quantization="awq-g128"),
    "smollm2-135m-shape": ModelShape("smollm2-135m-shape", 30, 9, 3, 64, 576, 1536, 49152, True),
    # Gemma 3 270M: five local layers (window 512) per global one
    "gemma-3-270m-shape": ModelShape("gemma-3-270m-shape", 18, 4, 1, 256, 640, 2048, 262144, True,
                                     layer_windows=tuple(None if (i + 1) % 6 == 0 else 512
                                                         for i in range(18))),
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
    recent_window: int  # int8 KV: newest positions per sequence kept exact (kv/recent_window.py)
    recent_window_bytes: int  # all windows (2 per concurrent sequence), allocated once
    centred_keys: bool  # int8 KV: keys centred on their layer's mean key (docs/engine.md)
    pool_bytes: int  # num_pages * bytes_per_page (what is actually allocated)
    num_pages: int
    pool_tokens: int
    stream_context_tokens: int
    streams_that_fit: int  # streams of stream_context_tokens, nothing shared
    max_concurrent_sequences: int
    runtime_bytes: int = 0  # CUDA context + allocator workspace, measured at start (engine/cuda_memory.py)
    # sliding-window models: layer_group_bytes' prediction for one stream (None: every layer global)
    layer_groups: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def make_plan(budget: Budget, model_config, weight_bytes: int | None,
              kv_dtype: str | None = None, page_tokens: int | None = None,
              model_name: str = "", runtime_bytes: int = 0) -> MemoryPlan:
    """`weight_bytes` None: not known yet (before the model loads); counted as 0, so a budget
    refused then is refused after loading too. `kv_dtype`/`page_tokens` None: the budget's.
    `runtime_bytes`: what the process holds besides weights and KV (the CUDA context and
    allocator workspace, measured at start-up); deducted like the reserves."""
    kv_dtype = kv_dtype or budget.kv_dtype
    page_tokens = budget.page_tokens if page_tokens is None else page_tokens
    check_page_size(budget, page_tokens, kv_dtype, "the page size")
    per_token = kv_bytes_per_token(model_config, kv_dtype)
    per_page = per_token * page_tokens
    arena = budget.inline_slots * budget.inline_tokens * per_token
    window = budget.recent_window if kv_dtype == "int8" else 0
    windows = WINDOWS_PER_SEQUENCE * budget.max_concurrent_sequences * window_bytes(
        model_config.num_layers, model_config.num_kv_heads, model_config.head_dim, window)
    parts = _deductions(budget, weight_bytes, arena, windows, runtime_bytes)
    room = budget.device_memory - sum(n for _, n, _ in parts)
    if budget.max_pool_bytes is not None:
        room = min(room, budget.max_pool_bytes)
    num_pages = max(0, room) // per_page
    if num_pages < 1:
        raise _no_room(budget, parts, per_page, page_tokens, weight_bytes is None)
    pages_per_stream = pages_for_tokens(budget.stream_context_tokens, page_tokens)
    reserved = budget.os_reserve + budget.other_reserve + budget.activation_reserve
    return MemoryPlan(
        budget.name, model_name, kv_dtype, page_tokens, budget.device_memory, reserved,
        weight_bytes or 0, per_token, per_page, budget.inline_slots, budget.inline_tokens, arena,
        window, windows, kv_dtype == "int8" and budget.centred_keys, num_pages * per_page,
        num_pages, num_pages * page_tokens, budget.stream_context_tokens,
        num_pages // pages_per_stream, budget.max_concurrent_sequences, runtime_bytes,
        _layer_groups(model_config, kv_dtype, page_tokens, budget.stream_context_tokens,
                      num_pages * per_page))


@dataclass(frozen=True)
class LayerGroupBytes:
    """KV bytes of one stream of `context_tokens` by layer group (docs/pool.md, "Layer groups"):
    global layers hold every position; a local layer of window W needs at most
    ceil(W / P) + 1 pages of it. `stream_bytes_grouped` is what the pool holds with layer groups
    (kv/layer_groups.py; `edge-runtime bench kv-groups` measures it), `stream_bytes_all_layers`
    what it held storing every layer."""

    window: int
    global_layers: int
    local_layers: int
    global_bytes_per_token: int  # all global layers together
    local_bytes_per_token: int  # all local layers together
    context_tokens: int
    local_tokens_held: int  # positions a local layer keeps: whole pages covering its window
    stream_bytes_all_layers: int
    stream_bytes_grouped: int

    @property
    def ratio(self) -> float:
        return self.stream_bytes_grouped / self.stream_bytes_all_layers


def layer_group_bytes(model_config, kv_dtype: str, page_tokens: int,
                      context_tokens: int) -> LayerGroupBytes | None:
    """None for a model whose layers are all global (no `layer_windows`, or none local)."""
    windows = getattr(model_config, "layer_windows", None) or ()
    local = [w for w in windows if w is not None]
    if not local:
        return None
    assert len(set(local)) == 1, f"one local window per model, got {sorted(set(local))}"
    window = local[0]
    per_layer = kv_bytes_per_token(model_config, kv_dtype) // model_config.num_layers
    held = min(context_tokens, (-(-window // page_tokens) + 1) * page_tokens)
    n_local = len(local)
    n_global = model_config.num_layers - n_local
    return LayerGroupBytes(window, n_global, n_local, n_global * per_layer, n_local * per_layer,
                           context_tokens, held,
                           model_config.num_layers * per_layer * context_tokens,
                           n_global * per_layer * context_tokens + n_local * per_layer * held)


def _layer_groups(model_config, kv_dtype: str, page_tokens: int, context_tokens: int,
                  pool_bytes: int) -> dict | None:
    groups = layer_group_bytes(model_config, kv_dtype, page_tokens, context_tokens)
    if groups is None:
        return None
    return {**asdict(groups), "ratio": round(groups.ratio, 4),
            "streams_that_fit_grouped": pool_bytes // groups.stream_bytes_grouped}


def check_page_size(budget: Budget, page_tokens, kv_dtype: str, where: str) -> None:
    """A page size given instead of kv.page_tokens (`where` names it, e.g. --page-tokens) obeys
    the budget's own rules: a power of two, no shorter than an inline slot or a recent window."""
    check_page_tokens(page_tokens, where)
    if budget.inline_slots and budget.inline_tokens > page_tokens:
        raise ConfigError(
            f"{where} ({page_tokens}) is smaller than inline.tokens ({budget.inline_tokens}) in "
            f"{budget.source}: an inline slot holds at most one page; use pages of at least "
            f"{budget.inline_tokens} tokens, or lower inline.tokens (inline.slots: 0 turns it off)")
    if kv_dtype == "int8" and budget.recent_window > page_tokens:
        raise ConfigError(
            f"{where} ({page_tokens}) is smaller than kv.recent_window ({budget.recent_window}) in "
            f"{budget.source}: {WINDOW_COST}; use pages of at least {budget.recent_window} tokens, "
            "or lower kv.recent_window")


def _deductions(budget: Budget, weight_bytes: int | None, arena: int, windows: int,
                runtime_bytes: int = 0) -> list:
    """(label, bytes, what to change) for everything the pool comes after."""
    parts = [("reserve.os", budget.os_reserve, "lower reserve.os"),
             ("reserve.other", budget.other_reserve, "lower reserve.other"),
             ("activation_reserve", budget.activation_reserve, "lower activation_reserve")]
    if runtime_bytes:
        parts.append(("CUDA context + workspace (measured)", runtime_bytes,
                      "lower reserve.other or activation_reserve, which the measured part may cover"))
    if weight_bytes is not None:
        parts.append(("weights", weight_bytes, "quantize the weights or use a smaller model"))
    return parts + [
        ("inline arena", arena, "lower inline.slots or inline.tokens"),
        ("recent-key windows", windows,
         f"lower kv.recent_window ({budget.recent_window}) or max_concurrent_sequences "
         f"({budget.max_concurrent_sequences})")]


def _no_room(budget: Budget, parts: list, per_page: int, page_tokens: int,
             before_weights: bool) -> ConfigError:
    """The error for a budget with no room for one page, naming what binds and what to change."""
    free = budget.device_memory - sum(n for _, n, _ in parts)
    page = f"one page of {page_tokens} tokens needs {_size(per_page)}"
    cap = budget.max_pool_bytes
    if free >= per_page:  # only the cap binds
        return ConfigError(
            f"{budget.source}: kv.max_pool_bytes ({_size(cap)}) leaves no room for one KV page: "
            f"{page}; raise kv.max_pool_bytes to at least {_size(per_page)} or lower "
            "kv.page_tokens")
    terms = "".join(f" - {label} {_gib(n)}" for label, n, _ in parts)
    label, largest, advice = max(parts, key=lambda part: part[1])
    fix = (f"the largest part is {label} ({_gib(largest)}): {advice}" if largest
           else "raise device_memory")
    also = (f" (kv.max_pool_bytes {_size(cap)} is below one page too)"
            if cap is not None and cap < per_page else "")
    return ConfigError(
        f"{budget.source}: the budget leaves no room for one KV page"
        f"{' even before the model weights' if before_weights else ''}: device_memory "
        f"{_gib(budget.device_memory)}{terms} = {_gib(free)}, but {page}{also}; {fix}, or lower "
        "kv.page_tokens")


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _size(n: int) -> str:
    """Bytes in the largest unit that keeps them above 1 (a 6 MiB page is not "0.01 GiB")."""
    for unit, name in ((GiB, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= unit:
            return f"{n / unit:.2f} {name}"
    return f"{n} bytes"


def gguf_blocks_served(source: Path | None, weights: str, weight_dtype: str, device: str) -> bool:
    """Whether loading `source` with `weights` on `device` serves its own blocks (the loader's
    rule; planning needs no GPU: a cuda device is not opened)."""
    import torch  # start-up time: the plan imports no torch until a model file is read

    from edge_runtime.model.gguf_int4 import serve_from_blocks  # start-up time: imports torch

    return serve_from_blocks(weights, source, getattr(torch, TORCH_DTYPES[weight_dtype]), device)


def model_for_plan(name: str, weight_dtype: str, weights: str = "auto", device: str = "cpu"):
    """(model config or shape, weight bytes, display name). A GGUF model counts what serving it
    on `device` with `weight_dtype` activations holds (the loader's own choice,
    gguf_int4.serve_from_blocks): its blocks in the runtime's int4/int8 form with float tensors at
    `weight_dtype` (model/gguf_int4.py), or its float conversion, every tensor at `weight_dtype`;
    neither converts the file."""
    if name in REFERENCE_MODELS:
        shape = REFERENCE_MODELS[name]
        return shape, estimate_weight_bytes(shape, weight_dtype), f"{name} (reference shape)"
    # start-up time: the loader imports torch and transformers; a reference shape needs neither
    from edge_runtime.model.loader import gguf_source, read_model_config, resolve_model_folder
    from edge_runtime.model.safetensors_io import weight_files  # start-up time, as the loader
    from edge_runtime.model.weight_bytes import gguf_weight_bytes, safetensors_weight_bytes  # as the loader

    folder = resolve_model_folder(name)
    config = read_model_config(folder)
    source = gguf_source(name)
    if source is not None:
        blocks = gguf_blocks_served(source, weights, weight_dtype, device)
        return config, gguf_weight_bytes(source, blocks, DTYPE_BYTES[weight_dtype]), name
    return config, safetensors_weight_bytes(weight_files(folder), DTYPE_BYTES[weight_dtype]), name
