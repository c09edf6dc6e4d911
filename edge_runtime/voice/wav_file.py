"""Reading a WAV file into the voice loop's one format: float32 at 16 kHz mono.

Invariants:
- any rate in MIN_RATE..MAX_RATE and any channel count is downmixed (mean of channels) and
  resampled here; a rate outside it is refused (a damaged header, not audio);
- every problem with a file is an `InputError` whose message names the file and the problem;
- a file whose data chunk declares more than it holds is read as far as it goes, and
  `wav_truncation` says so (soundfile returns what is there without a word).
"""

from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np

from edge_runtime.errors import InputError
from edge_runtime.voice.resample import downmix, resample

SAMPLE_RATE = 16000
MIN_RATE, MAX_RATE = 4000, 384000  # Hz: telephone-band to the fastest audio interfaces


def to_16k_mono(samples: np.ndarray, rate: int) -> np.ndarray:
    return resample(downmix(samples), rate, SAMPLE_RATE)


def check_rate(rate: int, what: object) -> None:
    """A rate outside MIN_RATE..MAX_RATE is a broken header or a typo, not audio: refuse it
    before it turns a small file into hours of samples (or into none)."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise InputError(f"{what}: sample rate {rate} Hz is outside {MIN_RATE:,}-{MAX_RATE:,} Hz "
                         "(a damaged header, or a wrong rate= option)")


def read_wav(path: Path) -> np.ndarray:
    """A WAV file -> float32 [n] at 16 kHz mono. Raises InputError naming the file."""
    if not path.exists():
        raise InputError(f"{path}: file not found")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a WAV file (use folder:{path})")
    try:
        samples, rate = _decode(path)
    except InputError:
        raise
    except Exception as exc:  # libsndfile / wave errors: a corrupt or unsupported file
        raise InputError(f"{path}: not a readable WAV file ({exc})") from exc
    if samples.shape[0] == 0:
        raise InputError(f"{path}: contains no audio samples (empty recording)")
    if not np.all(np.isfinite(samples)):
        raise InputError(f"{path}: contains NaN or infinite samples")
    check_rate(rate, path)
    try:
        return to_16k_mono(samples, rate)
    except MemoryError as exc:
        raise InputError(f"{path}: too long to convert in memory ({samples.shape[0] / rate:.0f} s "
                         f"at {rate} Hz); split it into shorter files") from exc


def wav_truncation(path: Path, held_s: float) -> str | None:
    """A problem line when the WAV's data chunk declares more bytes than the file holds (a copy
    or recording cut short); None otherwise. Readers silently return what is there."""
    found = _data_chunk(path)
    if found is None:
        return None
    offset, declared = found
    held_bytes = path.stat().st_size - offset
    if declared in (0, 0xFFFFFFFF) or held_bytes >= declared or held_bytes <= 0:
        return None  # 0 / 0xFFFFFFFF: a streaming writer's "size unknown"
    return (f"{path}: truncated: header declares {held_s * declared / held_bytes:.2f} s, file "
            f"holds {held_s:.2f} s (the audio there was processed; a command cut off at the end "
            "was not sent)")


def _data_chunk(path: Path) -> tuple[int, int] | None:
    """(offset, declared size) of a RIFF/WAVE file's data chunk, or None."""
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        while len(chunk := f.read(8)) == 8:
            size = int.from_bytes(chunk[4:], "little")
            if chunk[:4] == b"data":
                return f.tell(), size
            f.seek(size + (size & 1), os.SEEK_CUR)
    return None


def _decode(path: Path) -> tuple[np.ndarray, int]:
    try:
        import soundfile
    except ImportError:  # stdlib fallback: 16-bit PCM only
        return _decode_stdlib(path)
    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    return samples, int(rate)


def _decode_stdlib(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise InputError(f"{path}: only 16-bit PCM WAV is supported without soundfile")
        raw = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        samples = raw.reshape(-1, w.getnchannels()).astype(np.float32) / 32768.0
        return samples, w.getframerate()
