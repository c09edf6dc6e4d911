"""`EngineConfig`: the engine's settings, one frozen dataclass validated once.

Derived values (the page count when not given) are computed by `resolve_num_pages`, never written
back into the config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from edge_runtime.kv.page_math import pages_for_tokens
from edge_runtime.kv.recent_window import DEFAULT_WINDOW_TOKENS
from edge_runtime.kv.storage import KV_DTYPES
from edge_runtime.errors import ConfigError
from edge_runtime.plan import make_plan

DEFAULT_POOL_TOKENS = 8192  # when neither num_pages nor a memory plan is given


@dataclass(frozen=True)
class EngineConfig:
    kv_dtype: str = "int8"  # int8 | fp16 | fp32 (the float ones are for reference runs)
    page_tokens: int = 512
    num_pages: int | None = None  # None: from the memory plan, else DEFAULT_POOL_TOKENS worth
    num_inline_slots: int = 8
    inline_tokens: int = 128
    # int8 KV: each running sequence's last recent_window positions are also kept exact (fp16) and
    # attention reads them from there (kv/recent_window.py); 0 = off. CPU flat path only.
    recent_window: int = DEFAULT_WINDOW_TOKENS
    # int8 KV: store each key centred on its layer's mean key where that lowers its absmax
    # (kernels/quantize.py; the means are measured at start, kv/key_means.py)
    centred_keys: bool = True
    enable_prefix_cache: bool = True
    enable_inline: bool = True
    max_num_seqs: int = 8  # sequences running at once (n > 1 and beams count each sequence)
    max_batch_tokens: int = 1024  # tokens per step (decode first, then prefill chunks)
    device: str = "cpu"
    backend: str | None = None  # "cpu" | "cuda" (engine/backend.py); None: the device's
    check_invariants_every_step: bool = False  # tests: KVManager.check_invariants after each step
    # CUDA back end: decode steps padded to these batch sizes and replayed from CUDA graphs
    # captured at start (engine/cuda_graphs.py); () = off; None = (1, 2, 4, 8, 16) on a CUDA
    # device, off on a CPU one (the interpreter runs the padded steps eagerly when given buckets)
    decode_buckets: tuple[int, ...] | None = None
    # constrained requests: append the tokens a grammar forces (the only one its mask allows)
    # without a forward each, then compute them in one chunk (engine/emission.py); the outputs
    # are the same with it off
    jump_forward: bool = True
    # with jump_forward, greedy constrained rows also draft the grammar's forced text in the
    # tokenizer's tokens, computed in that chunk and kept as far as the sampler confirms them
    # (engine/forced_drafts.py); the outputs are the same with it off
    forced_text_drafts: bool = True

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        for name in ("page_tokens", "max_num_seqs", "max_batch_tokens"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.recent_window, int) or self.recent_window < 0:
            raise ConfigError(f"recent_window must be a whole number of tokens >= 0 (0 turns it "
                              f"off), got {self.recent_window!r}")
        if not isinstance(self.centred_keys, bool):
            raise ConfigError(f"centred_keys must be true or false, got {self.centred_keys!r}")
        for name in ("jump_forward", "forced_text_drafts"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.backend not in (None, "cpu", "cuda"):
            raise ConfigError(f"backend must be cpu or cuda, got {self.backend!r}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ConfigError(f"num_pages must be a positive integer, got {self.num_pages!r}")
        if self.enable_inline and (self.num_inline_slots < 1 or self.inline_tokens < 1):
            raise ConfigError("inline slots need num_inline_slots >= 1 and inline_tokens >= 1 "
                              "(or set enable_inline to false)")
        if self.decode_buckets is not None:
            buckets = tuple(self.decode_buckets) if isinstance(self.decode_buckets, (list, tuple)) else None
            if buckets is None or not all(isinstance(b, int) and 1 <= b <= 256 for b in buckets):
                raise ConfigError(f"decode_buckets must be a list of batch sizes between 1 and 256 "
                                  f"(empty: no CUDA graphs), got {self.decode_buckets!r}")
            object.__setattr__(self, "decode_buckets", tuple(sorted(set(buckets))))
        if self.max_batch_tokens < self.max_num_seqs:
            raise ConfigError(f"max_batch_tokens ({self.max_batch_tokens}) must be at least "
                              f"max_num_seqs ({self.max_num_seqs}) so every sequence can decode")

    @classmethod
    def from_dict(cls, data: dict) -> "EngineConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown engine setting(s): {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def from_plan(cls, plan, **overrides) -> "EngineConfig":
        """Take page size and count from a MemoryPlan (edge_runtime/plan.py) when it has them."""
        values = {}
        for ours, theirs in (("num_pages", "num_pages"), ("page_tokens", "page_tokens"),
                             ("kv_dtype", "kv_dtype"), ("num_inline_slots", "inline_slots"),
                             ("inline_tokens", "inline_tokens"),
                             ("max_num_seqs", "max_concurrent_sequences"),
                             ("recent_window", "recent_window"), ("centred_keys", "centred_keys")):
            if getattr(plan, theirs, None) is not None:
                values[ours] = getattr(plan, theirs)
        if values.get("num_inline_slots") == 0 or values.get("inline_tokens") == 0:
            values["enable_inline"] = False
        values.update(overrides)
        # after the overrides: the service's max_concurrent_sequences replaces the plan's
        if "max_num_seqs" in values and "max_batch_tokens" not in overrides:
            values["max_batch_tokens"] = max(cls.max_batch_tokens, values["max_num_seqs"])
        return cls.from_dict(values)


def budget_engine_config(budget, loaded, overrides: dict, **plan_options):
    """Budget -> memory plan -> EngineConfig, the one way every front end takes it: the plan for
    this loaded model (its config, weight bytes and folder name; `plan_options` as `make_plan`
    takes them), then `from_plan` with `overrides` on top. Returns (EngineConfig, MemoryPlan)."""
    plan = make_plan(budget, loaded.config, loaded.weight_bytes, model_name=loaded.path.name,
                     **plan_options)
    return EngineConfig.from_plan(plan, **overrides), plan


def resolve_num_pages(config: EngineConfig) -> int:
    if config.num_pages is not None:
        return config.num_pages
    return max(2, pages_for_tokens(DEFAULT_POOL_TOKENS, config.page_tokens))
