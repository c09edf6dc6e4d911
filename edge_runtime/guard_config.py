"""`guard:` section of the budget YAML -> frozen GuardConfig (see docs/interfaces.md).

Invariants: 0 < high < critical <= 1, 0 <= hysteresis < high, every number finite (a NaN poll
interval busy-polls, an infinite one kills the guard thread); unknown keys are errors (a typo in a
threshold must not silently fall back to a default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from edge_runtime.config_checks import section_fields
from edge_runtime.errors import ConfigError


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    poll_interval_s: float = 0.5
    high_used_fraction: float = 0.85
    critical_used_fraction: float = 0.93
    hysteresis: float = 0.03
    preempt_on_critical: int = 1
    shrink_chunks_on_high: int = 1  # whole pool chunks returned to the OS per poll in high
    shrink_chunks_on_critical: int = 1
    max_admission_pause_s: float = 10.0  # then requests not yet admitted get 503 + Retry-After

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"guard.{f.name}: must be a finite number, got {value!r}")
        if not 0 < self.high_used_fraction < self.critical_used_fraction <= 1:
            raise ConfigError(
                "guard: need 0 < high_used_fraction < critical_used_fraction <= 1, got "
                f"{self.high_used_fraction} and {self.critical_used_fraction}"
            )
        if not 0 <= self.hysteresis < self.high_used_fraction:
            raise ConfigError(f"guard: hysteresis must be in [0, high), got {self.hysteresis}")
        if self.poll_interval_s <= 0:
            raise ConfigError(f"guard: poll_interval_s must be > 0, got {self.poll_interval_s}")
        if min(self.preempt_on_critical, self.shrink_chunks_on_high,
               self.shrink_chunks_on_critical) < 0:
            raise ConfigError("guard: preempt_on_critical, shrink_chunks_on_high and "
                              "shrink_chunks_on_critical must be >= 0")
        if self.max_admission_pause_s <= 0:
            raise ConfigError("guard: max_admission_pause_s must be > 0 (seconds a request may "
                              f"wait while admission is paused), got {self.max_admission_pause_s}")

    @classmethod
    def from_dict(cls, section: dict | None) -> "GuardConfig":
        return cls(**section_fields(cls, section or {}, "guard"))
