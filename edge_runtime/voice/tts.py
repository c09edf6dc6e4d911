"""Speech synthesis with espeak-ng: answers spoken into WAV files (`--tts`), streamed as PCM chunks
while espeak-ng speaks (`speak_pcm`, the Wyoming server's `synthesize`), and the demo's and
tests' spoken commands (16 kHz mono WAV, converted with sox when present, else our resampler).

espeak-ng is a Debian package (tools/bootstrap.sh installs it); a missing binary is a ConfigError
that says how to install it.
"""

from __future__ import annotations

import asyncio
import shutil
import struct
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

import numpy as np

from edge_runtime.errors import ConfigError, InputError
from edge_runtime.voice.wav_file import SAMPLE_RATE, read_wav

ESPEAK = "espeak-ng"


def espeak_binary() -> str:
    path = shutil.which(ESPEAK)
    if path is None:
        raise ConfigError("espeak-ng is not installed: apt-get install espeak-ng (or run tools/bootstrap.sh)")
    return path


def espeak_version() -> str:
    """`espeak-ng --version`'s line: part of the synthesized commands' cache keys."""
    done = subprocess.run([espeak_binary(), "--version"], capture_output=True, text=True)
    return done.stdout.strip()


def _espeak_args(text: str, out: Path, voice: str, speed: int) -> list[str]:
    return [espeak_binary(), "-v", voice, "-s", str(speed), "-w", str(out), "--", text]


async def speak_to_wav(text: str, out: Path, voice: str = "en-us", speed: int = 175) -> None:
    """Speak `text` into `out` (espeak-ng's own 22.05 kHz WAV) without blocking the event loop.
    An unwritable folder or a failing espeak-ng is a ConfigError (the caller keeps the answer)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            *_espeak_args(text, out, voice, speed),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
    except OSError as exc:
        raise ConfigError(f"cannot write spoken answers to {out.parent} ({exc.strerror or exc}); "
                          "give a writable --tts-dir") from exc
    if proc.returncode != 0 or not out.is_file():  # espeak-ng exits 0 when it cannot write
        raise ConfigError(f"espeak-ng failed for {out}: {err.decode(errors='replace').strip()}")


async def speak_to_device(text: str, voice: str = "en-us", speed: int = 175) -> None:
    """Speak `text` on the default audio device. espeak-ng exits 0 even when it cannot open the
    device, so its stderr decides: an `error:` line there is a ConfigError with that line."""
    try:
        proc = await asyncio.create_subprocess_exec(
            espeak_binary(), "-v", voice, "-s", str(speed), "--", text,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
    except OSError as exc:
        raise ConfigError(f"cannot run espeak-ng ({exc.strerror or exc})") from exc
    lines = err.decode(errors="replace").splitlines()
    errors = [line for line in lines if line.lower().startswith("error")]
    if proc.returncode != 0 or errors:
        detail = (errors or lines or [f"exit status {proc.returncode}"])[-1]
        raise ConfigError(f"espeak-ng cannot play on the audio device ({detail}); "
                          "use --tts to write WAV files instead")


WAV_HEADER_BYTES = 44  # espeak-ng --stdout: RIFF, a 16-byte fmt chunk, then data (sizes unknown)
PCM_CHUNK_BYTES = 4096  # ~93 ms of espeak-ng's 22,050 Hz 16-bit mono per chunk


@dataclass(frozen=True)
class PCMFormat:
    rate: int
    width: int  # bytes per sample
    channels: int


def parse_wav_header(header: bytes) -> PCMFormat:
    """espeak-ng's streamed WAV header -> its PCM format (the sizes in it are placeholders)."""
    if (len(header) < WAV_HEADER_BYTES or header[:4] != b"RIFF" or header[8:16] != b"WAVEfmt "
            or header[36:40] != b"data"):
        raise ConfigError(f"espeak-ng wrote no WAV header to stdout (got {header[:16]!r})")
    fmt_tag, channels, rate = struct.unpack_from("<HHI", header, 20)
    bits = struct.unpack_from("<H", header, 34)[0]
    if fmt_tag != 1 or bits % 8:
        raise ConfigError(f"espeak-ng wrote WAV format {fmt_tag} with {bits} bits; expected PCM")
    return PCMFormat(rate, bits // 8, channels)


async def speak_pcm(text: str, voice: str = "en-us", speed: int = 175,
                    chunk_bytes: int = PCM_CHUNK_BYTES) -> AsyncIterator[PCMFormat | bytes]:
    """Speak `text` with espeak-ng as it synthesizes: first its PCMFormat, then PCM chunks of
    `chunk_bytes` (the last may be shorter). A failing espeak-ng is a ConfigError; stopping the
    iteration early (a client gone) kills the process."""
    try:
        proc = await asyncio.create_subprocess_exec(
            espeak_binary(), "-v", voice, "-s", str(speed), "--stdout", "--", text,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        raise ConfigError(f"cannot run espeak-ng ({exc.strerror or exc})") from exc
    try:
        try:
            header = await proc.stdout.readexactly(WAV_HEADER_BYTES)
        except asyncio.IncompleteReadError as exc:
            err = (await proc.stderr.read()).decode(errors="replace").strip()
            raise ConfigError(f"espeak-ng failed: {err or 'no audio'}") from exc
        fmt = parse_wav_header(header)
        yield fmt
        frame = fmt.width * fmt.channels
        carry = b""
        while True:
            data = await proc.stdout.read(chunk_bytes)
            if not data:
                break
            data = carry + data
            whole = len(data) - len(data) % frame
            carry = data[whole:]
            if whole:
                yield data[:whole]
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def synthesize(text: str, voice: str = "en-us", speed: int = 150) -> np.ndarray:
    """`text` spoken by espeak-ng -> float32 [n] at 16 kHz mono."""
    with tempfile.TemporaryDirectory(prefix="edge-voice-") as tmp:
        raw = Path(tmp) / "raw.wav"
        done = subprocess.run(_espeak_args(text, raw, voice, speed), capture_output=True)
        if done.returncode != 0:
            raise ConfigError(f"espeak-ng failed: {done.stderr.decode(errors='replace').strip()}")
        sox = shutil.which("sox")
        if sox is None:
            return read_wav(raw)  # polyphase resampling in audio_input
        out = Path(tmp) / "16k.wav"
        # -D: no dither, so the same text always gives the same samples
        subprocess.run([sox, "-D", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16",
                        str(out)], check=True, capture_output=True)
        return read_wav(out)


def write_wav(path: Path, audio: np.ndarray, rate: int = SAMPLE_RATE, channels: int = 1) -> None:
    """float32 [n] or [n, channels] in [-1, 1] -> 16-bit PCM WAV."""
    pcm = np.round(np.clip(audio, -1, 1) * 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def cached_wav(path: Path, make_audio, on_build=None) -> None:
    """Write `make_audio()` to `path` unless a readable WAV with samples is already there (a
    missing, empty or corrupt file is rebuilt; `on_build()`, when given, is called first, e.g. to
    say so); written to a temporary name and renamed, so a half-written file never looks finished."""
    try:
        if path.exists() and len(read_wav(path)) > 0:
            return
    except InputError:
        pass
    if on_build is not None:
        on_build()
    tmp = path.with_suffix(".tmp.wav")
    write_wav(tmp, make_audio())
    tmp.replace(path)
