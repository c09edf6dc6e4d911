"""Shared helpers of the Wyoming tests: the server run in a thread of its own (its own event
loop, like the CLI's), engine and recognizer doubles, and a client that speaks to it with the
`wyoming` package's own AsyncTcpClient on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient

from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent
from edge_runtime.voice.session import Runtime
from edge_runtime.voice.wyoming_service import wyoming_server

HOST = "127.0.0.1"  # the tests never listen or connect anywhere else


class AnswerEngine:
    """The AsyncEngine.stream contract, answering every prompt with `answer`; counts the
    requests still streaming (0 when none was left behind)."""

    def __init__(self, tokenizer, answer: str = "OK.", delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.answer = answer
        self.delay_s = delay_s
        self.prompts: list[list[int]] = []
        self.streaming = 0

    async def stream(self, prompt_ids, params=None, request_id=None, stream_id=None):
        self.prompts.append(list(prompt_ids))
        self.streaming += 1
        try:
            await asyncio.sleep(self.delay_s)
            ids = self.tokenizer.encode(self.answer, add_special_tokens=False)
            yield TokenEvent(request_id, 0, ids, self.answer)
            yield TokenEvent(request_id, 0, [], "", result=GenerationResult(
                request_id, len(prompt_ids), 0, [Completion(self.answer, ids, "stop")]))
        finally:
            self.streaming -= 1

    def shutdown(self) -> None:
        pass


class FixedRecognizer:
    """Hears `text` in any audio; records the lengths it was given."""

    name = "fixed"

    def __init__(self, text: str = "turn on the kitchen lights"):
        self.text = text
        self.lengths: list[int] = []

    def transcribe(self, audio) -> str:
        self.lengths.append(len(audio))
        return self.text


def double_runtime(tokenizer, answer: str = "OK.", delay_s: float = 0.0,
                   heard: str = "turn on the kitchen lights") -> Runtime:
    return Runtime(tokenizer, (tokenizer.eos_token_id,), AnswerEngine(tokenizer, answer, delay_s),
                   FixedRecognizer(heard))


class ServerThread:
    """`wyoming_server` on 127.0.0.1 (a free port) in a thread with its own event loop."""

    def __init__(self, runtime: Runtime, config, model_name: str = "test-model"):
        self.runtime, self.config, self.model_name = runtime, config, model_name
        self.turns: list[dict] = []
        self.events: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="wyoming-test-server", daemon=True)

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        self._ready.wait(120)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the Wyoming server did not stop"

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self._error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with wyoming_server(self.runtime, self.config, HOST, 0, self.model_name,
                                  on_event=self.events.append,
                                  on_turn=self.turns.append) as (server, address):
            self.server, self.port = server, address[1]
            self._ready.set()
            await self._stop.wait()

    def call(self, fn):
        """fn() on the server's loop (its state is only touched there)."""
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def wait_for(self, condition, timeout_s: float = 30.0) -> bool:
        """Poll `condition()` (the server thread finishes a turn after its last event is sent)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def client(self, read_timeout: float = 60.0) -> AsyncTcpClient:
        return AsyncTcpClient(HOST, self.port, connect_timeout=10, read_timeout=read_timeout)


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


async def send_audio(client, pcm: bytes, rate: int = 16000, width: int = 2, channels: int = 1,
                     chunk_samples: int = 1024, realtime: bool = False, stop: bool = True) -> None:
    await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
    step = chunk_samples * width * channels
    for i in range(0, len(pcm), step):
        await client.write_event(AudioChunk(rate=rate, width=width, channels=channels,
                                            audio=pcm[i : i + step]).event())
        if realtime:
            await asyncio.sleep(chunk_samples / rate)
    if stop:
        await client.write_event(AudioStop().event())


async def read_until(client, types: set[str], limit: int = 10_000) -> list:
    """Events up to and including the first of `types` (None: the server closed)."""
    seen = []
    for _ in range(limit):
        event = await client.read_event()
        seen.append(event)
        if event is None or event.type in types:
            return seen
    raise AssertionError(f"no event of {types} in {limit} events")
