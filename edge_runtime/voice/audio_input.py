"""Audio and text inputs of the voice loop: one `Source` per stream.

An input SPEC is `[kind:]path` with kind one of `wav`, `folder`, `pcm`, `text`; without a kind it
is inferred (a directory is a folder of WAVs, `.txt` is text, a FIFO / `-` / `.raw` / `.pcm` is a
raw pipe, anything else a WAV file).

Invariants:
- every audio frame handed out is float32 `[FRAME_SAMPLES]` at 16 kHz mono in [-1, 1]
  (the last frame of a recording is zero-padded);
- WAV files of any rate / channel count are downmixed (mean of channels) and resampled (wav_file.py),
  so nothing downstream ever sees another format;
- a raw pipe is S16_LE, 16 kHz mono by default (what `arecord -f S16_LE -r 16000 -c 1` writes);
  `pcm,rate=R,channels=C:PATH` converts other rates/channel counts on the fly;
- every problem with an input is an `InputError` whose message names the file and the problem.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from edge_runtime.errors import InputError
from edge_runtime.voice.regular_file import open_regular
from edge_runtime.voice.resample import StreamResampler, downmix
from edge_runtime.voice.wav_file import SAMPLE_RATE, check_rate, load_wav

FRAME_SAMPLES = 512  # 32 ms: the window silero-vad takes at 16 kHz
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
KINDS = ("wav", "folder", "pcm", "text")
MAX_CHANNELS = 64


@dataclass(frozen=True)
class InputSpec:
    kind: str  # one of KINDS
    path: Path
    rate: int = SAMPLE_RATE  # raw pipes only: sample rate of the S16_LE stream
    channels: int = 1  # raw pipes only: interleaved channels


def parse_input_spec(spec: str) -> InputSpec:
    """`[kind[,rate=R][,channels=C]:]path` -> InputSpec; the kind is inferred from the path when
    absent; rate/channels describe a raw pipe (default 16000 Hz mono)."""
    head, sep, rest = spec.partition(":")
    kind, *options = head.split(",")
    if sep and kind.lower() in KINDS:
        if not rest:
            raise InputError(f"empty path in {spec!r} (e.g. {kind.lower()}:kitchen.wav)")
        if rest == "-" and kind.lower() != "pcm":
            raise InputError(f"{spec}: stdin (-) carries raw audio only (pcm:- or -); "
                             f"{kind.lower()} input must be a regular file")
        return InputSpec(kind.lower(), Path(rest), **_pcm_options(options, spec, kind.lower()))
    if not spec:
        raise InputError("empty path (give a WAV file, folder, pipe or .txt file)")
    if sep and kind.isalpha() and not Path(spec).exists():
        raise InputError(f"unknown input kind {kind!r} in {spec!r} (use wav:, folder:, pcm: or "
                         "text:)")
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


def _pcm_options(options: list[str], spec: str, kind: str) -> dict:
    values = {}
    for opt in options:
        key, _, value = opt.partition("=")
        if kind != "pcm" or key not in ("rate", "channels") or not value.isdigit() or int(value) < 1:
            raise InputError(f"{spec}: bad input option {opt!r} (only pcm takes rate=N, "
                             "channels=N, e.g. pcm,rate=8000,channels=2:/tmp/mic)")
        values[key] = int(value)
    if "rate" in values:
        check_rate(values["rate"], spec)
    if values.get("channels", 1) > MAX_CHANNELS:
        raise InputError(f"{spec}: channels={values['channels']} is more than {MAX_CHANNELS}")
    return values


# ----------------------------------------------------------------------------- reading


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
    cut_short: str | None = None  # the file holds less or more than its header says: reported
    # after its audio, and the utterance open where the audio stops is not sent

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
            yield _wav_recording(path)
        elif kind == "folder":
            yield from self._folder(path)
        elif kind == "pcm":
            yield Recording(path, "audio", pcm_frames(path, self.spec.rate, self.spec.channels))
        else:
            yield Recording(path, "text", lines=read_text_commands(path))

    def _folder(self, path: Path) -> Iterator[Recording | InputError]:
        try:
            files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".wav")
        except FileNotFoundError as exc:
            raise InputError(f"{path}: folder not found") from exc
        except NotADirectoryError as exc:
            raise InputError(f"{path}: not a folder (give a folder of .wav files)") from exc
        except OSError as exc:
            why = "symlink loop" if exc.errno == errno.ELOOP else f"cannot read ({exc.strerror})"
            raise InputError(f"{path}: {why}") from exc
        if not files:
            raise InputError(f"{path}: folder contains no .wav files")
        for wav_path in files:
            try:
                recording = _wav_recording(wav_path)
            except InputError as exc:
                yield exc
            else:
                yield recording


def _wav_recording(path: Path) -> Recording:
    wav = load_wav(path)
    return Recording(path, "audio", frames_of(wav.samples), cut_short=wav.problem)


def read_text_commands(path: Path) -> list[str]:
    try:
        with open_regular(path, "a text file", "give a .txt file of commands, one per line",
                          "text input must be a regular file of commands, one per line (raw "
                          "audio from a pipe is pcm:)") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable UTF-8 text file ({exc})") from exc
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise InputError(f"{path}: contains no commands (expected one per line)")
    return lines


def pcm_frames(path: Path, rate: int = SAMPLE_RATE, channels: int = 1) -> Iterator[np.ndarray]:
    """Raw S16_LE from a pipe/FIFO/file (or stdin for `-`), frame by frame until EOF; other rates
    and channel counts are downmixed and resampled on the fly (voice/resample.py)."""
    check_rate(rate, path)
    if str(path) != "-" and not path.exists():
        raise InputError(f"{path}: pipe or file not found")
    try:
        stream = os.fdopen(os.dup(0), "rb") if str(path) == "-" else open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror})") from exc
    block = 2 * channels  # bytes per sample frame
    resampler = StreamResampler(rate, SAMPLE_RATE)
    pending, out = b"", np.zeros(0, np.float32)
    with stream:
        while True:
            chunk = stream.read(FRAME_SAMPLES * block)  # blocks until a frame's worth or EOF
            if not chunk:
                break
            pending += chunk
            usable = len(pending) - len(pending) % block
            pcm = np.frombuffer(pending[:usable], dtype="<i2").reshape(-1, channels)
            pending = pending[usable:]
            out = np.concatenate([out, resampler.push(downmix(pcm.astype(np.float32) / 32768.0))])
            while len(out) >= FRAME_SAMPLES:
                yield out[:FRAME_SAMPLES]
                out = out[FRAME_SAMPLES:]
        out = np.concatenate([out, resampler.flush()])
        yield from (frames_of(out) if len(out) else ())
        if pending:  # after the complete audio: its commands are not lost to a stray byte
            raise InputError(f"{path}: ended inside a sample ({len(pending)} stray bytes); "
                             f"expected S16_LE with {channels} channel(s)")


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
