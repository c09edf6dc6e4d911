"""`VoiceConfig`: the voice loop's settings (configs/voice/default.yaml), one frozen dataclass.

The CPU split is explicit: `asr_workers` recognitions at a time on `asr_threads` threads each, and
the engine's torch threads = `engine_threads`, or (0) the cores left after ASR, at least 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from edge_runtime.errors import ConfigError
from edge_runtime.voice.vad import VADConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "voice"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"


@dataclass(frozen=True)
class VoiceConfig:
    system_prompt: Path = CONFIG_DIR / "home.yaml"
    asr: str = "whisper"
    asr_hint: bool = True  # give Whisper the YAML's device and action names as its prompt
    vad: VADConfig = field(default_factory=VADConfig)
    history_tokens: int = 600
    max_tokens: int = 48
    asr_workers: int = 1
    asr_threads: int = 1
    engine_threads: int = 0  # 0: the cores left after ASR
    server_retry_s: float = 60.0  # --server: how long a service that is down or loading is retried

    def __post_init__(self) -> None:
        for name in ("asr_workers", "asr_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"cpu.{name} must be >= 1, got {getattr(self, name)}")
        if self.engine_threads < 0:
            raise ConfigError(f"cpu.engine_threads must be >= 0, got {self.engine_threads}")
        if self.max_tokens < 1 or self.history_tokens < 0:
            raise ConfigError("max_tokens must be >= 1 and history_tokens >= 0")
        if not 0 <= self.server_retry_s < float("inf"):  # NaN fails the comparison too
            raise ConfigError(f"server_retry_s must be a number of seconds >= 0, got "
                              f"{self.server_retry_s!r}")

    def resolved_engine_threads(self) -> int:
        if self.engine_threads:
            return self.engine_threads
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, (cores or 1) - self.asr_workers * self.asr_threads)


def load_voice_config(path: Path | None = None) -> VoiceConfig:
    path = path or DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"{path}: voice config not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings")
    data = dict(data)
    vad = data.pop("vad", None) or {}
    cpu = data.pop("cpu", None) or {}
    known = {f.name for f in fields(VoiceConfig)} - {"vad"}
    unknown = sorted(set(data) - known) + sorted(f"cpu.{k}" for k in set(cpu) - known)
    vad_known = {f.name for f in fields(VADConfig)}
    unknown += sorted(f"vad.{k}" for k in set(vad) - vad_known)
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    if "system_prompt" in data:
        sp = Path(str(data["system_prompt"])).expanduser()
        data["system_prompt"] = sp if sp.is_absolute() else path.parent / sp
    return VoiceConfig(vad=VADConfig(**vad), **data, **cpu)
