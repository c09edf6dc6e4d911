"""A Wyoming `synthesize` request checked, and text spoken as `audio-start`, `audio-chunk`s (espeak-
ng's PCM as it comes, voice/tts.py) and `audio-stop`."""

from __future__ import annotations

import contextlib
import re
import time

from wyoming.audio import AudioChunk, AudioStart, AudioStop

from edge_runtime.errors import EdgeError
from edge_runtime.voice.tts import speak_pcm
from edge_runtime.voice.wyoming_shared import RequestError

MAX_SPOKEN_CHARS = 2000  # one `synthesize`: a paragraph; longer text is refused, not cut
VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+\-/]{0,63}")  # espeak-ng voice names


def synthesize_request(data: dict, default_voice: str) -> tuple[str, str]:
    """A `synthesize` event's data -> (text, voice), or RequestError saying what is wrong."""
    text = data.get("text")
    if not isinstance(text, str) or not text.strip():
        raise RequestError(f"synthesize needs a non-empty text, got {text!r}", "bad-synthesize")
    if len(text) > MAX_SPOKEN_CHARS:
        raise RequestError(f"synthesize text of {len(text)} characters is over "
                           f"{MAX_SPOKEN_CHARS}: send it a few sentences at a time",
                           "text-too-long")
    voice = data.get("voice") if isinstance(data.get("voice"), dict) else {}
    name = voice.get("name") or default_voice
    if not isinstance(name, str) or not VOICE_NAME.fullmatch(name):
        raise RequestError(f"voice name {name!r} is not an espeak-ng voice name (e.g. en-us)",
                           "bad-voice")
    return text, name


async def speak(send, text: str, voice: str) -> float | None:
    """`text` as audio-start, audio-chunks, audio-stop through `send`; -> perf_counter() when the
    first chunk went out (None when espeak-ng made no audio). A failing espeak-ng (e.g. an unknown
    voice) is a RequestError."""
    first = None
    timestamp_ms = 0
    fmt = None
    try:
        # aclosing: a client gone mid-answer (send raises) kills espeak-ng now, not at GC
        async with contextlib.aclosing(speak_pcm(text, voice)) as pieces:
            async for item in pieces:
                if fmt is None:
                    fmt = item
                    await send(AudioStart(rate=fmt.rate, width=fmt.width,
                                          channels=fmt.channels).event())
                    continue
                await send(AudioChunk(rate=fmt.rate, width=fmt.width, channels=fmt.channels,
                                      audio=item, timestamp=timestamp_ms).event())
                first = first or time.perf_counter()
                timestamp_ms += 1000 * len(item) // (fmt.rate * fmt.width * fmt.channels)
    except EdgeError as exc:
        raise RequestError(f"speech synthesis failed: {exc}", "tts-failed") from exc
    if fmt is not None:
        await send(AudioStop(timestamp=timestamp_ms).event())
    return first
