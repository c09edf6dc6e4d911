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
from edge_runtime.voice import setting_checks as check
from edge_runtime.voice.vad import VADConfig
from edge_runtime.voice.wyoming_config import WyomingConfig

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "voice"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
CPU_KEYS = ("asr_workers", "asr_threads", "engine_threads")
MAX_THREADS = 1024  # more is a typo, not a machine
MAX_RETRY_S = 86400.0


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
    # the local engine appends the tokens a call's grammar forces without a model step each
    # (EngineConfig.jump_forward and forced_text_drafts, docs/constrained.md); false: one each
    jump_forward: bool = True
    wyoming: WyomingConfig = field(default_factory=WyomingConfig)  # the Wyoming server (--wyoming)

    def __post_init__(self) -> None:
        if not isinstance(self.system_prompt, Path):
            raise ConfigError(f"system_prompt must be the path of a YAML file, got "
                              f"{self.system_prompt!r}")
        check.text("asr", self.asr)
        check.flag("asr_hint", self.asr_hint)
        check.flag("jump_forward", self.jump_forward)
        assert isinstance(self.vad, VADConfig), self.vad
        assert isinstance(self.wyoming, WyomingConfig), self.wyoming
        check.count("history_tokens", self.history_tokens, 0)
        check.count("max_tokens", self.max_tokens, 1)
        for name, lo in (("asr_workers", 1), ("asr_threads", 1), ("engine_threads", 0)):
            check.count(f"cpu.{name}", getattr(self, name), lo, MAX_THREADS)
        check.number("server_retry_s", self.server_retry_s, 0, MAX_RETRY_S)

    def resolved_engine_threads(self) -> int:
        if self.engine_threads:
            return self.engine_threads
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, (cores or 1) - self.asr_workers * self.asr_threads)


def load_voice_config(path: Path | None = None) -> VoiceConfig:
    """The YAML at `path` (default.yaml) -> VoiceConfig; every key's type and range is checked
    here, before any model loads, and a bad one is one line naming the file and the key."""
    path = path or DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"{path}: voice config not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    try:
        return _from_mapping(data, path.parent)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _from_mapping(data: object, folder: Path) -> VoiceConfig:
    data = dict(_mapping("the voice config", data))
    vad = _mapping("vad", data.pop("vad", None) or {})
    cpu = _mapping("cpu", data.pop("cpu", None) or {})
    wyoming = _mapping("wyoming", data.pop("wyoming", None) or {})
    known = {f.name for f in fields(VoiceConfig)} - {"vad", "wyoming"}
    unknown = (sorted(str(k) for k in set(data) - known)
               + sorted(f"cpu.{k}" for k in set(cpu) - set(CPU_KEYS))
               + sorted(f"vad.{k}" for k in set(vad) - {f.name for f in fields(VADConfig)})
               + sorted(f"wyoming.{k}" for k in set(wyoming)
                        - {f.name for f in fields(WyomingConfig)}))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}")
    if "system_prompt" in data:
        check.text("system_prompt", data["system_prompt"], "the path of a YAML file")
        sp = Path(data["system_prompt"]).expanduser()
        data["system_prompt"] = sp if sp.is_absolute() else folder / sp
    return VoiceConfig(vad=VADConfig(**vad), wyoming=WyomingConfig(**wyoming), **data, **cpu)


def _mapping(key: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping of settings (key: value lines), got "
                          f"{value!r}")
    return value
