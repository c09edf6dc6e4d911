"""The Wyoming server (voice/wyoming_*.py) with an engine double and a recognizer double, through
the `wyoming` package's own AsyncTcpClient on 127.0.0.1: describe/info, transcribe (audio
converted from other formats), synthesize (espeak-ng's chunks), transcript -> handled, a satellite
pipeline cut by the VAD, and the bad input: malformed events, audio it cannot convert, audio sent
forever, a client gone mid-utterance or mid-answer, 50 idle connections, the idle timeout."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart
from wyoming.event import Event
from wyoming.handle import Handled
from wyoming.info import Describe, Info
from wyoming.pipeline import PipelineStage, RunPipeline
from wyoming.tts import Synthesize, SynthesizeVoice

from edge_runtime import listen_address
from edge_runtime.errors import ConfigError
from edge_runtime.import_path import code_argv
from edge_runtime.voice.config import load_voice_config
from edge_runtime.voice.session import Runtime
from edge_runtime.voice.vad import VADConfig
from edge_runtime.voice.wyoming_config import WyomingConfig, is_loopback, parse_listen
from edge_runtime.voice.wyoming_service import exposure_warning
from voice_helpers import needs_espeak, smollm2_tokenizer
from wyoming_helpers import (HOST, AnswerEngine, ServerThread, double_runtime, pcm16,
                             read_until, send_audio)


def _config(**wyoming):
    base = load_voice_config()
    return dataclasses.replace(base, vad=VADConfig(backend="energy"),
                               wyoming=dataclasses.replace(base.wyoming, **wyoming))


def _bursts(rng, rate=16000, n=2, speech_s=0.8, gap_s=1.0):
    """Loud noise bursts between quiet stretches: the energy VAD cuts one utterance per burst."""
    quiet = lambda s: 1e-4 * rng.standard_normal(int(rate * s))  # noqa: E731
    parts = [quiet(0.5)]
    for _ in range(n):
        parts += [0.3 * rng.standard_normal(int(rate * speech_s)), quiet(gap_s)]
    return np.concatenate(parts).astype(np.float32)


@pytest.fixture
def server(request):
    settings = getattr(request, "param", {})
    runtime = double_runtime(smollm2_tokenizer(), delay_s=settings.pop("delay_s", 0.0))
    with ServerThread(runtime, _config(**settings)) as srv:
        yield srv


def test_describe_answers_info_with_asr_tts_and_handle(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Describe().event())
            return Info.from_event(await client.read_event())

    info = asyncio.run(main())
    assert [p.name for p in info.asr] == ["edge-runtime-asr"]
    assert info.asr[0].models[0].name == "fixed" and info.asr[0].models[0].languages == ["en"]
    assert info.tts[0].voices[0].name == "en-us"
    assert info.handle[0].models[0].name == "test-model"


def test_transcribe_converts_48k_stereo_32bit_audio(server):
    rng = np.random.default_rng(1)
    seconds = 1.5
    left = 0.2 * rng.standard_normal(int(48000 * seconds))
    stereo = np.stack([left, 0.5 * left], axis=1)
    pcm = (np.clip(stereo, -1, 1) * (2 ** 31 - 1)).astype("<i4").tobytes()

    async def main():
        async with server.client() as client:
            await client.write_event(Transcribe(language="en").event())
            await send_audio(client, pcm, rate=48000, width=4, channels=2)
            return await client.read_event()

    event = asyncio.run(main())
    assert Transcript.is_type(event.type), event
    assert Transcript.from_event(event).text == "turn on the kitchen lights"
    heard = server.runtime.recognizer.lengths
    assert len(heard) == 1 and abs(heard[0] - 16000 * seconds) <= 512  # 16 kHz, whole frames


@pytest.mark.parametrize("fmt, words", [
    ({"rate": 16000, "width": 5, "channels": 1}, "width 5"),
    ({"rate": 1000, "width": 2, "channels": 1}, "rate 1000 Hz"),
    ({"rate": 16000, "width": 2, "channels": 12}, "12 channels"),
    ({"rate": "fast", "width": 2, "channels": 1}, "rate must be a whole number"),
])
def test_unsupported_audio_is_an_error_event_and_the_connection_goes_on(server, fmt, words):
    async def main():
        async with server.client() as client:
            await client.write_event(Transcribe().event())
            await client.write_event(Event("audio-start", fmt))
            await client.write_event(Event("audio-chunk", fmt, b"\0" * 64))  # dropped, unsaid
            await client.write_event(Describe().event())
            return await read_until(client, {"info"})

    error, info = asyncio.run(main())
    assert error.type == "error" and error.data["code"] == "unsupported-audio", error
    assert words in error.data["text"] and "send 16-bit" in error.data["text"]
    assert info.type == "info"


def test_a_chunk_that_is_not_whole_samples_is_refused(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Transcribe().event())
            fmt = {"rate": 16000, "width": 2, "channels": 2}
            await client.write_event(Event("audio-start", fmt))
            await client.write_event(Event("audio-chunk", fmt, b"\0" * 6))
            return await client.read_event()

    error = asyncio.run(main())
    assert error.data["code"] == "unsupported-audio" and "6 bytes" in error.data["text"]


def _raw_exchange(port: int, data: bytes, half_close: bool = False) -> bytes:
    """Send `data` (then end the sending side when `half_close`); -> all the server sent back
    until it closed the connection."""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)  # the server closed the connection
            chunks.append(chunk)


@pytest.mark.parametrize("data, words", [
    (b"this is not json\n", "not a Wyoming event"),
    (b'{"data": {"text": "hi"}}\n', "not a Wyoming event"),
    (b'[1, 2, 3]\n', "not a Wyoming event"),
    (b'{"type": "synthesize", "data_length": 5}\n[1,2]', "not a Wyoming event"),
    (b'{"type": "audio-chunk", "payload_length": 10000000000}\n', "payload_length"),
    (b'{"type": "transcript", "data_length": 900000}\n', "data_length"),
    (b'{"type": "x", ' + b'"pad": "' + b"a" * 70000 + b'"}\n', "longer than"),
    (b'{"type": "audio-chunk", "payload_length": 100}\nshort', "closed in the middle"),
])
def test_malformed_events_get_an_error_event_and_a_closed_connection(server, data, words):
    async def other_client():  # connected before, still served after
        async with server.client() as client:
            reply = await asyncio.to_thread(_raw_exchange, server.port, data)
            await client.write_event(Describe().event())
            return reply, await client.read_event()

    if words == "closed in the middle":  # the client itself stops sending: close its side
        reply = _raw_exchange(server.port, data, half_close=True)
    else:
        reply, info = asyncio.run(other_client())
        assert info.type == "info"
    header = reply.split(b"\n", 1)[0]
    assert b'"type": "error"' in header, reply[:200]
    assert words.encode() in reply
    assert server.wait_for(lambda: server.call(lambda: len(server.server.connections)) == 0)


def test_unknown_events_are_ignored_and_bad_fields_are_named(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Event("no-such-event", {"x": 1}))
            await client.write_event(Event("transcript", {"text": 42}))
            await client.write_event(Event("synthesize", {"text": "hi", "voice": {"name": "-x"}}))
            await client.write_event(RunPipeline(PipelineStage.WAKE, PipelineStage.TTS).event())
            await client.write_event(Describe().event())
            return await read_until(client, {"info"})

    events = asyncio.run(main())
    assert [e.type for e in events] == ["error", "error", "error", "info"]
    assert [e.data["code"] for e in events[:3]] == ["bad-transcript", "bad-voice",
                                                    "unsupported-stage"]


def test_transcript_is_handled_with_the_answer(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Transcript(text="turn on the radio").event())
            first = await client.read_event()
            await client.write_event(Transcript(text="and off again").event())
            second = await client.read_event()
            await client.write_event(Transcript(text="  ").event())
            return first, second, await client.read_event()

    first, second, empty = asyncio.run(main())
    assert empty.type == "not-handled" and empty.data["text"] == "no speech recognised"
    assert Handled.is_type(first.type) and first.data["text"] == "OK."
    prompts = server.runtime.aengine.prompts
    tok = server.runtime.tokenizer
    # the connection keeps its history: the second prompt extends the first turn
    assert "turn on the radio" in tok.decode(prompts[-1]) and second.data["text"] == "OK."


def test_a_conversation_id_keeps_its_history_across_connections(server):
    """Home Assistant opens a connection per sentence and names the conversation in the context."""
    async def say(text, conversation_id=None):
        context = {"conversation_id": conversation_id} if conversation_id else None
        async with server.client() as client:
            await client.write_event(Transcript(text=text, context=context).event())
            return await client.read_event()

    async def main():
        handled = await say("turn on the radio", "01HS6SP2XD1E5HEHVDZE8R2WMR")
        await say("lock the door")  # no conversation: its own connection's history only
        await say("and the garage", "01HS6SP2XD1E5HEHVDZE8R2WMR")
        return handled

    handled = asyncio.run(main())
    assert handled.data["context"] == {"conversation_id": "01HS6SP2XD1E5HEHVDZE8R2WMR"}
    tok = server.runtime.tokenizer
    last = tok.decode(server.runtime.aengine.prompts[-1])
    assert "turn on the radio" in last and "lock the door" not in last
    assert server.call(lambda: len(server.server.shared.conversations)) == 1


@needs_espeak
def test_synthesize_streams_espeak_audio_in_chunks(server):
    async def main():
        async with server.client() as client:
            await client.write_event(Synthesize(
                text="The kitchen lights are on now, and the radio is off.",
                voice=SynthesizeVoice(name="en-gb")).event())
            events = await read_until(client, {"audio-stop"})
            await client.write_event(Synthesize(text="hello",
                                                voice=SynthesizeVoice(name="xx-none")).event())
            return events, await client.read_event()

    events, error = asyncio.run(main())
    assert events[0].type == "audio-start" and events[0].data["rate"] == 22050
    chunks = [e for e in events if e.type == "audio-chunk"]
    assert len(chunks) >= 5 and events[-1].type == "audio-stop"
    audio = np.frombuffer(b"".join(c.payload for c in chunks), "<i2")
    assert 1.5 < len(audio) / 22050 < 8 and np.abs(audio).max() > 1000  # speech, not silence
    assert error.type == "error" and error.data["code"] == "tts-failed"


@needs_espeak
def test_a_client_gone_mid_speech_leaves_no_espeak_running(server):
    import psutil

    def speaking() -> int:
        return sum(p.name() == "espeak-ng" for p in psutil.Process().children(recursive=True))

    async def main():
        async with server.client() as client:
            await client.write_event(Synthesize(text="The lights are on. " * 100).event())
            start = await client.read_event()
            await client.read_event()  # the first chunk: espeak-ng is still speaking
            return start, speaking()

    start, during = asyncio.run(main())
    assert start.type == "audio-start" and during == 1
    assert server.wait_for(lambda: speaking() == 0)
    assert server.wait_for(lambda: server.call(lambda: len(server.server.connections)) == 0)


@needs_espeak
def test_pipeline_cuts_a_satellite_stream_into_answered_commands(server):
    audio = _bursts(np.random.default_rng(2))

    async def main():
        async with server.client() as client:
            await client.write_event(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
            await send_audio(client, pcm16(audio), stop=False)
            events = []
            for _ in range(2):
                events += await read_until(client, {"audio-stop"})
            return events

    events = asyncio.run(main())
    kinds = [e.type for e in events if e.type != "audio-chunk"]
    # voice-stopped goes out as each command is cut, the rest of a command's replies in order
    assert [k for k in kinds if k != "voice-stopped"] == \
        ["transcript", "handled", "audio-start", "audio-stop"] * 2
    assert kinds.count("voice-stopped") == 2 and kinds[0] == "voice-stopped"
    assert server.wait_for(lambda: len(server.turns) == 2)
    assert all(t["reply_audio_s"] > 0 for t in server.turns)
    assert [t["utterance"] for t in server.turns] == [0, 1]
    assert all(t["asr_from_draft"] for t in server.turns)  # no speech resumed: each draft taken


class LengthRecognizer:
    """Hears how long the utterance was, so each satellite's commands read differently."""

    name = "length"

    def __init__(self):
        self.lengths: list[int] = []

    def transcribe(self, audio) -> str:
        self.lengths.append(len(audio))
        return self.heard(len(audio))

    @staticmethod
    def heard(num_samples: int) -> str:
        return f"set a timer for {round(num_samples / 1600)} tenths"


@needs_espeak
def test_recognition_starts_before_the_cut_and_a_draft_whose_speech_resumes_is_dropped():
    """The VAD's settled draft (pad_ms of silence after the speech) is recognized before the cut;
    a pause past pad_ms but short of min_silence_ms makes a draft that speech then overtakes: the
    command is heard whole, once."""
    tok = smollm2_tokenizer()
    recognizer = LengthRecognizer()
    runtime = Runtime(tok, (tok.eos_token_id,), AnswerEngine(tok), recognizer)
    rng = np.random.default_rng(30)
    quiet = lambda s: 1e-4 * rng.standard_normal(int(16000 * s))  # noqa: E731
    loud = lambda s: 0.3 * rng.standard_normal(int(16000 * s))  # noqa: E731
    # speech, a 256 ms pause (past pad_ms 160, short of min_silence_ms 400), speech, 256 ms quiet
    spoken = np.concatenate([quiet(0.5), loud(0.6), quiet(0.256), loud(0.6), quiet(0.256)])
    fmt = {"rate": 16000, "width": 2, "channels": 1}

    async def chunks(client, audio):
        pcm = pcm16(audio.astype(np.float32))
        for i in range(0, len(pcm), 1024):
            await client.write_event(AudioChunk(audio=pcm[i:i + 1024], **fmt).event())

    with ServerThread(runtime, _config()) as server:
        async def main():
            async with server.client() as client:
                await client.write_event(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
                await client.write_event(AudioStart(**fmt).event())
                await chunks(client, spoken)
                # not cut yet (the silence is short of min_silence_ms): recognized all the same
                whole = await asyncio.to_thread(server.wait_for, lambda: any(
                    n > 1.4 * 16000 for n in recognizer.lengths))
                await chunks(client, quiet(1.0))
                events = await read_until(client, {"audio-stop"})
                return whole, [e.data["text"] for e in events if e.type == "transcript"]

        whole, heard = asyncio.run(main())
        assert server.wait_for(lambda: len(server.turns) == 1)
    assert whole
    assert heard == [LengthRecognizer.heard(max(recognizer.lengths))]
    assert len(recognizer.lengths) <= 2  # the overtaken draft (if it ran) and the whole command
    assert server.turns[0]["asr_from_draft"] and "asr_done_s" in server.turns[0]


@needs_espeak
def test_five_satellites_at_once_keep_their_own_histories():
    tok = smollm2_tokenizer()
    engine = AnswerEngine(tok, delay_s=0.3)  # answers overlap across the satellites
    runtime = Runtime(tok, (tok.eos_token_id,), engine, LengthRecognizer())
    # bursts of 0.3 + 0.6 i and 0.6 + 0.6 i s: every command of every satellite heard differently
    audios = [np.concatenate([_bursts(np.random.default_rng(10 + i), n=1, speech_s=0.3 + 0.6 * i),
                              _bursts(np.random.default_rng(20 + i), n=1, speech_s=0.6 + 0.6 * i)])
              for i in range(5)]
    with ServerThread(runtime, _config()) as server:
        async def satellite(audio):
            async with server.client() as client:
                await client.write_event(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
                await send_audio(client, pcm16(audio), stop=False)
                events = []
                for _ in range(2):
                    events += await read_until(client, {"audio-stop"})
                return [e.data["text"] for e in events if e.type == "transcript"]

        async def main():
            return await asyncio.gather(*(satellite(a) for a in audios))

        heard = asyncio.run(main())
        assert server.wait_for(lambda: len(server.turns) == 10)
    assert len({text for h in heard for text in h}) == 10  # every command heard differently
    by_stream = {}
    for turn in server.turns:
        by_stream.setdefault(turn["stream"], []).append(turn)
    assert len(by_stream) == 5 and all(len(t) == 2 for t in by_stream.values())
    for first, second in by_stream.values():  # each second prompt holds its own first turn only
        prompt = tok.decode(next(p for p in engine.prompts
                                 if second["transcript"] in tok.decode(p)))
        others = [t[0]["transcript"] for t in by_stream.values() if t[0] is not first]
        assert first["transcript"] in prompt and not any(o in prompt for o in others)
    assert engine.streaming == 0


@pytest.mark.parametrize("server", [{"max_audio_s": 1.0}], indirect=True)
def test_transcribe_audio_sent_forever_is_cut_off(server):
    rng = np.random.default_rng(3)

    async def main():
        async with server.client() as client:
            await client.write_event(Transcribe().event())
            await send_audio(client, pcm16(0.2 * rng.standard_normal(16000 * 5)), stop=False)
            error = await client.read_event()
            await client.write_event(Describe().event())
            return error, await client.read_event()

    error, info = asyncio.run(main())
    assert error.data["code"] == "audio-too-long" and "1 s" in error.data["text"]
    assert info.type == "info" and server.runtime.recognizer.lengths == []


def test_pipeline_speech_without_a_pause_is_refused_once():
    config = _config()
    config = dataclasses.replace(config, vad=VADConfig(backend="energy", max_utterance_s=2))
    rng = np.random.default_rng(4)
    with ServerThread(double_runtime(smollm2_tokenizer()), config) as server:
        async def main():
            async with server.client() as client:
                await client.write_event(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
                noise = np.concatenate([1e-4 * rng.standard_normal(8000),
                                        0.3 * rng.standard_normal(16000 * 8)])
                await send_audio(client, pcm16(noise), stop=False)
                error = await client.read_event()
                await client.write_event(Describe().event())
                return error, await client.read_event()

        error, info = asyncio.run(main())
        assert error.data["code"] == "utterance-too-long", error
        assert info.type == "info" and server.turns == []


@pytest.mark.parametrize("server", [{"delay_s": 3.0}], indirect=True)
def test_a_client_gone_mid_utterance_or_mid_answer_leaves_nothing_behind(server):
    audio = _bursts(np.random.default_rng(5), n=1)

    async def main():
        async with server.client() as client:  # half a command, then gone
            await client.write_event(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
            await send_audio(client, pcm16(audio[: len(audio) // 2]), stop=False)
        async with server.client() as client:  # a command being answered, then gone
            await client.write_event(Transcript(text="turn on the radio").event())
            await asyncio.sleep(0.5)
        for _ in range(100):
            if server.call(lambda: len(server.server.connections)) == 0 \
                    and server.runtime.aengine.streaming == 0:
                return True
            await asyncio.sleep(0.05)
        return False

    assert asyncio.run(main()), "a connection or an engine request outlived its client"
    assert server.turns == []


@pytest.mark.parametrize("server", [{"max_connections": 8}], indirect=True)
def test_fifty_idle_connections_do_not_lock_a_satellite_out(server):
    async def main():
        idle = [server.client() for _ in range(50)]
        for client in idle:
            await client.connect()
            await asyncio.sleep(0.002)  # in order: the oldest are closed first
        async with server.client() as client:
            await client.write_event(Describe().event())
            info = await client.read_event()
        # 50 + 1 connections on 8 places: the first 43 were closed, each told why
        closed = [await client.read_event() for client in idle[:43]]
        ends = [await client.read_event() for client in idle[:43]]
        for client in idle:
            await client.disconnect()
        return info, closed, ends

    info, closed, ends = asyncio.run(main())
    assert info.type == "info" and ends == [None] * 43
    assert all(e is not None and e.data["code"] == "server-full" for e in closed), closed[:3]
    stats = server.call(server.server.stats)
    assert stats["closed_for_room"] == 43 and stats["refused"] == 0


@pytest.mark.parametrize("server", [{"idle_timeout_s": 0.5}], indirect=True)
def test_an_idle_connection_is_closed_with_an_error_event(server):
    async def silent():
        async with server.client() as client:
            return await client.read_event(), await client.read_event()

    async def stream_gone_quiet():  # an audio stream left open sends nothing either
        async with server.client() as client:
            await client.write_event(RunPipeline(PipelineStage.ASR, PipelineStage.TTS).event())
            await send_audio(client, pcm16(np.zeros(1600, np.float32)), stop=False)
            return await client.read_event(), await client.read_event()

    async def main():
        return await asyncio.gather(silent(), stream_gone_quiet())

    for error, end in asyncio.run(main()):
        assert error.data["code"] == "idle-timeout" and end is None


@pytest.mark.parametrize("text, address", [
    ("10300", ("127.0.0.1", 10300)), (":10300", ("127.0.0.1", 10300)),
    ("0.0.0.0:10300", ("0.0.0.0", 10300)), ("[::1]:10300", ("::1", 10300)),
    ("jetson.local:10300", ("jetson.local", 10300)),
    ("[::ffff:127.0.0.1]:10300", ("::ffff:127.0.0.1", 10300)), (10300, ("127.0.0.1", 10300)),
])
def test_listen_addresses(text, address):
    assert parse_listen(text) == address


@pytest.mark.parametrize("text, message", [
    ("", "must be HOST:PORT"), ("::1:10300", "an IPv6 address goes in brackets"),
    ("host:99999", "the port must be a number from 0 to 65535"), ("host:", "the port must be"),
    ("bad host:1", "is not an IP address or host name"), ("a:b", "the port must be"),
    ("[::1]", "an IPv6 address goes in brackets"),
])
def test_bad_listen_addresses_are_named(text, message):
    with pytest.raises(ConfigError, match="--wyoming") as err:
        parse_listen(text)
    assert message in str(err.value)


@pytest.mark.parametrize("text", ["::1:10300", "127.0.0.1:65536", "127.0.0.1:", "[::1]",
                                  "[::1]:x"])
def test_listen_addresses_are_refused_for_the_same_reasons_as_the_apis(text):
    """Brackets and ports follow listen_address.py (the API's --listen): the same sentence."""
    assert _refusal(parse_listen, text) == _refusal(listen_address.parse_listen, text)


def _refusal(parse, text: str) -> str:
    """The refusal's sentence without the forms it suggests (each listener names its own)."""
    with pytest.raises(ConfigError) as err:
        parse(text, "X")
    return str(err.value).split(";")[0]


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.9.8.7", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("::ffff:7f00:1", True), ("localhost", True), ("LocalHost", True), ("0.0.0.0", False),
    ("::", False), ("::ffff:10.0.0.1", False), ("192.168.1.20", False), ("jetson.local", False),
])
def test_loopback_is_the_apis_rule_plus_localhost(host, loopback):
    assert is_loopback(host) is loopback


def test_the_voice_config_checks_its_wyoming_keys(tmp_path):
    path = tmp_path / "v.yaml"
    path.write_text("wyoming:\n  listen: ':10300'\n  max_connections: 0\n")
    with pytest.raises(ConfigError, match="wyoming.max_connections"):
        load_voice_config(path)
    path.write_text("wyoming:\n  listne: ':10300'\n")
    with pytest.raises(ConfigError, match="wyoming.listne"):
        load_voice_config(path)
    path.write_text("wyoming:\n  listen: ':10300'\n")
    assert load_voice_config(path).wyoming == WyomingConfig(listen=":10300")


def test_only_a_loopback_address_goes_without_a_warning():
    assert exposure_warning("127.0.0.1", 10300) is None
    assert exposure_warning("::1", 10300) is None
    assert exposure_warning("::ffff:127.0.0.1", 10300) is None  # IPv4-mapped loopback
    for host in ("0.0.0.0", "192.168.1.20", "::", "::ffff:10.0.0.1", "jetson.local"):
        assert "no authentication" in exposure_warning(host, 10300)


def test_the_cli_starts_without_importing_wyoming(tmp_path):
    """`wyoming` is in the voice extra only: building the CLI (every bench module is imported for
    its subcommand) must not need it."""
    import subprocess

    code = ("import sys; from edge_runtime.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'wyoming'))")
    done = subprocess.run(code_argv(code), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
