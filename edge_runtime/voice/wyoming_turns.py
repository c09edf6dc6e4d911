"""The turns of one Wyoming connection: its commands answered in order, with its own history.

A connection is one stream of the voice loop (voice/loop.py's `VoiceLoop.answer`): the system
prompt's pages are shared with every other connection through the prefix cache, the history
(`Conversation`) is this connection's alone, and the engine batches the connections' answers.
Each utterance a satellite's VAD stream yields is recognized at once (the shared ASR pool runs it
while the connection's previous command is still answered; it starts from the cutter's settled
draft, before the cut, and is dropped for a new one if speech resumes) and waits in a queue of
`wyoming.max_pending` to be answered, one at a time, by a worker task while the stream goes on; a
full queue drops the new utterance with an `error` event. `close()` cancels the worker: an answer
being generated is cancelled in the engine (AsyncEngine.stream's cleanup), an espeak-ng still
speaking is killed, and queued recognitions are dropped.

Each spoken turn's utterance event (voice/loop.py) gains `asr_done_s` (end of speech -> transcript
ready; recognition may start before the cut, so it can be less than `vad_s + asr_queue_s +
asr_s`), `asr_from_draft` (the recognition was the settled draft's), `tts_s` (espeak-ng start ->
first audio chunk sent) and `reply_audio_s` (end of speech -> first audio chunk sent), and goes
to `on_turn`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import numpy as np
from wyoming.asr import Transcript
from wyoming.error import Error
from wyoming.handle import Handled, NotHandled
from wyoming.vad import VoiceStopped

from edge_runtime.voice.asr import ASRResult
from edge_runtime.voice.frontend import Command
from edge_runtime.voice.loop import StreamReport
from edge_runtime.voice.prompting import Conversation
from edge_runtime.voice.vad import UtteranceCutter, Utterance, make_detector
from edge_runtime.voice.wyoming_audio import AudioConverter
from edge_runtime.voice.wyoming_listener import Listener
from edge_runtime.voice.wyoming_shared import RequestError, WyomingShared
from edge_runtime.voice.wyoming_speech import speak

log = logging.getLogger(__name__)


class Turns:
    def __init__(self, shared: WyomingShared, index: int, source: str, send):
        self.shared = shared
        self.index = index
        self.source = Path(source)
        self.send = send  # async: one event to the client
        self.conv = shared.voice.conversation()
        self.report = StreamReport(index, source)
        self.turn = 0
        self.end_stage = "tts"  # a pipeline's last stage: "asr" | "handle" | "tts"
        self.queue: asyncio.Queue = asyncio.Queue(shared.config.max_pending)
        self.cutter: UtteranceCutter | None = None  # made at the first pipeline audio
        self._worker: asyncio.Task | None = None
        self._answering = False
        self._early: tuple[Utterance, asyncio.Future] | None = None  # a settled draft's recognition

    @property
    def active(self) -> bool:
        return self._answering or not self.queue.empty()

    def listen(self, converter: AudioConverter, pipeline: bool) -> Listener:
        if pipeline and self.cutter is None:
            vad = self.shared.vad
            self.cutter = UtteranceCutter(vad, make_detector(vad))
        if pipeline:
            self.cutter.new_recording(self.source)
        return Listener(self, converter, self.cutter if pipeline else None,
                        self.shared.config.max_audio_s)

    async def transcribe(self, audio: np.ndarray) -> ASRResult:
        if self.shared.asr_pool is None:
            raise RequestError("this server has no speech recognizer loaded", "no-asr")
        try:
            return await self.shared.asr_pool.transcribe(audio)
        except Exception as exc:  # a recognizer failure: this request only
            raise RequestError(f"speech recognition failed ({exc!r})", "asr-failed") from exc

    def recognize_early(self, draft: Utterance) -> None:
        """The cutter's settled draft: its recognition starts now, to be taken by `post` when the
        cut utterance has the same speech (a draft whose speech went on is dropped)."""
        self._drop_early()
        self._early = (draft, asyncio.ensure_future(self.transcribe(draft.audio)))

    async def post(self, utt: Utterance) -> RequestError | None:
        """A cut utterance of a pipeline: `voice-stopped` now, its recognition started (from its
        settled draft, or now: it runs ahead while the previous command is answered, as in the
        voice loop), its answer queued for the worker; or the refusal to say when `max_pending`
        already wait."""
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name=f"wyoming-turns-{self.index}")
        early, self._early = self._early, None
        if self.queue.full():
            if early is not None:
                _drop(early[1])
            return RequestError(f"{self.queue.maxsize} commands are already waiting "
                                "(wyoming.max_pending); this one is dropped: wait for the "
                                "answers", "too-many-commands")
        from_draft = early is not None and early[0].same_speech(utt)
        if from_draft:
            recognition = early[1]
        else:
            if early is not None:
                _drop(early[1])
            recognition = asyncio.ensure_future(self.transcribe(utt.audio))
        self.queue.put_nowait((utt, recognition, from_draft))
        await self.send(VoiceStopped(timestamp=int(utt.end_s * 1000)).event())
        return None

    async def handle_text(self, text: str, context: object = None) -> dict:
        """A typed command (`transcript`) -> its utterance event (`answer`: what to say, or
        `skipped`: why nothing is). A context naming a conversation (Home Assistant's) answers
        with that conversation's history (voice/wyoming_conversations.py), else with this
        connection's."""
        now = time.perf_counter()
        conv = self.shared.conversations.get(context) or self.conv
        return await self._answer(Command(self.source, text=text, ready_wall=now),
                                  ASRResult(text.strip(), 0.0, 0.0, now), conv)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        self._drop_early()
        while not self.queue.empty():  # recognitions nobody will answer: dropped
            _drop(self.queue.get_nowait()[1])

    def _drop_early(self) -> None:
        if self._early is not None:
            _drop(self._early[1])
            self._early = None

    async def _answer(self, command: Command, asr: ASRResult,
                      conv: Conversation | None = None) -> dict:
        turn, self.turn = self.turn, self.turn + 1
        try:
            return await self.shared.voice.answer(self.index, turn, command, asr,
                                                  conv or self.conv, self.report)
        finally:  # the events went to on_event: a connection open for months keeps none
            self.report.events.clear()
            self.report.faults.clear()

    async def _work(self) -> None:
        while True:
            utt, asr, from_draft = await self.queue.get()
            self._answering = True
            try:
                await self._utterance(utt, asr, from_draft)
            except RequestError as exc:
                await self.send(Error(text=str(exc), code=exc.code).event())
            except (ConnectionError, OSError):
                return  # the client is gone; the connection's reader sees it too
            except Exception as exc:  # a bug, not the client's input: logged, the client told
                log.exception("wyoming stream %d: internal error", self.index)
                await self.send(Error(text=f"internal error: {exc!r}",
                                      code="internal-error").event())
            finally:
                self._answering = False

    async def _utterance(self, utt: Utterance, recognition: asyncio.Future,
                         from_draft: bool) -> None:
        asr = await recognition
        asr_done_s = asr.done_wall - utt.end_wall
        await self.send(Transcript(text=asr.text, language="en").event())
        if self.end_stage == "asr" or not asr.text:
            return
        event = await self._answer(Command(self.source, utterance=utt, ready_wall=utt.end_wall),
                                   asr)
        event.update(asr_done_s=asr_done_s, asr_from_draft=from_draft)
        answer = event.get("answer")
        if not answer:
            await self.send(NotHandled(text=event.get("skipped", "not answered")).event())
            return
        await self.send(Handled(text=answer).event())
        if self.end_stage == "tts":
            started = time.perf_counter()
            first = await speak(self.send, answer, self.shared.config.tts_voice)
            if first is not None:
                event.update(tts_s=first - started, reply_audio_s=first - utt.end_wall)
        self.shared.on_turn(event)


def _drop(recognition: asyncio.Future) -> None:
    """A recognition nobody will use: cancelled (dropped from the pool's queue if not started)."""
    recognition.cancel()
    if recognition.done() and not recognition.cancelled():
        recognition.exception()  # retrieved: a failed one is not logged as forgotten
