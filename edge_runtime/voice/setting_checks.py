"""Type and range checks of one voice setting, shared by `VADConfig` and `VoiceConfig`.

Each raises a `ConfigError` naming the key (`vad.pad_ms`) and what it must be; YAML never hands a
wrong type (a quoted "2", `1e9` that YAML 1.1 reads as text, `.nan`) through to arithmetic.
"""

from __future__ import annotations

import math

from edge_runtime.errors import ConfigError


def number(key: str, value: object, lo: float, hi: float, lo_open: bool = False,
           hi_open: bool = False) -> None:
    """A finite int or float (not a bool) from lo to hi (either end excluded when `*_open`)."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (lo < value if lo_open else lo <= value)
          and (value < hi if hi_open else value <= hi))
    if not ok:
        span = (f"from {lo:g} to {hi:g}" if not (lo_open or hi_open) else
                f"{'above' if lo_open else 'at least'} {lo:g} and "
                f"{'below' if hi_open else 'at most'} {hi:g}")
        raise ConfigError(f"{key} must be a number {span}, got {value!r}{_text_hint(value)}")


def count(key: str, value: object, lo: int, hi: int | None = None) -> None:
    """A whole number (an int, not a bool or a float) from lo (to hi)."""
    if (isinstance(value, bool) or not isinstance(value, int) or value < lo
            or (hi is not None and value > hi)):
        span = f">= {lo}" if hi is None else f"from {lo} to {hi}"
        raise ConfigError(f"{key} must be a whole number {span}, got {value!r}"
                          f"{_text_hint(value)}")


def text(key: str, value: object, what: str = "a non-empty text") -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key} must be {what}, got {'null' if value is None else repr(value)}")


def flag(key: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")


def _text_hint(value: object) -> str:
    """A number in quotes, or `1e9` that YAML 1.1 reads as text: say how to write it."""
    if not isinstance(value, str):
        return ""
    try:
        if not math.isfinite(float(value)):
            return ""
    except ValueError:
        return ""
    if "e" in value.lower() and "." not in value:
        return " (YAML reads an exponent without a dot as text: write 1.0e+9, not 1e9)"
    return " (text, not a number: drop the quotes)"
