"""A Wyoming audio stream (`audio-start`, `audio-chunk`s) -> 16 kHz mono float32 frames.

Wyoming audio is raw little-endian PCM described by each event's `rate`, `width` (bytes per
sample) and `channels`. Converted: widths 1-4 (signed, as the `wyoming` package's own converter
reads them), 1-8 channels (mean of the channels), any rate the WAV reader accepts (4,000-384,000
Hz, voice/resample.py's chunked resampler, so a stream converts exactly like the whole signal).
Anything else is `AudioFormatError` with a sentence that says what to send instead.

Invariant: `push()` hands out whole `FRAME_SAMPLES` frames only; the partial frame is kept for the
next chunk, and `flush()` pads it with zeros (like the WAV inputs' last frame).
"""

from __future__ import annotations

import numpy as np

from edge_runtime.voice.audio_input import FRAME_SAMPLES
from edge_runtime.voice.resample import StreamResampler, downmix
from edge_runtime.voice.wav_file import MAX_RATE, MIN_RATE, SAMPLE_RATE

WIDTHS = (1, 2, 3, 4)
MAX_CHANNELS = 8
SEND_THIS = "send 16-bit (width 2) mono audio at 16000 Hz"


class AudioFormatError(Exception):
    """Audio this server cannot convert; the message names the field and what to send."""


def check_format(data: dict) -> tuple[int, int, int]:
    """An audio event's data -> (rate, width, channels), or AudioFormatError."""
    values = []
    for key in ("rate", "width", "channels"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise AudioFormatError(f"audio {key} must be a whole number, got {value!r}; "
                                   f"{SEND_THIS}")
        values.append(value)
    rate, width, channels = values
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioFormatError(f"audio rate {rate} Hz is outside {MIN_RATE:,}-{MAX_RATE:,} Hz; "
                               f"{SEND_THIS}")
    if width not in WIDTHS:
        raise AudioFormatError(f"audio width {width} bytes per sample is not one of "
                               f"{', '.join(map(str, WIDTHS))}; {SEND_THIS}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioFormatError(f"audio with {channels} channels: 1-{MAX_CHANNELS} are converted; "
                               f"{SEND_THIS}")
    return rate, width, channels


def pcm_to_float(pcm: bytes, width: int, channels: int) -> np.ndarray:
    """Little-endian signed PCM -> float32 [n, channels] in [-1, 1)."""
    frame_bytes = width * channels
    if len(pcm) % frame_bytes:
        raise AudioFormatError(f"an audio chunk of {len(pcm)} bytes is not a whole number of "
                               f"{width}-byte x {channels}-channel samples")
    if width == 3:  # no 24-bit dtype: place each sample in the top 3 bytes of an int32
        raw = np.frombuffer(pcm, np.uint8).reshape(-1, 3)
        wide = np.zeros((len(raw), 4), np.uint8)
        wide[:, 1:] = raw
        ints = wide.view("<i4").reshape(-1)
        scale = 2.0 ** 31
    else:
        ints = np.frombuffer(pcm, {1: "i1", 2: "<i2", 4: "<i4"}[width])
        scale = 2.0 ** (8 * width - 1)
    return (ints.astype(np.float64) / scale).astype(np.float32).reshape(-1, channels)


class AudioConverter:
    """One audio stream's chunks -> 16 kHz mono frames of FRAME_SAMPLES."""

    def __init__(self, rate: int, width: int, channels: int):
        self.format = (rate, width, channels)
        self.resampler = StreamResampler(rate, SAMPLE_RATE)
        self._rest = np.zeros(0, np.float32)
        self.seconds = 0.0  # audio received, at its own rate

    def push(self, data: dict, pcm: bytes) -> list[np.ndarray]:
        fmt = check_format(data)
        if fmt != self.format:
            raise AudioFormatError(f"an audio chunk's format (rate {fmt[0]}, width {fmt[1]}, "
                                   f"channels {fmt[2]}) differs from its audio-start's (rate "
                                   f"{self.format[0]}, width {self.format[1]}, channels "
                                   f"{self.format[2]}); start a new stream with audio-start")
        samples = pcm_to_float(pcm, fmt[1], fmt[2])
        self.seconds += len(samples) / fmt[0]
        return self._frames(self.resampler.push(downmix(samples)))

    def flush(self) -> list[np.ndarray]:
        frames = self._frames(self.resampler.flush())
        if len(self._rest):
            frames.append(np.pad(self._rest, (0, FRAME_SAMPLES - len(self._rest))))
            self._rest = np.zeros(0, np.float32)
        return frames

    def _frames(self, audio: np.ndarray) -> list[np.ndarray]:
        audio = np.concatenate([self._rest, audio]) if len(self._rest) else audio
        whole = len(audio) // FRAME_SAMPLES * FRAME_SAMPLES
        self._rest = audio[whole:].copy()
        return [audio[i : i + FRAME_SAMPLES] for i in range(0, whole, FRAME_SAMPLES)]
