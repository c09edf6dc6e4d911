"""The spoken smart-home command set: commands to two homes with the call each one should become,
synthesized with espeak-ng into one 16 kHz mono WAV per command at first use (a cache folder, never
committed), for tools/voice_command_bench.py: word error rate with and without the recognizer's
vocabulary bias, and which calls the model makes of what was heard.

`home` is the demo's home (configs/voice/home-actions.yaml; its commands are the demo's 20);
`flat` (configs/voice/flat-actions.yaml) has none of the demo's devices. A command naming a device
its home lacks expects `ask_back` with any question (`arguments` None).

Invariants (tests/test_voice_command_set.py): every expected call is valid for its home's schema;
no command is one of its home's few-shot examples; the cache key covers texts, voices, speed and
the espeak-ng version, so any change re-synthesizes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edge_runtime.paths import cache_dir
from edge_runtime.voice.config import CONFIG_DIR
from edge_runtime.voice.tts import cached_wav, espeak_version, synthesize
from edge_runtime.voice.wav_file import SAMPLE_RATE

HOMES = {"home": CONFIG_DIR / "home-actions.yaml", "flat": CONFIG_DIR / "flat-actions.yaml"}
VOICES = ("en-us", "en", "en-us+m3", "en+f3", "en-us+m7")  # one per demo stream; commands take them in turn
SPEED = 150  # espeak-ng words per minute
PAD_S = 0.3  # silence before and after the command


@dataclass(frozen=True)
class SpokenCommand:
    text: str
    home: str  # a key of HOMES
    name: str  # the function it should call
    arguments: dict | None  # None: any arguments are right (ask_back's question)


def _c(text, home, name, arguments=None):
    return SpokenCommand(text, home, name, arguments)


def _d(device):
    return {"device": device}


# The demo's 20 commands (voice/demo.py speaks them as 5 streams of 4, in this order), to its home
DEMO_HOME_COMMANDS = (
    _c("turn on the kitchen lights", "home", "turn_on", _d("kitchen lights")),
    _c("dim the kitchen lights", "home", "dim", _d("kitchen lights")),
    _c("play the radio", "home", "play", _d("radio")),
    _c("turn off the kitchen lights", "home", "turn_off", _d("kitchen lights")),
    _c("set the thermostat to twenty one degrees", "home", "set_temperature", {"degrees": 21}),
    _c("what is the temperature in the hall", "home", "get_temperature", {}),
    _c("turn the volume up", "home", "turn_up", _d("radio")),
    _c("close the blinds", "home", "close", _d("blinds")),
    _c("lock the front door", "home", "lock", _d("front door")),
    _c("is the front door locked", "home", "is_locked", _d("front door")),
    _c("open the garage door", "home", "open", _d("garage door")),
    _c("turn on the bedroom lights", "home", "turn_on", _d("bedroom lights")),
    _c("turn on the living room lights", "home", "turn_on", _d("living room lights")),
    _c("open the blinds", "home", "open", _d("blinds")),
    _c("stop the radio", "home", "stop", _d("radio")),
    _c("turn off the bedroom lights", "home", "turn_off", _d("bedroom lights")),
    _c("close the garage door", "home", "close", _d("garage door")),
    _c("unlock the front door", "home", "unlock", _d("front door")),
    _c("turn off the living room lights", "home", "turn_off", _d("living room lights")),
    _c("set the thermostat to eighteen degrees", "home", "set_temperature", {"degrees": 18}),
)

COMMANDS = DEMO_HOME_COMMANDS + (
    # a device the demo's home lacks
    _c("turn on the porch fountain", "home", "ask_back"),
    # the second home: devices the demo does not have
    _c("turn on the hallway lights", "flat", "turn_on", _d("hallway lights")),
    _c("turn off the porch light", "flat", "turn_off", _d("porch light")),
    _c("switch on the office lamp", "flat", "turn_on", _d("office lamp")),
    _c("switch off the ceiling fan", "flat", "turn_off", _d("ceiling fan")),
    _c("turn on the coffee machine", "flat", "turn_on", _d("coffee machine")),
    _c("turn off the coffee machine", "flat", "turn_off", _d("coffee machine")),
    _c("turn on the ceiling fan", "flat", "turn_on", _d("ceiling fan")),
    _c("turn on the sprinklers", "flat", "turn_on", _d("sprinklers")),
    _c("turn off the sprinklers", "flat", "turn_off", _d("sprinklers")),
    _c("dim the office lamp to forty percent", "flat", "dim",
       {"device": "office lamp", "percent": 40}),
    _c("dim the hallway lights", "flat", "dim", _d("hallway lights")),
    _c("set the heating to twenty two degrees", "flat", "set_temperature", {"degrees": 22}),
    _c("set the heating to nineteen degrees", "flat", "set_temperature", {"degrees": 19}),
    _c("how warm is it in the office", "flat", "get_temperature", {}),
    _c("lock the back door", "flat", "lock", _d("back door")),
    _c("unlock the back door", "flat", "unlock", _d("back door")),
    _c("is the back door locked", "flat", "is_locked", _d("back door")),
    _c("open the garden gate", "flat", "open", _d("garden gate")),
    _c("close the garden gate", "flat", "close", _d("garden gate")),
    _c("open the curtains", "flat", "open", _d("curtains")),
    _c("close the curtains", "flat", "close", _d("curtains")),
    _c("play the stereo", "flat", "play", _d("stereo")),
    _c("stop the stereo", "flat", "stop", _d("stereo")),
    _c("turn the stereo up", "flat", "turn_up", _d("stereo")),
    _c("turn the stereo down", "flat", "turn_down", _d("stereo")),
    _c("start the dishwasher", "flat", "ask_back"),
)


def cache_root() -> Path:
    return cache_dir("voice-commands")


def voice_of(index: int) -> str:
    return VOICES[index % len(VOICES)]


def build_command_wavs(commands=COMMANDS, folder: Path | None = None,
                       progress: Callable[[str], None] | None = None) -> list[Path]:
    """Synthesize (or reuse) one WAV per command, spoken by the voices in turn -> the paths."""
    plan = [(c.text, voice_of(i)) for i, c in enumerate(commands)]
    key = hashlib.sha256(json.dumps([plan, SPEED, PAD_S, espeak_version(), "sox -D"])
                         .encode()).hexdigest()[:12]
    folder = (folder or cache_root()) / key
    pad = np.zeros(int(PAD_S * SAMPLE_RATE), np.float32)
    paths = []
    for i, (text, voice) in enumerate(plan):
        wav = folder / f"command{i:02d}.wav"
        say = f"synthesizing command {i + 1}/{len(plan)} ({voice}): {text}"
        cached_wav(wav, lambda: np.concatenate([pad, synthesize(text, voice, SPEED), pad]),
                   on_build=(lambda: progress(say)) if progress else None)
        paths.append(wav)
    return paths

