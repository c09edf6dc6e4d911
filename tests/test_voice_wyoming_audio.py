"""voice/wyoming_audio.py: Wyoming PCM of any accepted width, channel count and rate -> 16 kHz mono
frames, equal to converting the whole signal at once (voice/wav_file.py's to_16k_mono), however
the stream is chunked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_runtime.voice.audio_input import FRAME_SAMPLES
from edge_runtime.voice.wav_file import to_16k_mono
from edge_runtime.voice.wyoming_audio import AudioConverter, AudioFormatError, pcm_to_float


def _ints(rng, width: int, n: int) -> np.ndarray:
    hi = 2 ** (8 * width - 1)
    return rng.integers(-hi, hi, n, dtype=np.int64)


def _pack(ints: np.ndarray, width: int) -> bytes:
    """Little-endian signed PCM, byte by byte (the reference for every width, 24-bit included)."""
    unsigned = ints.astype(np.int64) % (2 ** (8 * width))
    return b"".join(int(v).to_bytes(width, "little") for v in unsigned)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_pcm_to_float_reads_every_width(width, channels):
    rng = np.random.default_rng(width * 10 + channels)
    ints = _ints(rng, width, 97 * channels)
    got = pcm_to_float(_pack(ints, width), width, channels)
    want = (ints / 2 ** (8 * width - 1)).reshape(-1, channels)
    np.testing.assert_allclose(got, want, atol=1e-7)


@settings(max_examples=25, deadline=None)
@given(rate=st.sampled_from([8000, 16000, 22050, 44100, 48000]),
       channels=st.integers(1, 3), cuts=st.lists(st.integers(1, 3000), max_size=8),
       seed=st.integers(0, 2**16))
def test_chunked_stream_equals_the_whole_signal(rate, channels, cuts, seed):
    rng = np.random.default_rng(seed)
    ints = _ints(rng, 2, rate // 2 * channels) // 8
    pcm = _pack(ints, 2)
    fmt = {"rate": rate, "width": 2, "channels": channels}
    conv = AudioConverter(rate, 2, channels)
    frames, pos = [], 0
    frame_bytes = 2 * channels
    for cut in cuts:
        step = cut * frame_bytes
        frames += conv.push(fmt, pcm[pos : pos + step])
        pos += step
    frames += conv.push(fmt, pcm[pos:])
    frames += conv.flush()
    assert all(len(f) == FRAME_SAMPLES for f in frames)
    got = np.concatenate(frames)
    want = to_16k_mono(pcm_to_float(pcm, 2, channels), rate)
    np.testing.assert_allclose(got[: len(want)], want, atol=1e-5)
    assert not got[len(want):].any() and len(got) - len(want) < FRAME_SAMPLES  # zero padding


def test_a_chunk_in_another_format_than_its_start_is_refused():
    conv = AudioConverter(16000, 2, 1)
    with pytest.raises(AudioFormatError, match="differs from its audio-start"):
        conv.push({"rate": 48000, "width": 2, "channels": 1}, b"\0\0")
