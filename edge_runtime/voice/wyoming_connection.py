"""One Wyoming connection: one stream of the voice loop (its own VAD state and history).

Events served (the `wyoming` package's event classes and framing, voice/wyoming_framing.py):
- `describe` -> `info` (voice/wyoming_info.py); `ping` -> `pong`;
- `transcribe`, then `audio-start`, `audio-chunk`s, `audio-stop` -> `transcript`: the request's
  audio (at most `max_audio_s`) recognized whole, as Home Assistant's speech-to-text sends it;
- `run-pipeline` (start stage `asr`, end stage `asr`, `handle` or `tts`), then audio, as a
  satellite streams its microphone: our VAD cuts the stream into commands, and each one gets
  `voice-stopped` as it is cut, then (in the commands' order) `transcript`, `handled` (the spoken
  answer) and the answer's audio (`audio-start`, `audio-chunk`s, `audio-stop`), up to the end
  stage. The stream
  goes on until `audio-stop` or the end of the connection; commands are answered in order while
  the next ones are heard (voice/wyoming_turns.py, voice/wyoming_listener.py);
- `transcript` -> `handled`: a typed command answered with the connection's history (or, with a
  context's `conversation_id`, that conversation's: voice/wyoming_conversations.py) and acted on
  (the home's actions), the answer as text;
- `synthesize` -> `audio-start`, `audio-chunk`s of espeak-ng's PCM as it speaks, `audio-stop`.

Faults: an event this server cannot use (a missing or wrong field, audio it cannot convert, more
audio than a request may hold, speech without a pause past `vad.max_utterance_s`, a command while
`max_pending` wait) is an `error` event saying what to send instead, and the connection goes on;
bytes that are not Wyoming events are an `error` event and the connection is closed (the stream is
out of step). Other event types are ignored, as the protocol asks of servers. Nothing of a
connection outlives it: its turns are cancelled (the engine drops the request) when it closes.
"""

from __future__ import annotations

import asyncio
import logging
import time

from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.handle import Handled, NotHandled
from wyoming.ping import Pong

from edge_runtime.voice.wyoming_audio import AudioConverter, AudioFormatError, check_format
from edge_runtime.voice.wyoming_framing import MalformedEvent, read_event
from edge_runtime.voice.wyoming_listener import Listener
from edge_runtime.voice.wyoming_shared import RequestError, WyomingShared
from edge_runtime.voice.wyoming_speech import speak, synthesize_request
from edge_runtime.voice.wyoming_turns import Turns

log = logging.getLogger(__name__)
STREAMING_GAP_S = 5.0  # an open audio stream silent this long no longer counts as streaming


class Connection:
    def __init__(self, shared: WyomingShared, index: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, peer: str):
        self.shared = shared
        self.index = index
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self.last_event = time.monotonic()
        self.busy = 0  # requests being answered inline (transcript, synthesize, transcribe)
        self._write_lock = asyncio.Lock()
        self.turns = Turns(shared, index, f"wyoming:{peer}", self.send)
        self.listener: Listener | None = None  # the open audio stream, between start and stop
        self.mode = "transcribe"  # what audio is for: "transcribe" | "pipeline"
        self._refusing_audio = False  # chunks dropped until the next audio-start (said once)
        self.closed = False

    @property
    def answering(self) -> bool:
        return bool(self.busy) or self.turns.active

    @property
    def active(self) -> bool:
        """Being answered, or streaming audio (an open stream whose chunks keep coming): not to be
        closed to make room for a newcomer."""
        streaming = (self.listener is not None
                     and time.monotonic() - self.last_event < STREAMING_GAP_S)
        return self.answering or streaming

    async def run(self) -> None:
        try:
            await self._read_loop()
        except MalformedEvent as exc:
            await self.fail(str(exc), "malformed-event")
        except (ConnectionError, OSError):
            pass  # the client is gone: nothing to tell it
        except Exception as exc:  # a bug, not the client's input: logged, the client told
            log.exception("wyoming %s: internal error", self.peer)
            await self.fail(f"internal error: {exc!r}", "internal-error")
        finally:
            await self.turns.close()
            self.close()

    async def _read_loop(self) -> None:
        timeout = self.shared.config.idle_timeout_s
        while not self.closed:
            try:
                event = await asyncio.wait_for(read_event(self.reader), timeout)
            except asyncio.TimeoutError:
                if self.answering:  # an open audio stream that sends nothing is idle
                    continue
                await self.fail(f"closed: no event for {timeout:g} s (wyoming.idle_timeout_s)",
                                "idle-timeout")
                return
            if event is None:
                return
            self.last_event = time.monotonic()
            await self._handle(event)

    async def send(self, event: Event) -> None:
        async with self._write_lock:
            await async_write_event(event, self.writer)

    async def fail(self, text: str, code: str) -> None:
        """An `error` event, then the connection closes."""
        try:
            await asyncio.wait_for(self.send(Error(text=text, code=code).event()), 5.0)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()

    async def _handle(self, event: Event) -> None:
        handler = _HANDLERS.get(event.type)
        if handler is None:
            log.debug("wyoming %s: ignored an event of type %r", self.peer, event.type)
            return
        try:
            await handler(self, event)
        except RequestError as exc:
            await self.send(Error(text=str(exc), code=exc.code).event())

    async def _describe(self, event: Event) -> None:
        await self.send(self.shared.info.event())

    async def _ping(self, event: Event) -> None:
        await self.send(Pong(text=_optional_text(event.data, "text")).event())

    async def _transcribe(self, event: Event) -> None:
        language = _optional_text(event.data, "language")
        if language not in (None, "en") and not language.startswith("en-"):
            raise RequestError(f"speech is recognized in English only (Whisper tiny.en), not "
                               f"{language!r}", "unsupported-language")
        self.mode = "transcribe"

    async def _run_pipeline(self, event: Event) -> None:
        start = event.data.get("start_stage")
        end = event.data.get("end_stage")
        if start != "asr":
            raise RequestError(f"pipelines start at the 'asr' stage here (no wake word "
                               f"detection), not {start!r}", "unsupported-stage")
        if end not in ("asr", "handle", "intent", "tts"):
            raise RequestError(f"a pipeline ends at 'asr', 'handle' or 'tts', not {end!r}",
                               "unsupported-stage")
        self.mode = "pipeline"
        self.turns.end_stage = "handle" if end == "intent" else end

    async def _audio_start(self, event: Event) -> None:
        self._refusing_audio = False
        try:
            converter = AudioConverter(*check_format(event.data))
        except AudioFormatError as exc:
            self._refusing_audio = True
            raise RequestError(str(exc), "unsupported-audio") from exc
        self.listener = self.turns.listen(converter, pipeline=self.mode == "pipeline")

    async def _audio_chunk(self, event: Event) -> None:
        if self._refusing_audio:
            return
        if self.listener is None:
            self._refusing_audio = True
            raise RequestError("audio-chunk without audio-start: send audio-start (with rate, "
                               "width, channels) first; the chunks until then are dropped",
                               "no-audio-start")
        try:
            await self.listener.push(event.data, event.payload or b"")
        except AudioFormatError as exc:
            self._refusing_audio, self.listener = True, None
            raise RequestError(f"{exc}; the audio until the next audio-start is dropped",
                               "unsupported-audio") from exc

    async def _audio_stop(self, event: Event) -> None:
        listener, self.listener = self.listener, None
        self._refusing_audio = False
        if listener is None:
            return
        self.busy += 1
        try:
            await listener.finish()
        finally:
            self.busy -= 1

    async def _transcript(self, event: Event) -> None:
        text = event.data.get("text")
        if not isinstance(text, str):
            raise RequestError(f"a transcript's text must be a string, got {text!r}",
                               "bad-transcript")
        context = event.data.get("context") if isinstance(event.data.get("context"), dict) else None
        self.busy += 1
        try:
            turn = await self.turns.handle_text(text, context)
        finally:
            self.busy -= 1
        if turn.get("answer"):
            await self.send(Handled(text=turn["answer"], context=context).event())
        else:  # nothing heard in it, or the engine refused it: say which
            await self.send(NotHandled(text=turn.get("skipped", "not answered"),
                                       context=context).event())

    async def _synthesize(self, event: Event) -> None:
        text, name = synthesize_request(event.data, self.shared.config.tts_voice)
        self.busy += 1
        try:
            await speak(self.send, text, name)
        finally:
            self.busy -= 1


def _optional_text(data: dict, key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{key} must be a string, got {value!r}", "bad-event")
    return value


_HANDLERS = {
    "describe": Connection._describe,
    "ping": Connection._ping,
    "transcribe": Connection._transcribe,
    "run-pipeline": Connection._run_pipeline,
    "audio-start": Connection._audio_start,
    "audio-chunk": Connection._audio_chunk,
    "audio-stop": Connection._audio_stop,
    "transcript": Connection._transcript,
    "synthesize": Connection._synthesize,
}
