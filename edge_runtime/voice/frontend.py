"""The front end of one stream, run in its own thread: source -> (pacing) -> VAD -> items.

Reading a FIFO blocks, and VAD is per-frame work, so each stream's front end is a thread that posts
items into the stream's asyncio queue (thread-safe via `loop.call_soon_threadsafe`). Items:

- `Command(utterance)` for a cut utterance (audio), or `Command(text=...)` for a text-file line;
- `Fault(source, problem)` for anything wrong with this stream's input: the message names the file
  and the problem; the other streams never see it. A fault in one file of a folder does not stop
  the folder; an input that ends mid-utterance yields a Fault and the incomplete command is dropped
  (acting on half a command is worse than asking again). Also faults, not fatal: a recording in
  which the VAD finds no speech; a truncated WAV (reported after its audio; the utterance open
  where it stops is not sent); run-on speech longer than vad.max_utterance_s (not sent). A read
  error part-way (a pipe's stray byte) comes after the complete audio before it;
- `None` when the stream's input is over.

Once the event loop is closed (Ctrl-C ended the run), posting stops the thread quietly.

Half duplex (`half_duplex=True`, the demo's default): after posting a command the front end stops
reading until the loop calls `answered()`, then carries on with the rest of the input (paced time
shifted by the wait). That is how a person uses a voice assistant (speak, listen, speak again), and
it keeps pre-recorded files from piling commands up faster than anyone would speak them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import InputError
from edge_runtime.voice.audio_input import FRAME_S, Pacer, Recording, Source
from edge_runtime.voice.vad import UtteranceCutter, Utterance


@dataclass
class Command:
    source: Path
    utterance: Utterance | None = None  # audio commands
    text: str | None = None  # text-file commands
    line: int = 0  # 1-based line of a text command
    ready_wall: float = 0.0  # perf_counter() when the command was complete (end of speech)


@dataclass
class Fault:
    source: str
    problem: str  # "<file>: <what is wrong>"
    fatal: bool  # True when the stream stopped because of it


class FrontEnd:
    """Runs `Source` -> `UtteranceCutter` in a daemon thread, posting to `queue`. A text source
    has no cutter (no VAD is made for it)."""

    def __init__(self, source: Source, cutter: UtteranceCutter | None, queue: asyncio.Queue,
                 loop: asyncio.AbstractEventLoop, realtime: bool, start_delay_s: float = 0.0,
                 half_duplex: bool = False):
        self.source = source
        self.cutter = cutter
        self.queue = queue
        self.loop = loop
        self.pacer = Pacer(realtime, start_delay_s)
        self.stop_event = threading.Event()
        self.half_duplex = half_duplex
        self._answered = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"voice-frontend-{source.name}")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()

    def answered(self) -> None:
        """The loop finished (or skipped) the last command posted: reading may go on."""
        self._answered.set()

    def _wait_for_answer(self) -> None:
        start = time.perf_counter()
        while not self._answered.wait(0.05):
            if self.stop_event.is_set():
                return
        self._answered.clear()
        self.pacer.shift(time.perf_counter() - start)

    def _post(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            if not self.loop.is_closed():
                raise
            self.stop_event.set()  # the run is over (Ctrl-C): nobody reads this stream any more

    def _run(self) -> None:
        try:
            for rec in self.source.recordings():
                if self.stop_event.is_set():
                    break
                if isinstance(rec, InputError):
                    self._post(Fault(self.source.name, str(rec), fatal=False))
                elif rec.kind == "text":
                    self._text(rec)
                else:
                    self._audio(rec)
        except InputError as exc:
            self._post(Fault(self.source.name, str(exc), fatal=True))
        except Exception as exc:  # a bug, not bad input: report it with its traceback
            traceback.print_exc()
            self._post(Fault(self.source.name, f"{self.source.name}: internal error: {exc!r}",
                             fatal=True))
        finally:
            self._post(None)

    def _text(self, rec: Recording) -> None:
        for i, line in enumerate(rec.lines or [], start=1):
            if self.stop_event.is_set():
                return
            self._post(Command(rec.path, text=line, line=i, ready_wall=time.perf_counter()))
            if self.half_duplex:
                self._wait_for_answer()

    def _audio(self, rec: Recording) -> None:
        assert self.cutter is not None, f"audio from {rec.path} on a stream built for text"
        self._emit(self.cutter.new_recording(rec.path))
        heard = num_frames = 0  # utterances (sent or not) and frames of this recording
        error = None
        try:
            for frame in rec.frames():
                if self.stop_event.is_set():
                    return
                self.pacer.wait()
                num_frames += 1
                heard += self._emit(self.cutter.push(frame, time.perf_counter()))
        except InputError as exc:  # e.g. a stray byte: the audio before it is complete
            error = exc
        if rec.cut_short:
            self._post(Fault(str(rec.path), rec.cut_short, fatal=False))
        heard += self._finish(rec)
        if error is not None:
            raise error
        if not heard:
            self._post(Fault(str(rec.path), f"{rec.path}: no speech detected in "
                             f"{num_frames * FRAME_S:.2f} s of audio (check the recording or "
                             f"microphone level; vad.threshold is {self.cutter.config.threshold})",
                             fatal=False))

    def _finish(self, rec: Recording) -> int:
        """End of a recording's audio: send the open utterance unless it was cut off."""
        utt = self.cutter.finish()
        if utt is None:
            return 0
        if utt.run_on:
            self._run_on(utt)
        elif utt.truncated or rec.cut_short:
            self._post(Fault(str(rec.path), f"{rec.path}: input ended mid-utterance (speech from "
                             f"{utt.start_s:.2f} s to the end at {utt.end_s:.2f} s); the "
                             "incomplete command was not sent", fatal=False))
        else:
            self._emit(utt)
        return 1

    def _run_on(self, utt: Utterance) -> None:
        self._post(Fault(str(utt.source), f"{utt.source}: speech from {utt.start_s:.2f} s to "
                         f"{utt.end_s:.2f} s went on without a pause for more than "
                         f"vad.max_utterance_s ({self.cutter.config.max_utterance_s:g} s); not "
                         "sent: no part of it is known to be a whole command", fatal=False))

    def _emit(self, utt: Utterance | None) -> int:
        if utt is None:
            return 0
        if utt.run_on:
            self._run_on(utt)
            return 1
        self._post(Command(utt.source, utterance=utt, ready_wall=utt.end_wall))
        if self.half_duplex:
            self._wait_for_answer()
        return 1
