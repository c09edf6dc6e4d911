"""edge_runtime/voice/tts.py: espeak-ng into WAV files and 16 kHz arrays, WAV writing, and the
audio-device path's error when there is no device."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.voice.wav_file import read_wav
from edge_runtime.voice.tts import speak_to_device, speak_to_wav, synthesize, write_wav
from voice_helpers import needs_espeak


@needs_espeak
def test_speak_to_wav_creates_folder_and_file(tmp_path):
    out = tmp_path / "new" / "answer.wav"
    asyncio.run(speak_to_wav("the lights are on", out))
    audio = read_wav(out)
    assert 0.5 < len(audio) / 16000 < 5 and np.abs(audio).max() > 0.05


@needs_espeak
def test_synthesize_is_16k_speech_and_deterministic():
    a, b = synthesize("open the garage door"), synthesize("open the garage door")
    assert a.dtype == np.float32 and 0.8 < len(a) / 16000 < 4
    np.testing.assert_array_equal(a, b)
    assert len(synthesize("open the garage door", speed=100)) > len(a)  # slower speech


def test_write_wav_round_trip(tmp_path):
    x = np.random.default_rng(0).uniform(-0.9, 0.9, 4000).astype(np.float32)
    write_wav(tmp_path / "x.wav", x)
    np.testing.assert_allclose(read_wav(tmp_path / "x.wav"), x, atol=1e-4)  # 16-bit


@needs_espeak
def test_no_audio_device_is_a_clear_error():
    if Path("/dev/snd").exists():
        pytest.skip("this machine has a sound device, so the no-device error cannot be shown")
    with pytest.raises(ConfigError, match="cannot play on the audio device"):
        asyncio.run(speak_to_device("hello"))


def test_unwritable_answer_folder_is_a_tts_error_and_the_answer_stands(tmp_path):
    from edge_runtime.voice.loop import LoopSettings, VoiceLoop

    (tmp_path / "file.wav").write_bytes(b"RIFF")
    out = tmp_path / "file.wav" / "ans" / "a.wav"
    with pytest.raises(ConfigError, match=r"cannot write spoken answers to .*file\.wav/ans"):
        asyncio.run(speak_to_wav("hello", out))
    loop = VoiceLoop(None, None, None, "system", LoopSettings(tts_dir=out.parent))
    event = {"answer": "hello"}
    asyncio.run(loop._speak(0, 0, "hello", event))
    assert "cannot write spoken answers" in event["tts_error"] and "tts_wav" not in event
