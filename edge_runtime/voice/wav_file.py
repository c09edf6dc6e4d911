"""Reading a WAV file into the voice loop's one format: float32 at 16 kHz mono.

Invariants:
- only regular files are decoded (regular_file.py): a FIFO never reaches soundfile, whose open
  holds a lock shared by every stream;
- any rate in MIN_RATE..MAX_RATE and any channel count is downmixed (mean of channels) and
  resampled here; a rate outside it is refused (a damaged header, not audio);
- every problem with a file is an `InputError` whose message names the file and the problem;
- the data chunk's declared size is checked against the file (soundfile follows the header
  without a word): a streaming writer's placeholder (0, or UNKNOWN_SIZE and up) is read to the end
  of the file; a size larger than the file is a truncated file and a smaller one (bytes after the
  chunk that are no RIFF chunk) a header that disagrees with the file: both are read as far as the
  audio goes and reported in `WavAudio.problem`.
"""

from __future__ import annotations

import os
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from edge_runtime.errors import InputError
from edge_runtime.voice.regular_file import open_regular
from edge_runtime.voice.resample import downmix, resample

SAMPLE_RATE = 16000
MIN_RATE, MAX_RATE = 4000, 384000  # Hz: telephone-band to the fastest audio interfaces
# arecord to stdout leaves 0x80000000, other writers 0x7FFFFFFF / 0x7FFFFF00 / 0xFFFFFFFF: no
# recording is 2 GiB, so sizes from here up mean "not known when the header was written"
UNKNOWN_SIZE = 0x7FFFFF00


@dataclass(frozen=True)
class WavAudio:
    samples: np.ndarray  # float32 [n] at 16 kHz mono
    problem: str | None = None  # truncated, or the header disagrees with the file: not all heard


@dataclass(frozen=True)
class DataChunk:
    size_offset: int  # file offset of the chunk's 4-byte size field
    declared: int  # the size it declares
    held: int  # bytes the file holds after the size field
    tail_is_chunks: bool  # what follows `declared` bytes is RIFF chunks (or nothing)

    @property
    def size_unknown(self) -> bool:
        return self.declared == 0 or self.declared >= UNKNOWN_SIZE


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
    return load_wav(path).samples


def load_wav(path: Path) -> WavAudio:
    """A WAV file -> its audio at 16 kHz mono and what is wrong with its header, if anything."""
    with open_regular(path, "a WAV file", f"use folder:{path}",
                      "for a pipe use pcm: or -") as f:
        chunk = _data_chunk(f)
        f.seek(0)
        try:
            view = _SizedView(f, chunk) if chunk and chunk.size_unknown else f
            samples, rate = _decode(view, path)
        except InputError:
            raise
        except Exception as exc:  # libsndfile / wave errors: a corrupt or unsupported file
            why = getattr(exc, "error_string", None) or exc  # libsndfile's words, not its handle
            raise InputError(f"{path}: not a readable WAV file ({why})") from exc
    if samples.shape[0] == 0:
        raise InputError(f"{path}: contains no audio samples (empty recording)")
    if not np.all(np.isfinite(samples)):
        raise InputError(f"{path}: contains NaN or infinite samples")
    check_rate(rate, path)
    try:
        audio = to_16k_mono(samples, rate)
    except MemoryError as exc:
        raise InputError(f"{path}: too long to convert in memory ({samples.shape[0] / rate:.0f} s "
                         f"at {rate} Hz); split it into shorter files") from exc
    return WavAudio(audio, _size_problem(path, chunk, len(audio) / SAMPLE_RATE))


def _size_problem(path: Path, chunk: DataChunk | None, held_s: float) -> str | None:
    """A problem line when the data chunk's size disagrees with the file; None otherwise."""
    if chunk is None or chunk.size_unknown or chunk.held <= 0:
        return None
    if chunk.declared > chunk.held:
        return (f"{path}: truncated: header declares {held_s * chunk.declared / chunk.held:.2f} s,"
                f" file holds {held_s:.2f} s (the audio there was processed; a command cut off at "
                "the end was not sent)")
    if chunk.tail_is_chunks:
        return None
    extra = chunk.held - chunk.declared
    return (f"{path}: header disagrees with the file size: its data chunk declares {held_s:.2f} s "
            f"but {extra} more bytes (~{held_s * extra / chunk.declared:.2f} s) follow that are "
            "not a RIFF chunk; only the declared audio was processed and a command open at its "
            "end was not sent (rewrite the file's header, e.g. with sox)")


def _data_chunk(f: BinaryIO) -> DataChunk | None:
    """Where a RIFF/WAVE file's data chunk is, what it declares and what the file holds."""
    file_size = os.fstat(f.fileno()).st_size
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    while len(chunk := f.read(8)) == 8:
        size = int.from_bytes(chunk[4:], "little")
        if chunk[:4] == b"data":
            start = f.tell()  # of the audio; the size field is the 4 bytes before it
            held = file_size - start
            tail_is_chunks = size >= held or _chunks_to_end(f, start + size + (size & 1),
                                                            file_size)
            return DataChunk(start - 4, size, held, tail_is_chunks)
        f.seek(size + (size & 1), os.SEEK_CUR)
    return None


def _chunks_to_end(f: BinaryIO, pos: int, file_size: int) -> bool:
    """True when the bytes from `pos` on are whole RIFF chunks (LIST, id3, ...), or a few bytes
    too short to be any."""
    while file_size - pos >= 8:
        f.seek(pos)
        head = f.read(8)
        size = int.from_bytes(head[4:], "little")
        if not all(32 <= b < 127 for b in head[:4]) or pos + 8 + size > file_size:
            return False
        pos += 8 + size + (size & 1)
    return True


class _SizedView:
    """A file whose data chunk size reads as the bytes the file holds: a streaming writer's
    placeholder (0 or 0x7FFFFFFF...) becomes the real size, so every decoder reads to the end."""

    def __init__(self, f: BinaryIO, chunk: DataChunk):
        self._f = f
        self._at = chunk.size_offset
        self._size = min(chunk.held, 0xFFFFFFFF).to_bytes(4, "little")

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def read(self, n: int = -1) -> bytes:
        pos = self._f.tell()
        data = self._f.read(n)
        lo, hi = max(pos, self._at), min(pos + len(data), self._at + 4)
        if lo >= hi:
            return data
        patched = bytearray(data)
        patched[lo - pos : hi - pos] = self._size[lo - self._at : hi - self._at]
        return bytes(patched)


def _decode(f, path: Path) -> tuple[np.ndarray, int]:
    try:
        import soundfile
    except ImportError:  # stdlib fallback: 16-bit PCM only
        return _decode_stdlib(f, path)
    samples, rate = soundfile.read(f, dtype="float32", always_2d=False)
    return samples, int(rate)


def _decode_stdlib(f, path: Path) -> tuple[np.ndarray, int]:
    with wave.open(f, "rb") as w:
        if w.getsampwidth() != 2:
            raise InputError(f"{path}: only 16-bit PCM WAV is supported without soundfile")
        raw = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        samples = raw.reshape(-1, w.getnchannels()).astype(np.float32) / 32768.0
        return samples, w.getframerate()
