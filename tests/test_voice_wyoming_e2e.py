"""End to end through the Wyoming server with the real SmolLM2 engine, Whisper tiny.en and
espeak-ng, with the `wyoming` package's client on 127.0.0.1: describe/info, a spoken command
transcribed, a typed command handled with the home's actions, and five satellites streaming spoken
commands at once in real time (every command heard, answered and spoken back; later turns served
from the prefix cache); afterwards no connection and no KV page left behind."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.info import Describe, Info

from edge_runtime.bench.wyoming_bench import summarize
from edge_runtime.voice.wyoming_satellite import run_satellite, spoken_commands
from edge_runtime.voice.command_set import SPEED, VOICES
from edge_runtime.voice.config import CONFIG_DIR, load_voice_config
from edge_runtime.voice.demo import DEMO_COMMANDS
from edge_runtime.voice.report import wer
from edge_runtime.voice.tts import synthesize
from voice_helpers import needs_espeak
from wyoming_helpers import HOST, ServerThread, pcm16, send_audio

pytestmark = [pytest.mark.slow, needs_espeak]


@pytest.fixture(scope="module")
def server():
    from edge_runtime.model.loader import DEFAULT_MODEL
    from edge_runtime.voice.session import load_runtime

    config = dataclasses.replace(load_voice_config(), engine_threads=1,
                                 system_prompt=CONFIG_DIR / "home-actions.yaml")
    runtime = load_runtime(config, DEFAULT_MODEL, 5, progress=lambda m: None)
    try:
        with ServerThread(runtime, config, DEFAULT_MODEL) as srv:
            yield srv
    finally:
        runtime.close()


def test_describe_names_whisper_and_the_model(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Describe().event())
            return Info.from_event(await client.read_event())

    info = asyncio.run(main())
    assert info.asr[0].models[0].name.startswith("whisper:")
    assert info.handle[0].models[0].name == server.model_name
    assert info.handle[0].supports_home_control  # home-actions.yaml has actions


def test_a_spoken_command_is_transcribed(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Transcribe(language="en").event())
            await send_audio(client, pcm16(synthesize("close the garage door", "en-us")))
            return Transcript.from_event(await client.read_event()).text

    assert wer([("close the garage door", asyncio.run(main()))]) <= 0.25


def test_a_typed_command_runs_the_action_and_says_so(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Transcript(text="turn on the kitchen lights").event())
            return await client.read_event()

    handled = asyncio.run(main())
    assert handled.type == "handled" and "kitchen" in handled.data["text"].lower()
    (event,) = [e for e in server.events if e.get("transcript") == "turn on the kitchen lights"]
    assert event["action"]["ok"] and event["action"]["name"] == "turn_on"
    assert event["action"]["arguments"]["device"] == "kitchen lights"


def test_five_satellites_at_once_are_heard_answered_and_spoken_back(server):
    spoken = [spoken_commands(list(DEMO_COMMANDS[i][:2]), VOICES[i], SPEED) for i in range(5)]
    first = len(server.turns)

    async def main():
        return await asyncio.gather(*(run_satellite(HOST, server.port, s, 0.6 * i, 600)
                                      for i, s in enumerate(spoken)))

    runs = asyncio.run(main())
    assert server.wait_for(lambda: len(server.turns) >= first + 10)
    result = summarize(spoken, runs, server.turns[first:])
    assert result["errors"] == []
    assert result["commands"] == result["transcribed"] == result["answered"] == 10
    assert result["spoken_back"] == 10
    assert result["wer"] <= 0.15
    assert result["later_turns_cached"] >= 0.8  # the system prompt's pages, shared
    assert len({t["stream"] for t in server.turns[first:]}) == 5  # one stream per connection


def test_nothing_is_left_behind(server):
    assert server.wait_for(lambda: server.call(lambda: len(server.server.connections)) == 0)
    engine = server.runtime.aengine

    async def check():
        return await engine.call(lambda e: e.kv.check_leaks())

    asyncio.run(check())  # raises on a live page or slot with no sequence running
