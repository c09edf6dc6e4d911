"""Audio and text inputs of the voice loop: one `Source` per stream.

An input SPEC is `[kind:]path` with kind one of `wav`, `folder`, `pcm`, `text`; without a kind it
is inferred (a directory is a folder of WAVs, `.txt` is text, a FIFO / `-` / `.raw` / `.pcm` is a
raw pipe, anything else a WAV file).

Invariants:
- every audio frame handed out is float32 `[FRAME_SAMPLES]` at 16 kHz mono in [-1, 1]
  (the last frame of a recording is zero-padded);
- WAV files of any rate / channel count are downmixed (mean of channels) and resampled here,
  so nothing downstream ever sees another format;
- a raw pipe is S16_LE 16 kHz mono (what `arecord -f S16_LE -r 16000 -c 1` writes);
- every problem with an input is an `InputError` whose message names the file and the problem.
"""

from __future__ import annotations

import math
import os
import stat
import time
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from edge_runtime.errors import InputError

SAMPLE_RATE = 16000
FRAME_SAMPLES = 512  # 32 ms: the window silero-vad takes at 16 kHz
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
KINDS = ("wav", "folder", "pcm", "text")


@dataclass(frozen=True)
class InputSpec:
    kind: str  # one of KINDS
    path: Path


def parse_input_spec(spec: str) -> InputSpec:
    """`[kind:]path` -> InputSpec; the kind is inferred from the path when absent."""
    kind, sep, rest = spec.partition(":")
    if sep and kind in KINDS:
        return InputSpec(kind, Path(rest))
    path = Path(spec)
    if spec == "-" or path.suffix.lower() in (".raw", ".pcm", ".s16"):
        return InputSpec("pcm", path)
    if path.is_dir():
        return InputSpec("folder", path)
    if path.suffix.lower() == ".txt":
        return InputSpec("text", path)
    if path.exists() and stat.S_ISFIFO(path.stat().st_mode):
        return InputSpec("pcm", path)
    return InputSpec("wav", path)


# ----------------------------------------------------------------------------- conversion


def downmix(samples: np.ndarray) -> np.ndarray:
    """[n] or [n, channels] -> float32 [n] (mean of the channels)."""
    if samples.ndim == 1:
        return samples.astype(np.float32, copy=False)
    assert samples.ndim == 2, samples.shape
    return samples.mean(axis=1, dtype=np.float64).astype(np.float32)


def _phase_filters(up: int, down: int, half_taps: int) -> tuple[np.ndarray, float, int]:
    """Windowed-sinc low-pass, one row per output phase: [up, 2 * half + 1]."""
    cutoff = min(1.0, up / down)  # fraction of the input Nyquist kept
    half = int(math.ceil(half_taps / cutoff))
    j = np.arange(-half, half + 1, dtype=np.float64)  # tap offsets around the base sample
    phase = np.arange(up, dtype=np.float64)[:, None] / up
    u = phase - j[None, :]  # distance (input samples) from the output instant to the tap
    window = np.where(np.abs(u) <= half + 1, 0.5 + 0.5 * np.cos(np.pi * u / (half + 1)), 0.0)
    return cutoff * np.sinc(cutoff * u) * window, cutoff, half


def resample(x: np.ndarray, src_rate: int, dst_rate: int, half_taps: int = 16) -> np.ndarray:
    """Band-limited polyphase resampling of float32 [n] from src_rate to dst_rate (Hann-windowed
    sinc, `half_taps` zero crossings each side). Output length is floor(n * dst / src)."""
    assert src_rate > 0 and dst_rate > 0, (src_rate, dst_rate)
    if src_rate == dst_rate or len(x) == 0:
        return x.astype(np.float32, copy=False)
    g = math.gcd(src_rate, dst_rate)
    up, down = dst_rate // g, src_rate // g
    filters, _, half = _phase_filters(up, down, half_taps)  # [up, K]
    padded = np.concatenate([np.zeros(half), x.astype(np.float64), np.zeros(half + 1)])
    out_len = (len(x) * up) // down
    out = np.empty(out_len, dtype=np.float32)
    taps = np.arange(2 * half + 1)
    for start in range(0, out_len, 8192):  # blocks bound the [block, K] gather
        n = np.arange(start, min(out_len, start + 8192), dtype=np.int64)
        base, phase = np.divmod(n * down, up)
        window = padded[base[:, None] + taps[None, :]]  # [block, K]; base+half is x[base]
        out[start : start + len(n)] = np.einsum("bk,bk->b", window, filters[phase])
    return out


def to_16k_mono(samples: np.ndarray, rate: int) -> np.ndarray:
    return resample(downmix(samples), rate, SAMPLE_RATE)


# ----------------------------------------------------------------------------- reading


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
    return to_16k_mono(samples, rate)


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


def frames_of(audio: np.ndarray) -> Iterator[np.ndarray]:
    """float32 [n] -> frames [FRAME_SAMPLES], the last one zero-padded."""
    for start in range(0, len(audio), FRAME_SAMPLES):
        frame = audio[start : start + FRAME_SAMPLES]
        if len(frame) < FRAME_SAMPLES:
            frame = np.pad(frame, (0, FRAME_SAMPLES - len(frame)))
        yield frame


@dataclass
class Recording:
    """One continuous piece of audio (a WAV file, or the whole pipe) or of text."""

    path: Path
    kind: str  # "audio" | "text"
    _frames: Iterator[np.ndarray] | None = None
    lines: list[str] | None = None

    def frames(self) -> Iterator[np.ndarray]:
        assert self._frames is not None, "text recordings have no frames"
        return self._frames


class Source:
    """The input of one stream: yields Recordings; errors surface as InputError when reached.

    `recordings()` yields either a Recording or an InputError (for one file of a folder), so a bad
    file in a folder is reported and the next file is read."""

    def __init__(self, spec: InputSpec):
        self.spec = spec

    @property
    def name(self) -> str:
        return str(self.spec.path)

    def recordings(self) -> Iterator[Recording | InputError]:
        kind, path = self.spec.kind, self.spec.path
        if kind == "wav":
            yield Recording(path, "audio", frames_of(read_wav(path)))
        elif kind == "folder":
            yield from self._folder(path)
        elif kind == "pcm":
            yield Recording(path, "audio", pcm_frames(path))
        else:
            yield Recording(path, "text", lines=read_text_commands(path))

    def _folder(self, path: Path) -> Iterator[Recording | InputError]:
        if not path.is_dir():
            raise InputError(f"{path}: folder not found")
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".wav")
        if not files:
            raise InputError(f"{path}: folder contains no .wav files")
        for wav_path in files:
            try:
                yield Recording(wav_path, "audio", frames_of(read_wav(wav_path)))
            except InputError as exc:
                yield exc


def read_text_commands(path: Path) -> list[str]:
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable UTF-8 text file ({exc})") from exc
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise InputError(f"{path}: contains no commands (expected one per line)")
    return lines


def pcm_frames(path: Path) -> Iterator[np.ndarray]:
    """S16_LE 16 kHz mono from a pipe/FIFO/file (or stdin for `-`), frame by frame, until EOF."""
    if str(path) != "-" and not path.exists():
        raise InputError(f"{path}: pipe or file not found")
    try:
        stream = os.fdopen(os.dup(0), "rb") if str(path) == "-" else open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror})") from exc
    frame_bytes = FRAME_SAMPLES * 2
    with stream:
        pending = b""
        while True:
            chunk = stream.read(frame_bytes - len(pending))
            if not chunk:
                break
            pending += chunk
            if len(pending) == frame_bytes:
                yield np.frombuffer(pending, dtype="<i2").astype(np.float32) / 32768.0
                pending = b""
        if len(pending) % 2:
            raise InputError(f"{path}: ended inside a sample (odd byte count); expected S16_LE")
        if pending:
            tail = np.frombuffer(pending, dtype="<i2").astype(np.float32) / 32768.0
            yield np.pad(tail, (0, FRAME_SAMPLES - len(tail)))


class Pacer:
    """Releases frames at real-time pace (`--realtime`), or immediately."""

    def __init__(self, realtime: bool, start_delay_s: float = 0.0):
        self.realtime = realtime
        self.start = time.perf_counter() + (start_delay_s if realtime else 0.0)
        self.num_frames = 0

    def shift(self, seconds: float) -> None:
        """Time stood still for `seconds` (half duplex: waiting for an answer)."""
        self.start += seconds

    def wait(self) -> None:
        """Call before handing out each frame."""
        self.num_frames += 1
        if self.realtime:
            delay = self.start + self.num_frames * FRAME_S - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
