"""Voice activity detection: a per-frame speech probability, and a cutter that turns the frames
of one stream into utterances.

Backends:
- `silero`: the silero-vad ONNX model that ships inside the `silero_vad` PyPI package, run with
  onnxruntime on 1 thread. The file is located with importlib without importing `silero_vad`,
  whose import calls torch.set_num_threads(1) and would silently take the engine's threads.
  Falls back to the package's TorchScript model when onnxruntime is missing. One ONNX session
  serves every stream (each stream's state lives in its SileroVAD); text streams make no VAD.
- `energy`: RMS level above an adaptive noise floor; no model, for machines without either.

Cutter invariants (all lengths in 32 ms frames):
- an utterance starts at the first frame with p >= threshold and ends after `min_silence_ms` of
  frames with p < threshold - 0.15 (silero's hysteresis); shorter speech than `min_speech_ms` is
  dropped as a blip; `pad_ms` of audio is kept on both sides;
- speech longer than `max_utterance_s` without a pause is one `run_on` utterance spanning all of
  it (audio: its first max_utterance_s only), closed by the next pause: no command is that long,
  and a forced cut would hand on two halves of whatever was said;
- `finish()` at the end of the input returns the open utterance, marked `truncated` when speech was
  still going on in the last `TRUNCATED_TAIL_MS` (the input ended mid-utterance);
- `settled()` is the open utterance's draft on the one frame where `pad_ms` of silence has followed
  its speech: from then on its audio (speech + pad) is final unless speech resumes, so a consumer
  may start recognizing it ~`min_silence_ms - pad_ms` before the cut; the cut utterance has the
  same audio, start and end as the draft whenever no speech came in between (`same_speech`).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_runtime.errors import ConfigError
from edge_runtime.voice import setting_checks as check
from edge_runtime.voice.audio_input import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE

TRUNCATED_TAIL_MS = 100
HYSTERESIS = 0.15
# bounds of the settings: past them a value is a typo, and would hold audio in memory for minutes
MAX_UTTERANCE_S = 600.0
MAX_SILENCE_MS = 10_000
MAX_PAD_MS = 5_000


@dataclass(frozen=True)
class VADConfig:
    backend: str = "silero"  # "silero" | "energy"
    threshold: float = 0.5
    min_speech_ms: int = 200
    min_silence_ms: int = 400
    pad_ms: int = 160
    max_utterance_s: float = 20.0

    def __post_init__(self) -> None:
        if self.backend not in ("silero", "energy"):
            raise ConfigError(f"vad.backend must be 'silero' or 'energy', got {self.backend!r}")
        check.number("vad.threshold", self.threshold, 0.2, 1, hi_open=True)
        check.number("vad.max_utterance_s", self.max_utterance_s, 1, MAX_UTTERANCE_S, lo_open=True)
        for name, hi in (("min_speech_ms", 1000 * self.max_utterance_s),
                         ("min_silence_ms", MAX_SILENCE_MS), ("pad_ms", MAX_PAD_MS)):
            check.number(f"vad.{name}", getattr(self, name), 0, hi)


def _silero_data_file(name: str) -> Path | None:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / name
    return path if path.exists() else None


@functools.lru_cache(maxsize=None)
def _onnx_session(onnx_path: Path):
    """One onnxruntime session for every stream (~8 MB each otherwise): `InferenceSession.run`
    is thread-safe, and the recurrent state and context are passed in and out by each SileroVAD,
    so the session itself holds none. 1 intra-op thread: each call runs on its caller's thread."""
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(onnx_path), sess_options=opts,
                                        providers=["CPUExecutionProvider"])


class SileroVAD:
    """Streaming silero-vad: `prob(frame)` keeps the recurrent state and 64-sample context."""

    CONTEXT = 64

    def __init__(self) -> None:
        onnx_path = _silero_data_file("silero_vad.onnx")
        self._session = None
        if onnx_path is not None and importlib.util.find_spec("onnxruntime") is not None:
            self._session = _onnx_session(onnx_path)
        else:
            self._jit = self._load_jit()
        self.reset()

    @staticmethod
    def _load_jit():
        jit_path = _silero_data_file("silero_vad.jit")
        if jit_path is None:
            raise ConfigError(
                "silero-vad is not installed (pip install silero-vad); set vad.backend: energy"
            )
        import torch

        return torch.jit.load(str(jit_path), map_location="cpu").eval()

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, self.CONTEXT), dtype=np.float32)
        if self._session is None:
            self._jit.reset_states()

    def prob(self, frame: np.ndarray) -> float:
        assert frame.shape == (FRAME_SAMPLES,), frame.shape
        if self._session is None:
            import torch

            with torch.no_grad():
                return float(self._jit(torch.from_numpy(frame[None, :].copy()), SAMPLE_RATE))
        x = np.concatenate([self._context, frame[None, :].astype(np.float32)], axis=1)
        out, self._state = self._session.run(
            None, {"input": x, "state": self._state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)}
        )
        self._context = x[:, -self.CONTEXT :]
        return float(out.reshape(-1)[0])


class EnergyVAD:
    """Speech when the frame's RMS level is `margin_db` above a slowly rising noise floor."""

    def __init__(self, margin_db: float = 12.0, min_level_db: float = -50.0):
        self.margin_db = margin_db
        self.min_level_db = min_level_db
        self.reset()

    def reset(self) -> None:
        self._floor_db = -90.0

    def prob(self, frame: np.ndarray) -> float:
        level_db = 10 * math.log10(float(np.mean(frame.astype(np.float64) ** 2)) + 1e-12)
        # floor follows drops at once and rises by 0.05 dB per frame (~1.5 dB/s)
        self._floor_db = max(-90.0, min(level_db, self._floor_db + 0.05))
        loud = level_db > max(self._floor_db + self.margin_db, self.min_level_db)
        return 1.0 if loud else 0.0


def make_detector(config: VADConfig):
    return SileroVAD() if config.backend == "silero" else EnergyVAD()


@dataclass
class Utterance:
    index: int  # 0, 1, ... within the stream
    source: Path  # the file (or pipe) the audio came from
    start_s: float  # stream time of the first speech frame
    end_s: float  # stream time just after the last speech frame
    audio: np.ndarray  # float32 [n] at 16 kHz, speech plus padding
    end_wall: float  # perf_counter() when the last speech frame was handed to the VAD
    cut_wall: float  # perf_counter() when the VAD decided the utterance was over
    truncated: bool = False
    run_on: bool = False  # speech went on past max_utterance_s without a pause

    def same_speech(self, other: "Utterance") -> bool:
        """`other` (a `settled()` draft) holds the same speech of the same recording."""
        return (self.source, self.index, self.start_s, self.end_s) == (
            other.source, other.index, other.start_s, other.end_s)


class UtteranceCutter:
    """Frames in, Utterances out, for one stream. Stream time advances by FRAME_S per frame."""

    def __init__(self, config: VADConfig, detector) -> None:
        self.config = config
        self.detector = detector
        ms = FRAME_S * 1000
        self._min_speech = max(1, round(config.min_speech_ms / ms))
        self._min_silence = max(1, round(config.min_silence_ms / ms))
        self._pad = round(config.pad_ms / ms)
        self._max_frames = int(config.max_utterance_s / FRAME_S)
        self._tail = max(1, round(TRUNCATED_TAIL_MS / ms))
        self._pre: deque[np.ndarray] = deque(maxlen=self._pad)
        self._frames: list[np.ndarray] = []  # padding + speech (+ trailing silence so far)
        self._num_frames = 0  # frames seen on this stream
        self._num_utterances = 0
        self._source = Path("-")
        self.vad_s = 0.0  # seconds spent in the detector (for the latency split)
        self._reset_speech()

    def _reset_speech(self) -> None:
        self._frames = []
        self._start = -1  # frame index of the first speech frame, -1 when idle
        self._last_speech = -1
        self._last_speech_wall = 0.0
        self._run_on = False

    @property
    def run_on(self) -> bool:
        """Speech has gone on past max_utterance_s without a pause (its audio is no longer kept)."""
        return self._start >= 0 and self._run_on

    def new_recording(self, source: Path) -> Utterance | None:
        """A new file starts: close what is open (a file boundary ends an utterance)."""
        utt = self._close(truncated=False) if self._start >= 0 else None
        self._source = source
        self._pre.clear()
        self.detector.reset()
        return utt

    def push(self, frame: np.ndarray, wall: float | None = None) -> Utterance | None:
        wall = time.perf_counter() if wall is None else wall
        t0 = time.perf_counter()
        p = self.detector.prob(frame)
        self.vad_s += time.perf_counter() - t0
        index = self._num_frames
        self._num_frames += 1
        speech = p >= self.config.threshold
        if self._start < 0:
            if not speech:
                self._pre.append(frame)
                return None
            self._start, self._frames = index, list(self._pre) + [frame]
            self._pre.clear()
        elif not self._run_on:  # a run-on keeps only its first max_utterance_s (bounded memory)
            self._frames.append(frame)
        if p >= self.config.threshold - HYSTERESIS:  # speech, or not clearly silence yet
            if speech or self._last_speech == index - 1:
                self._last_speech, self._last_speech_wall = index, wall
        silence = index - self._last_speech
        if silence >= self._min_silence:
            return self._close(truncated=False)
        if index - self._start + 1 >= self._max_frames:
            self._run_on = True
        return None

    def settled(self) -> Utterance | None:
        """The open utterance as it will be cut if the silence now `pad_ms` long lasts, on that
        frame only; None on every other frame, and for speech too short or run on."""
        silence = self._num_frames - 1 - self._last_speech
        if (self._start < 0 or self._run_on or silence != max(1, self._pad)
                or silence >= self._min_silence
                or self._last_speech - self._start + 1 < self._min_speech):
            return None
        keep = len(self._frames) - silence + self._pad  # speech + pad: what _close keeps
        return Utterance(index=self._num_utterances, source=self._source,
                         start_s=self._start * FRAME_S, end_s=(self._last_speech + 1) * FRAME_S,
                         audio=np.concatenate(self._frames[:keep]),
                         end_wall=self._last_speech_wall, cut_wall=time.perf_counter())

    def finish(self) -> Utterance | None:
        """End of input: the open utterance, if any (truncated when speech had not stopped)."""
        if self._start < 0:
            return None
        silence = self._num_frames - 1 - self._last_speech
        return self._close(truncated=silence < self._tail)

    def _close(self, truncated: bool) -> Utterance | None:
        start, last, run_on = self._start, self._last_speech, self._run_on
        speech_frames = last - start + 1
        keep = len(self._frames) - ((self._num_frames - 1) - last) + self._pad  # speech + pad
        audio = np.concatenate(self._frames if run_on else self._frames[: max(1, keep)])
        end_wall = self._last_speech_wall
        self._reset_speech()
        if speech_frames < self._min_speech:
            return None
        utt = Utterance(
            index=self._num_utterances,
            source=self._source,
            start_s=start * FRAME_S,
            end_s=(last + 1) * FRAME_S,
            audio=audio,
            end_wall=end_wall,
            cut_wall=time.perf_counter(),
            truncated=truncated,
            run_on=run_on,
        )
        self._num_utterances += 1
        return utt
