"""WAV files -> float32 16 kHz mono (edge_runtime/voice/wav_file.py): conversion, and every bad file an
InputError naming the file."""

from __future__ import annotations

import os

import numpy as np
import pytest

from edge_runtime.errors import InputError
from edge_runtime.voice.tts import write_wav
from edge_runtime.voice.wav_file import read_wav
from voice_helpers import random_tones


def test_read_wav_converts_8k_stereo(tmp_path):
    rng = np.random.default_rng(3)
    left, at = random_tones(rng, 8000, 0.6, max_hz=3000)
    right = (0.5 * left).astype(np.float32)
    path = tmp_path / "st.wav"
    write_wav(path, np.stack([left, right], axis=1), rate=8000, channels=2)
    y = read_wav(path)
    ref = 0.75 * at(np.arange(len(y)) / 16000)
    assert len(y) == 2 * len(left)
    assert np.abs(y[320:-320] - ref[320:-320]).max() < 2e-3  # + 16-bit quantisation


def test_read_wav_errors_name_file_and_problem(tmp_path):
    missing = tmp_path / "nope.wav"
    with pytest.raises(InputError, match=r"nope\.wav: file not found"):
        read_wav(missing)
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt " + os.urandom(64))
    with pytest.raises(InputError, match=r"corrupt\.wav: not a readable WAV file"):
        read_wav(corrupt)
    empty = tmp_path / "empty.wav"
    write_wav(empty, np.zeros(0, np.float32))
    with pytest.raises(InputError, match=r"empty\.wav: contains no audio samples"):
        read_wav(empty)
    with pytest.raises(InputError, match="is a directory"):
        read_wav(tmp_path)


@pytest.mark.parametrize("rate", [1, 3999, 384001, 99_999_989, 2_000_000_000])
def test_wav_header_rate_outside_the_audio_range_is_an_error(tmp_path, rate):
    path = tmp_path / "r.wav"
    write_wav(path, np.random.default_rng(0).uniform(-0.5, 0.5, 2000).astype(np.float32))
    data = bytearray(path.read_bytes())
    data[24:28] = rate.to_bytes(4, "little")  # the fmt chunk's sample rate
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"r\.wav: sample rate {rate} Hz is outside 4,000-384,000"):
        read_wav(path)
