"""edge_runtime/voice/loop.py scheduling, with an engine double: one stream's recognition never
blocks another stream's generation, and a stream's turns stay in order while its recognition runs
ahead."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent
from edge_runtime.voice.asr import ASRPool
from edge_runtime.voice.audio_input import InputSpec, Source
from edge_runtime.voice.loop import LoopSettings, VoiceLoop
from edge_runtime.voice.tts import write_wav
from edge_runtime.voice.vad import VADConfig
from voice_helpers import smollm2_tokenizer


class EchoEngine:
    """Answers every prompt with its last 3 token ids (the AsyncEngine.stream contract)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts: list[list[int]] = []

    async def stream(self, prompt_ids, params=None, request_id=None, stream_id=None):
        self.prompts.append(list(prompt_ids))
        await asyncio.sleep(0.5)  # generation takes a while, so the streams overlap
        ids = list(prompt_ids[-3:])
        yield TokenEvent(request_id, 0, ids, self.tokenizer.decode(ids))
        yield TokenEvent(request_id, 0, [], "", result=GenerationResult(
            request_id, len(prompt_ids), 0, [Completion(self.tokenizer.decode(ids), ids, "stop")]))


class GatedRecognizer:
    """Blocks every recognition until `gate` is set; names utterances by their length."""

    def __init__(self):
        self.gate = threading.Event()
        self.started = threading.Event()

    def transcribe(self, audio):
        self.started.set()
        self.gate.wait(30)
        return f"command of {len(audio)} samples"


def _two_bursts(path):
    rng = np.random.default_rng(0)
    quiet = 1e-4 * rng.standard_normal(12000)
    loud = 0.2 * rng.standard_normal(12000)
    write_wav(path, np.concatenate([quiet, loud, quiet, quiet, loud, quiet, quiet])
              .astype(np.float32))


def test_blocked_recognition_does_not_block_other_streams(tmp_path):
    tok = smollm2_tokenizer()
    _two_bursts(tmp_path / "a.wav")
    (tmp_path / "b.txt").write_text("turn on the radio\nlock the door\n")
    recognizer = GatedRecognizer()
    pool = ASRPool(recognizer, 1)
    events = []

    def on_event(ev):  # was stream 0's recognition blocked when this event came out?
        events.append((ev, recognizer.started.is_set() and not recognizer.gate.is_set()))

    loop = VoiceLoop(EchoEngine(tok), tok, pool, "system", LoopSettings(
        vad=VADConfig(backend="energy"), max_tokens=4), eos_token_ids=(2,), on_event=on_event)

    async def main():
        task = asyncio.ensure_future(loop.run([Source(InputSpec("wav", tmp_path / "a.wav")),
                                               Source(InputSpec("text", tmp_path / "b.txt"))]))
        while sum(ev["stream"] == 1 for ev, _ in events) < 2:  # stream 1 finishes both turns
            await asyncio.sleep(0.01)
        recognizer.gate.set()  # only now can stream 0 recognise anything
        return await task

    try:
        reports = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        recognizer.gate.set()
        pool.close()
    a, b = reports
    stream1 = [blocked for ev, blocked in events if ev["stream"] == 1]
    assert stream1[-1], "stream 1's second answer came out while stream 0's ASR was blocked"
    first0 = next(i for i, (ev, _) in enumerate(events) if ev["stream"] == 0)
    assert first0 > max(i for i, (ev, _) in enumerate(events) if ev["stream"] == 1)
    assert [ev["utterance"] for ev in a.events] == [0, 1]  # in order, both recognised
    assert all(ev["answer"] for ev in a.events + b.events)
    assert a.events[1]["reused_prompt_tokens"] > 0  # turn 2 extends turn 1's prompt + answer
