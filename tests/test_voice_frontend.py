"""edge_runtime/voice/frontend.py: items posted per stream, half-duplex gating, faults."""

from __future__ import annotations

import asyncio

import numpy as np

from edge_runtime.voice.audio_input import InputSpec, Source
from edge_runtime.voice.frontend import Command, Fault, FrontEnd
from edge_runtime.voice.tts import write_wav
from edge_runtime.voice.vad import EnergyVAD, UtteranceCutter, VADConfig


def _front(source, half_duplex):
    async def main():
        queue: asyncio.Queue = asyncio.Queue()
        cutter = UtteranceCutter(VADConfig(backend="energy"), EnergyVAD())
        front = FrontEnd(source, cutter, queue, asyncio.get_running_loop(), realtime=False,
                         half_duplex=half_duplex)
        front.start()
        items = [await queue.get()]
        if half_duplex:  # nothing more arrives until the first command is answered
            await asyncio.sleep(0.3)
            assert queue.empty()
        while items[-1] is not None:
            front.answered()
            items.append(await queue.get())
        front.thread.join(5)
        return items

    return asyncio.run(main())


def test_half_duplex_waits_for_each_answer(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("one\ntwo\nthree\n")
    items = _front(Source(InputSpec("text", path)), half_duplex=True)
    assert [i.text for i in items[:-1]] == ["one", "two", "three"] and items[-1] is None


def test_audio_faults_and_truncation_are_posted(tmp_path):
    rng = np.random.default_rng(0)
    quiet = 1e-4 * rng.standard_normal(8000)
    loud = 0.2 * rng.standard_normal(12000)
    write_wav(tmp_path / "a.wav", np.concatenate([quiet, loud, quiet, quiet, loud]).astype(np.float32))
    (tmp_path / "b.wav").write_bytes(b"junk")
    items = _front(Source(InputSpec("folder", tmp_path)), half_duplex=False)
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["Command", "Fault", "Fault", "NoneType"], kinds
    command, truncated, bad = items[0], items[1], items[2]
    assert isinstance(command, Command) and command.utterance.source.name == "a.wav"
    assert isinstance(truncated, Fault) and "a.wav: input ended mid-utterance" in truncated.problem
    assert not truncated.fatal
    assert isinstance(bad, Fault) and "b.wav: not a readable WAV file" in bad.problem


def test_missing_input_is_fatal_for_its_stream(tmp_path):
    items = _front(Source(InputSpec("wav", tmp_path / "gone.wav")), half_duplex=False)
    assert isinstance(items[0], Fault) and items[0].fatal and "gone.wav: file not found" in items[0].problem
    assert items[1] is None


def _speech(rng, layout):
    """('s' | 'n', seconds) pieces: loud noise for speech, faint noise for silence; 16 kHz."""
    return np.concatenate([(0.2 if kind == "s" else 1e-4) * rng.standard_normal(int(sec * 16000))
                           for kind, sec in layout]).astype(np.float32)


def test_stray_byte_after_a_complete_command_keeps_the_command(tmp_path):
    audio = _speech(np.random.default_rng(1), [("n", 0.5), ("s", 0.8), ("n", 0.25)])
    raw = tmp_path / "cmd.raw"  # ends 250 ms after the speech: only finish() closes it
    raw.write_bytes((audio * 32767).astype("<i2").tobytes() + b"\x01")
    items = _front(Source(InputSpec("pcm", raw)), half_duplex=False)
    assert [type(i).__name__ for i in items] == ["Command", "Fault", "NoneType"]
    assert "cmd.raw: ended inside a sample (1 stray bytes)" in items[1].problem and items[1].fatal


def test_truncated_wav_is_a_fault_and_its_cut_command_is_not_sent(tmp_path):
    rng = np.random.default_rng(2)
    full = _speech(rng, [("n", 0.5), ("s", 0.8), ("n", 1.0), ("s", 0.8), ("n", 0.25), ("n", 2.0)])
    path = tmp_path / "two.wav"
    write_wav(path, full)
    keep = int((0.5 + 0.8 + 1.0 + 0.8 + 0.25) * 16000)  # the second command's pause is cut short
    path.write_bytes(path.read_bytes()[: 44 + 2 * keep])
    items = _front(Source(InputSpec("wav", path)), half_duplex=False)
    assert [type(i).__name__ for i in items] == ["Command", "Fault", "Fault", "NoneType"]
    assert f"two.wav: truncated: header declares {len(full) / 16000:.2f} s, file holds " \
           f"{keep / 16000:.2f} s" in items[1].problem
    assert "two.wav: input ended mid-utterance" in items[2].problem
    assert not items[1].fatal and not items[2].fatal


def test_audio_without_speech_is_reported(tmp_path):
    write_wav(tmp_path / "silence.wav", np.zeros(48000, np.float32))
    write_wav(tmp_path / "blip.wav", _speech(np.random.default_rng(3), [("n", 1), ("s", 0.05),
                                                                        ("n", 1)]))
    for name in ("silence.wav", "blip.wav"):
        items = _front(Source(InputSpec("wav", tmp_path / name)), half_duplex=False)
        assert [type(i).__name__ for i in items] == ["Fault", "NoneType"]
        assert f"{name}: no speech detected in" in items[0].problem and not items[0].fatal


def test_run_on_speech_is_a_fault_and_not_sent(tmp_path):
    write_wav(tmp_path / "runon.wav", _speech(np.random.default_rng(4), [
        ("n", 0.5), ("s", 2.5), ("n", 0.8), ("s", 0.6), ("n", 0.8)]))

    async def main():
        queue: asyncio.Queue = asyncio.Queue()
        cutter = UtteranceCutter(VADConfig(backend="energy", max_utterance_s=1.5), EnergyVAD())
        front = FrontEnd(Source(InputSpec("wav", tmp_path / "runon.wav")), cutter, queue,
                         asyncio.get_running_loop(), realtime=False)
        front.start()
        items = [await queue.get()]
        while items[-1] is not None:
            items.append(await queue.get())
        return items

    items = asyncio.run(main())
    assert [type(i).__name__ for i in items] == ["Fault", "Command", "NoneType"]
    assert "runon.wav: speech from 0.48 s to 3.01 s" in items[0].problem
    assert "without a pause for more than vad.max_utterance_s (1.5 s); not sent" in items[0].problem


def test_arecord_placeholder_size_keeps_the_last_command(tmp_path):
    audio = _speech(np.random.default_rng(5), [("n", 0.5), ("s", 0.8), ("n", 0.25)])
    path = tmp_path / "arecord.wav"  # arecord to stdout leaves data size 0x80000000
    write_wav(path, audio)
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[at : at + 4] = (0x80000000).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    items = _front(Source(InputSpec("wav", path)), half_duplex=False)
    assert [type(i).__name__ for i in items] == ["Command", "NoneType"], items


def test_posting_after_the_loop_closed_stops_the_thread_quietly(tmp_path):
    loop = asyncio.new_event_loop()
    queue: asyncio.Queue = asyncio.Queue()
    front = FrontEnd(Source(InputSpec("text", tmp_path / "t.txt")), None, queue, loop,
                     realtime=False)
    loop.close()  # Ctrl-C: asyncio.run closed its loop while this thread was still reading
    front._post(Command(tmp_path / "t.txt", text="late"))  # no RuntimeError
    assert front.stop_event.is_set()
