"""`service:` section of the budget YAML -> frozen ServiceLimits (see docs/interfaces.md).

Invariants: every limit is positive (max_prompt_tokens 0 means "the model's context - 1");
unknown keys are errors; `*_bytes` keys take sizes as the rest of the budget does (1MiB). Values
derived from the model (the effective prompt limit) are computed by `prompt_limit()`, never
written back.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from edge_runtime.config_checks import check_concurrent_sequences, parse_bytes, section_fields
from edge_runtime.errors import ConfigError
from edge_runtime.listen_address import parse_listen


@dataclass(frozen=True)
class ServiceLimits:
    socket: str = "/run/edge-runtime.sock"
    listen: str = ""  # HOST:PORT of the TCP listener; "" = none (listen_address.py)
    api_keys: str = ""  # the keys file the TCP listener requires keys from; "" = none
    max_body_bytes: int = 1 << 20
    max_tokens: int = 1024
    max_prompt_tokens: int = 0
    max_concurrent_sequences: int = 8
    max_queue: int = 32
    retry_after_s: int = 1
    shutdown_deadline_s: float = 10.0
    body_timeout_s: float = 10.0  # a request body must arrive within this, else 408
    max_connections: int = 256  # open at once; past it the idle-longest is closed (connections.py)
    idle_timeout_s: float = 30.0  # a connection with no request for this long is closed

    def __post_init__(self) -> None:
        if self.listen:
            parse_listen(self.listen, "service.listen")
        for name in ("body_timeout_s", "idle_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ConfigError(f"service.{name} must be a finite number > 0, "
                                  f"got {getattr(self, name)}")
        for name in ("max_body_bytes", "max_tokens", "max_concurrent_sequences", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ConfigError(f"service.{name} must be >= 1, got {getattr(self, name)}")
        check_concurrent_sequences(self.max_concurrent_sequences,
                                   "service.max_concurrent_sequences")
        if self.max_prompt_tokens < 0 or self.max_queue < 0 or self.shutdown_deadline_s < 0:
            raise ConfigError("service.max_prompt_tokens, max_queue, shutdown_deadline_s must be >= 0")
        if self.max_connections <= self.max_in_flight:
            raise ConfigError(
                f"service.max_connections ({self.max_connections}) must be more than "
                f"max_concurrent_sequences + max_queue ({self.max_in_flight}), so that /health "
                "and /metrics can still connect while every request slot is taken")

    @classmethod
    def from_dict(cls, section: dict | None) -> "ServiceLimits":
        section = section or {}
        if isinstance(section, dict):  # sizes as everywhere in the budget: bytes or "1MiB"
            section = {key: parse_bytes(value, f"service.{key}") if key in _SIZE_KEYS else value
                       for key, value in section.items()}
        return cls(**section_fields(cls, section, "service"))

    @property
    def max_in_flight(self) -> int:
        """Requests accepted at once: running plus waiting; one more gets 429."""
        return self.max_concurrent_sequences + self.max_queue

    def prompt_limit(self, context_len: int) -> int:
        """Longest prompt accepted: the configured cap, never past the model's context - 1."""
        assert context_len > 1, context_len
        cap = context_len - 1
        return min(self.max_prompt_tokens, cap) if self.max_prompt_tokens else cap


_SIZE_KEYS = {f.name for f in fields(ServiceLimits) if f.name.endswith("_bytes")}
