"""The demo's (and the end-to-end test's) spoken commands: 5 streams x a few turns, each stream a
different espeak-ng voice, synthesized once into a cache folder as one 16 kHz mono WAV per stream
(commands separated by silence, so the VAD has to cut them) plus `commands.json` (the references
for the word error rate). The texts, voices and speed are voice/command_set.py's, where each demo
command also has the call it should become.

The cache key covers the commands, voices, speed, gaps and the espeak-ng version, so a change
re-synthesizes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import numpy as np

from edge_runtime.voice.command_set import DEMO_HOME_COMMANDS, SPEED, VOICES
from edge_runtime.voice.wav_file import SAMPLE_RATE
from edge_runtime.voice.tts import cached_wav, espeak_version, synthesize
from edge_runtime.paths import cache_dir

TURNS_PER_STREAM = 4
# the command set's demo commands (with the call each should become), cut into the streams' turns
DEMO_COMMANDS = tuple(tuple(c.text for c in DEMO_HOME_COMMANDS[i:i + TURNS_PER_STREAM])
                      for i in range(0, len(DEMO_HOME_COMMANDS), TURNS_PER_STREAM))
LEAD_S, GAP_S, TAIL_S = 0.5, 1.5, 1.0


def cache_root() -> Path:
    return cache_dir("voice-demo")


def stream_audio(commands: tuple[str, ...] | list[str], voice: str) -> np.ndarray:
    """The commands spoken by `voice`, with silence around them: float32 [n] at 16 kHz."""
    parts = [np.zeros(int(LEAD_S * SAMPLE_RATE), np.float32)]
    for i, text in enumerate(commands):
        parts.append(synthesize(text, voice, SPEED))
        gap = TAIL_S if i == len(commands) - 1 else GAP_S
        parts.append(np.zeros(int(gap * SAMPLE_RATE), np.float32))
    return np.concatenate(parts)


def build_demo_inputs(streams: int = 5, turns: int = TURNS_PER_STREAM, folder: Path | None = None,
                      progress: Callable[[str], None] | None = None) -> list[tuple[Path, list[str]]]:
    """Synthesize (or reuse) one WAV per stream -> [(wav path, reference commands)]."""
    assert 1 <= streams <= len(DEMO_COMMANDS), streams
    assert 1 <= turns <= len(DEMO_COMMANDS[0]), turns
    plan = [(list(DEMO_COMMANDS[i][:turns]), VOICES[i]) for i in range(streams)]
    key = hashlib.sha256(json.dumps([plan, SPEED, LEAD_S, GAP_S, TAIL_S, espeak_version(),
                                     "sox -D"])
                         .encode()).hexdigest()[:12]
    folder = (folder or cache_root()) / key
    out = []
    for i, (commands, voice) in enumerate(plan):
        wav = folder / f"stream{i}.wav"
        say = f"synthesizing stream {i} ({voice}): {len(commands)} commands"
        cached_wav(wav, lambda: stream_audio(commands, voice),
                   on_build=(lambda: progress(say)) if progress else None)
        out.append((wav, commands))
    (folder / "commands.json").write_text(json.dumps(
        [{"wav": str(w), "voice": v, "commands": c} for (w, c), (_, v) in zip(out, plan)],
        indent=1))
    return out
