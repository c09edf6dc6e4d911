"""What every connection of the Wyoming server shares (the loop, the ASR pool, the settings, the
`info`), and `RequestError`, a request the server refuses (an `error` event; the connection goes
on)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from wyoming.info import Info

from edge_runtime.voice.asr import ASRPool
from edge_runtime.voice.loop import VoiceLoop
from edge_runtime.voice.vad import VADConfig
from edge_runtime.voice.wyoming_config import WyomingConfig
from edge_runtime.voice.wyoming_conversations import Conversations


class RequestError(Exception):
    """A request this server cannot serve: `str()` says what to send instead; `code` is the
    `error` event's code."""

    def __init__(self, text: str, code: str):
        super().__init__(text)
        self.code = code


@dataclass
class WyomingShared:
    voice: VoiceLoop  # prompts, the engine, the actions: shared by every connection
    asr_pool: ASRPool | None  # None: no recognizer loaded (audio requests are refused)
    config: WyomingConfig
    vad: VADConfig
    info: Info
    conversations: Conversations  # Home Assistant's conversations, across connections
    on_turn: Callable[[dict], None] = field(default=lambda event: None)  # a spoken turn done
    on_fault: Callable[[int, str], None] = field(default=lambda stream, problem: None)
