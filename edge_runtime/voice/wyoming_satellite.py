"""A Wyoming satellite for measurements: spoken commands streamed to a Wyoming server in real time
with the `wyoming` package's AsyncTcpClient, as a satellite streams its microphone (`run-pipeline`
asr -> tts, then audio-chunks of 32 ms, silence after the last command until every reply came).

The clock: a command's end of speech is the moment the chunk holding its last speech sample was
sent; its reply latency ends when the first audio-chunk of its answer arrives. Replies are matched
to commands in order (the server answers a connection's commands in order).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.pipeline import PipelineStage, RunPipeline

from edge_runtime.voice.tts import synthesize
from edge_runtime.voice.wav_file import SAMPLE_RATE

CHUNK_SAMPLES = 512  # 32 ms, a satellite's usual chunk
SPEECH_LEVEL = 0.01  # |sample| above this is speech (espeak-ng's output is silent between words)


@dataclass
class SpokenCommands:
    audio: np.ndarray  # float32 [n] at 16 kHz: lead, command, gap, command, ..., tail
    texts: list[str]
    speech_end: list[int]  # sample index just after each command's last speech sample


def spoken_commands(texts: list[str], voice: str, speed: int, lead_s: float = 0.5,
                    gap_s: float = 1.5, tail_s: float = 1.0) -> SpokenCommands:
    parts = [np.zeros(int(lead_s * SAMPLE_RATE), np.float32)]
    ends = []
    offset = len(parts[0])
    for i, text in enumerate(texts):
        speech = synthesize(text, voice, speed)
        loud = np.flatnonzero(np.abs(speech) > SPEECH_LEVEL)
        ends.append(offset + (int(loud[-1]) + 1 if len(loud) else len(speech)))
        silence = np.zeros(int((tail_s if i == len(texts) - 1 else gap_s) * SAMPLE_RATE),
                           np.float32)
        parts += [speech, silence]
        offset += len(speech) + len(silence)
    return SpokenCommands(np.concatenate(parts), list(texts), ends)


@dataclass
class Reply:
    transcript: str | None = None
    answer: str | None = None
    speech_end_wall: float | None = None  # perf_counter(): its end of speech was sent
    first_audio_wall: float | None = None  # perf_counter(): its first reply audio arrived
    audio_bytes: int = 0
    done: bool = False

    @property
    def latency_s(self) -> float | None:
        if self.speech_end_wall is None or self.first_audio_wall is None:
            return None
        return self.first_audio_wall - self.speech_end_wall


@dataclass
class SatelliteRun:
    replies: list[Reply] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the server's error events


async def run_satellite(host: str, port: int, spoken: SpokenCommands, start_delay_s: float = 0.0,
                        timeout_s: float = 120.0) -> SatelliteRun:
    """Stream `spoken` in real time on one connection; -> a Reply per command heard."""
    await asyncio.sleep(start_delay_s)
    run = SatelliteRun([Reply() for _ in spoken.texts])
    async with AsyncTcpClient(host, port, connect_timeout=10) as client:
        await client.write_event(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
        receiving = asyncio.create_task(_receive(client, run))
        try:
            await asyncio.wait_for(_stream(client, spoken, run, receiving), timeout_s)
        finally:
            receiving.cancel()
    return run


async def _stream(client, spoken: SpokenCommands, run: SatelliteRun, receiving) -> None:
    fmt = dict(rate=SAMPLE_RATE, width=2, channels=1)
    await client.write_event(AudioStart(**fmt).event())
    pcm = (np.clip(spoken.audio, -1, 1) * 32767).astype("<i2")
    silence = np.zeros(CHUNK_SAMPLES, "<i2").tobytes()
    start = time.perf_counter()
    n = 0
    next_end = 0
    while not receiving.done():
        lo = n * CHUNK_SAMPLES
        chunk = pcm[lo : lo + CHUNK_SAMPLES].tobytes() if lo < len(pcm) else silence
        await asyncio.sleep(max(0.0, start + n * CHUNK_SAMPLES / SAMPLE_RATE - time.perf_counter()))
        await client.write_event(AudioChunk(audio=chunk, **fmt).event())
        sent = time.perf_counter()
        while next_end < len(spoken.speech_end) and spoken.speech_end[next_end] <= lo + CHUNK_SAMPLES:
            run.replies[next_end].speech_end_wall = sent
            next_end += 1
        n += 1
    await client.write_event(AudioStop().event())


async def _receive(client, run: SatelliteRun) -> None:
    """Events -> replies, in order; returns when every command has its reply audio."""
    index = 0
    while index < len(run.replies):
        event = await client.read_event()
        if event is None:
            run.errors.append("the server closed the connection")
            return
        reply = run.replies[index]
        if event.type == "transcript":
            reply.transcript = event.data.get("text", "")
            if not reply.transcript:  # nothing heard: no answer comes
                index += 1
        elif event.type == "handled":
            reply.answer = event.data.get("text", "")
        elif event.type == "not-handled":
            index += 1
        elif event.type == "audio-chunk":
            reply.first_audio_wall = reply.first_audio_wall or time.perf_counter()
            reply.audio_bytes += len(event.payload or b"")
        elif event.type == "audio-stop":
            reply.done = True
            index += 1
        elif event.type == "error":
            run.errors.append(event.data.get("text", ""))
