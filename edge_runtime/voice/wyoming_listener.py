"""One audio stream of a Wyoming connection (`audio-start` .. `audio-stop`), heard two ways:

- a `transcribe` request: the converted audio is kept (at most `wyoming.max_audio_s`; past it an
  `error` event, and the rest of the stream is dropped) and recognized whole at `audio-stop`;
- a pipeline (a satellite's microphone): every frame goes through the connection's VAD
  (voice/vad.py's cutter, its state kept across the connection's streams), and each utterance it
  cuts is handed to the connection's turns as soon as it is cut. Speech without a pause past
  `vad.max_utterance_s` is an `error` event as soon as it passes the limit (the cutter keeps only
  its first max_utterance_s, so audio sent forever holds bounded memory) and is not answered.
  Its recognition starts as soon as the cutter's `settled()` says the utterance's audio is final
  unless speech resumes (`pad_ms` of silence), ~`min_silence_ms - pad_ms` before the cut.

The VAD runs on the event loop: silero takes ~0.5 ms of a 32 ms frame (onnxruntime, 1 thread,
measured on the loaded 2-core VM), so five satellites cost the loop ~8% of its time.
"""

from __future__ import annotations

import time

import numpy as np
from wyoming.asr import Transcript

from edge_runtime.voice.audio_input import FRAME_S
from edge_runtime.voice.vad import UtteranceCutter
from edge_runtime.voice.wyoming_audio import AudioConverter
from edge_runtime.voice.wyoming_shared import RequestError


class Listener:
    def __init__(self, turns, converter: AudioConverter, cutter: UtteranceCutter | None,
                 max_audio_s: float):
        self.turns = turns  # voice/wyoming_turns.py's Turns of this connection
        self.converter = converter
        self.cutter = cutter  # None: a transcribe request (the audio is kept whole)
        self.max_audio_s = max_audio_s
        self._frames: list[np.ndarray] = []
        self._overflow = False  # transcribe: over max_audio_s, said once, the rest dropped
        self._run_on_said = False

    async def push(self, data: dict, pcm: bytes) -> None:
        frames = self.converter.push(data, pcm)
        if self.cutter is not None:
            await self._hear(frames)
        elif not self._overflow:
            self._frames.extend(frames)
            if len(self._frames) * FRAME_S > self.max_audio_s:
                self._overflow, self._frames = True, []
                raise RequestError(f"more than {self.max_audio_s:g} s of audio in one transcribe "
                                   "request (wyoming.max_audio_s); it is dropped: send one command "
                                   "at a time, then audio-stop", "audio-too-long")

    async def finish(self) -> None:
        """audio-stop: the transcript of a transcribe request; the last utterance of a pipeline
        (the client says its audio is complete, so speech up to the stop is a whole command)."""
        frames = self.converter.flush()
        if self.cutter is not None:
            await self._hear(frames)
            utt = self.cutter.finish()
            problem = await self.turns.post(utt) if utt is not None and not utt.run_on else None
            if problem is not None:
                raise problem
            return
        if self._overflow:
            return
        self._frames.extend(frames)
        audio = np.concatenate(self._frames) if self._frames else np.zeros(0, np.float32)
        self._frames = []
        text = (await self.turns.transcribe(audio)).text if len(audio) else ""
        await self.turns.send(Transcript(text=text, language="en").event())

    async def _hear(self, frames: list[np.ndarray]) -> None:
        """Every frame through the VAD; a problem (run-on speech, too many commands waiting) is
        raised after the whole chunk was heard, so the VAD never skips audio."""
        problem = None
        for frame in frames:
            utt = self.cutter.push(frame, time.perf_counter())
            draft = self.cutter.settled()
            if draft is not None:
                self.turns.recognize_early(draft)
            if utt is not None and not utt.run_on:
                problem = await self.turns.post(utt) or problem
            if self.cutter.run_on and not self._run_on_said:
                self._run_on_said = True
                problem = RequestError(
                    f"speech went on for more than {self.cutter.config.max_utterance_s:g} s "
                    "without a pause (vad.max_utterance_s); it is not answered: no part of it is "
                    "known to be a whole command", "utterance-too-long")
            elif not self.cutter.run_on:
                self._run_on_said = False
        if problem is not None:
            raise problem
