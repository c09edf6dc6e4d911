"""Checks of single config values that every section of the budget YAML shares.

Sizes (`parse_bytes`: bytes or strings such as '64GiB') and the concurrent-sequence bound are read
the same way in the top level of a budget (edge_runtime/budget.py) and in its `service:` section
(edge_runtime/service_limits.py); both import them from here. Every error is a ConfigError whose
sentence names the key (`where`) and what to write instead.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from dataclasses import fields
from typing import Any

from edge_runtime.errors import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}
MAX_BYTES = 2**50  # 1 PiB: any size above is a typo (and would overflow the plan's float maths)
# A step decodes one token per running sequence and holds at most EngineConfig.max_batch_tokens
# (1024) tokens; no Orin board has memory for more sequences than that anyway.
MAX_CONCURRENT_SEQUENCES = 1024


def parse_bytes(value: Any, where: str) -> int:
    """An int (bytes) or a string like '64GiB', '512 MiB', '1.5GB'.

    A fraction needs a unit ('4.5GiB'): a bare 4.5 would be 4 bytes, surely a missing unit."""
    if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"{where}: expected a size such as 4GiB, got {value!r}")
    if isinstance(value, int):
        return _size_in_range(value, value, where)
    m = re.fullmatch(r"\s*(-?[0-9]+(?:\.[0-9]*)?|-?\.[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{where}: expected a size such as 4GiB or 512MiB, got {value!r}")
    number, unit = Fraction(m.group(1)), _UNITS[m.group(2).lower()]  # exact: no float overflow
    if unit == 1 and number.denominator != 1:
        raise ConfigError(f"{where}: {value!r} is a fraction of a byte; add a unit "
                          f"(e.g. {m.group(1)}GiB) or give whole bytes")
    return _size_in_range(int(number * unit), value, where)


def _size_in_range(size: int, value: Any, where: str) -> int:
    if abs(size) > MAX_BYTES:
        raise ConfigError(f"{where}: {short_repr(value)} is out of range (sizes go up to 1 PiB); "
                          "give a size such as 64GiB")
    return size


def short_repr(value: Any) -> str:
    """The value as an error message quotes it: its repr, cut when long."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)"


def check_concurrent_sequences(value: int, where: str) -> None:
    if value > MAX_CONCURRENT_SEQUENCES:
        raise ConfigError(f"{where} must be at most {MAX_CONCURRENT_SEQUENCES} (an engine step "
                          f"decodes one token per running sequence), got {short_repr(value)}")


def section_fields(cls, section: dict, name: str) -> dict:
    """Keys of a YAML section that are fields of the dataclass `cls`, converted to the field's
    type (the type of its default); unknown keys and values of another type are ConfigErrors."""
    if not isinstance(section, dict):
        raise ConfigError(f"{name}: must be a mapping, got {type(section).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(section) - set(known))
    if unknown:
        raise ConfigError(f"{name}: unknown keys {unknown}; known keys are {sorted(known)}")
    out = {}
    for key, value in section.items():
        default = getattr(cls, key)
        kind = type(default)
        try:
            if kind is bool:
                if not isinstance(value, bool):
                    raise TypeError
                out[key] = value
            elif kind in (int, float) and isinstance(value, bool):
                raise TypeError
            elif kind is int and not isinstance(value, int):
                raise TypeError
            elif kind is str and not isinstance(value, str):  # socket: 42 is not a path "42"
                raise TypeError
            else:
                out[key] = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{name}.{key}: expected {kind.__name__}, got {value!r}"
            ) from None
        if kind is float and not math.isfinite(out[key]):
            raise ConfigError(f"{name}.{key}: must be a finite number, got {value!r}")
    return out
