"""Memory budget YAML (configs/orin/*.yaml) -> frozen `Budget`; schema in docs/pool.md.

`load_budget(name_or_path)` accepts a YAML path or a config name (`cpu-dev`, `agx-orin-64gb`...),
looked up in the package data `edge_runtime/data/configs/` (a symlink to configs/orin/ in the
source tree; setuptools copies the files into wheels, an editable install follows the link).

Invariants: a Budget is validated once in __post_init__ and never mutated; values derived from it
(page count, bytes per token) live in `edge_runtime.plan.MemoryPlan`. Every error is a
ConfigError whose sentence names the file and the key. `guard:` and `service:` are kept as raw
mappings here, validated on load by their schemas (guard_config.GuardConfig,
service_limits.ServiceLimits), which sit below the budget so that it can check them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from edge_runtime.config_checks import check_concurrent_sequences, parse_bytes, short_repr
from edge_runtime.errors import ConfigError
from edge_runtime.guard_config import GuardConfig
from edge_runtime.kv.recent_window import DEFAULT_WINDOW_TOKENS
from edge_runtime.service_limits import ServiceLimits

SECTION_SCHEMAS = {"guard": GuardConfig, "service": ServiceLimits}

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "configs"
KV_DTYPES = ("int8", "fp16", "fp32")
WEIGHT_DTYPES = ("fp16", "bf16", "fp32")
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # weight dtype -> torch name
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")
TOP_KEYS = {"name", "description", "device", "device_memory", "reserve", "activation_reserve",
            "weight_dtype", "kv", "inline", "max_concurrent_sequences", "stream_context_tokens",
            "guard", "service"}
SECTION_KEYS = {"reserve": {"os", "other"},
                "kv": {"dtype", "page_tokens", "max_pool_bytes", "recent_window", "centred_keys"},
                "inline": {"slots", "tokens"}}
MAX_COUNT = 2**24  # tokens, slots: any count above is a typo
WINDOW_COST = ("each running sequence holds 2 fp16 windows, so a window longer than a page costs "
               "about 4 int8 pages per sequence, and the default 16 tokens give most of the "
               "accuracy gain (docs/engine.md)")


@dataclass(frozen=True)
class Budget:
    name: str
    source: str  # the file it was read from
    device_memory: int  # bytes the device has (CPU and GPU share it on Orin)
    os_reserve: int  # left to the OS and system services
    other_reserve: int  # left to other processes (ASR, TTS)
    activation_reserve: int  # activations, logits, sampler and allocator slack
    weight_dtype: str = "fp16"  # the CUDA back end's; the CPU back end runs fp32
    device: str = "auto"  # auto | cpu | cuda | cuda:N: what `--device auto` picks (engine/placement.py)
    kv_dtype: str = "int8"
    page_tokens: int = 512
    max_pool_bytes: int | None = None  # optional cap on the page pool
    recent_window: int = DEFAULT_WINDOW_TOKENS  # int8: newest positions read exact per sequence
    centred_keys: bool = True  # int8: keys centred on their layer's mean (docs/engine.md)
    inline_slots: int = 8
    inline_tokens: int = 128
    max_concurrent_sequences: int = 8
    stream_context_tokens: int = 2048  # the context "streams that fit" is computed for
    description: str = ""
    guard: Mapping[str, Any] = field(default_factory=dict)
    service: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = self.source
        for key in ("device_memory", "os_reserve", "other_reserve", "activation_reserve"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{where}: {key} must not be negative, got {getattr(self, key)}")
        if self.device_memory <= 0:
            raise ConfigError(f"{where}: device_memory must be positive")
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"{where}: kv.dtype must be one of {', '.join(KV_DTYPES)}, "
                              f"got {self.kv_dtype!r}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ConfigError(f"{where}: weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}, "
                              f"got {self.weight_dtype!r}")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ConfigError(f"{where}: device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        check_page_tokens(self.page_tokens, f"{where}: kv.page_tokens")
        if self.inline_slots < 0 or self.inline_tokens < 0:
            raise ConfigError(f"{where}: inline.slots and inline.tokens must not be negative")
        if self.inline_slots and not 0 < self.inline_tokens <= self.page_tokens:
            raise ConfigError(f"{where}: inline.tokens ({self.inline_tokens}) must be between 1 "
                              f"and kv.page_tokens ({self.page_tokens})")
        if self.max_concurrent_sequences < 1 or self.stream_context_tokens < 1:
            raise ConfigError(f"{where}: max_concurrent_sequences and stream_context_tokens "
                              "must be at least 1")
        check_concurrent_sequences(self.max_concurrent_sequences,
                                   f"{where}: max_concurrent_sequences")
        if self.max_pool_bytes is not None and self.max_pool_bytes <= 0:
            raise ConfigError(f"{where}: kv.max_pool_bytes must be positive when set")
        if self.recent_window < 0:
            raise ConfigError(f"{where}: kv.recent_window must be 0 (off) or a number of tokens, "
                              f"got {self.recent_window}")
        if self.kv_dtype == "int8" and self.recent_window > self.page_tokens:
            raise ConfigError(f"{where}: kv.recent_window ({self.recent_window}) must be at most "
                              f"kv.page_tokens ({self.page_tokens}): {WINDOW_COST}")
        object.__setattr__(self, "guard", MappingProxyType(dict(self.guard)))
        object.__setattr__(self, "service", MappingProxyType(dict(self.service)))


def check_page_tokens(page_tokens: Any, where: str) -> None:
    if (isinstance(page_tokens, bool) or not isinstance(page_tokens, int) or page_tokens < 1
            or page_tokens & (page_tokens - 1)):
        raise ConfigError(f"{where} must be a power of two (16, 64, 256, 512...), "
                          f"got {short_repr(page_tokens)}")
    if page_tokens > MAX_COUNT:
        raise ConfigError(f"{where} must be at most {MAX_COUNT:,}, got {short_repr(page_tokens)}")


def resolve_budget_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for cand in (CONFIG_DIR / f"{name_or_path}.yaml", CONFIG_DIR / str(name_or_path)):
        if cand.is_file():
            return cand
    known = ", ".join(available_budgets()) or "none found"
    raise ConfigError(f"no budget file or config named {str(name_or_path)!r} (known: {known})")


def available_budgets() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.is_dir() else []


def _mapping(data: dict, key: str, where: str) -> dict:
    """The section `key`: absent or null means defaults; anything else must be a mapping (a
    falsy `guard: off` or `kv: false` must not silently become the defaults)."""
    sec = data.get(key)
    if sec is None:
        return {}
    if not isinstance(sec, dict):
        hint = " (to switch it off use guard: {enabled: false})" if key == "guard" else ""
        raise ConfigError(f"{where}: {key} must be a mapping of keys to values, got {sec!r}{hint}")
    return sec


def _section(data: dict, key: str, where: str) -> dict:
    sec = _mapping(data, key, where)
    unknown = set(sec) - SECTION_KEYS[key]
    if unknown:
        raise ConfigError(f"{where}: unknown key {key}.{sorted(unknown)[0]} "
                          f"(allowed: {', '.join(sorted(SECTION_KEYS[key]))})")
    return sec


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {short_repr(value)}")
    if abs(value) > MAX_COUNT:
        raise ConfigError(f"{where}: {short_repr(value)} is out of range (at most {MAX_COUNT:,})")
    return value


def budget_from_dict(data: Any, source: str) -> Budget:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a budget file must be a YAML mapping")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r} "
                          f"(allowed: {', '.join(sorted(TOP_KEYS))})")
    if "device_memory" not in data:
        raise ConfigError(f"{source}: device_memory is required (e.g. device_memory: 64GiB)")
    reserve, kv = _section(data, "reserve", source), _section(data, "kv", source)
    inline = _section(data, "inline", source)
    pool_cap = kv.get("max_pool_bytes")
    return Budget(
        name=str(data.get("name", Path(source).stem)), source=source,
        device_memory=parse_bytes(data["device_memory"], f"{source}: device_memory"),
        os_reserve=parse_bytes(reserve.get("os", 0), f"{source}: reserve.os"),
        other_reserve=parse_bytes(reserve.get("other", 0), f"{source}: reserve.other"),
        activation_reserve=parse_bytes(data.get("activation_reserve", 0),
                                       f"{source}: activation_reserve"),
        weight_dtype=str(data.get("weight_dtype", "fp16")), device=str(data.get("device", "auto")),
        kv_dtype=str(kv.get("dtype", "int8")),
        page_tokens=kv.get("page_tokens", 512),
        max_pool_bytes=None if pool_cap is None else parse_bytes(pool_cap, f"{source}: kv.max_pool_bytes"),
        recent_window=_int(kv.get("recent_window", DEFAULT_WINDOW_TOKENS), f"{source}: kv.recent_window"),
        centred_keys=_bool(kv.get("centred_keys", True), f"{source}: kv.centred_keys"),
        inline_slots=_int(inline.get("slots", 8), f"{source}: inline.slots"),
        inline_tokens=_int(inline.get("tokens", 128), f"{source}: inline.tokens"),
        max_concurrent_sequences=_int(data.get("max_concurrent_sequences", 8),
                                      f"{source}: max_concurrent_sequences"),
        stream_context_tokens=_int(data.get("stream_context_tokens", 2048),
                                   f"{source}: stream_context_tokens"),
        description=str(data.get("description", "")),
        guard=_validated(data, "guard", source), service=_validated(data, "service", source))


def _validated(data: dict, key: str, source: str) -> dict:
    """The raw section, after its schema accepted it."""
    sec = _mapping(data, key, source)
    try:
        SECTION_SCHEMAS[key].from_dict(sec)
    except ConfigError as exc:  # the schemas' messages mostly name the section already
        message = str(exc) if str(exc).startswith(key) else f"{key}: {exc}"
        raise ConfigError(f"{source}: {message}") from exc
    return sec


def load_budget(name_or_path: str | Path) -> Budget:
    """Read and validate a budget; ConfigError names the file and the key on any problem."""
    path = resolve_budget_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read budget {path}: not UTF-8 text (byte {exc.start}); "
                          "give a YAML budget file") from exc
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read budget {path}: {exc}") from exc
    return budget_from_dict(data, str(path))
